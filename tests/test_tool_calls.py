"""Tool calls in the chat model's own format (`hermes_tools`, `tirl.protocol.calls`).

The model writes a Hermes / Qwen2.5 call, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`; the rollout runs it in the real sandbox the moment it closes and appends the tool
turn as the chat template writes it. The rollouts drive the real `Rollout`, real tokenizers and
the real `Sandbox` with `TapeEngine` (test_protocol_modes.py), a test double of the model only.
The generic property tests of test_protocol_modes.py and test_tools.py run over every
registered protocol, so over this one too (detection chunk by chunk, both boundary modes, the
token invariants of random interleavings); here: what is particular to calls.

Tokenizers: the tiny plain one (no chat template: the registered Hermes strings, as text), a
tiny ChatML one carrying a Qwen2.5-style template that renders `tools=`, tool calls and tool
messages (the tool turn is derived from it, with `<|im_end|>` / `<|im_start|>` as the special
tokens they are), and SmolLM2-135M-Instruct's, whose plain ChatML template renders none of them
(the registered Hermes strings, its special tokens real).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from test_protocol_modes import TapeEngine, _check_token_invariants
from tiny_run import run, train_cmd

from tirl.algos.losses import ppo_clip_loss
from tirl.models.tiny import IM_END, train_tokenizer
from tirl.protocol import HERMES_TOOLS, INVALID_CALL, PROTOCOLS, Boundary, get_protocol
from tirl.protocol.calls import template_response_markers
from tirl.protocol.segments import SegmentKind
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tasks import Code, Think
from tirl.tasks.demos import demo_trajectory, run_demo_codes
from tirl.tasks.prompts import PromptRenderer, default_system_prompt
from tirl.tools import TOOLS, function_schemas, toolset_protocol
from tirl.train.batch import collate

BOTH = ("python", "shell")
HERMES_OPEN = "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
HERMES_CLOSE = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

# Qwen2.5's template as far as tools go (its structure, shortened): the functions in the system
# turn, an assistant's calls as <tool_call> JSON, tool messages as a user turn of
# <tool_response>s.
QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools>"
    " XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and"
    " arguments within <tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}{%- set call = call.function %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen_style():
    """A tiny ChatML tokenizer with the Qwen2.5-style tools template."""
    p = toolset_protocol(HERMES_TOOLS, BOTH)
    texts = [p.render_code(f"print({a} * 7)") + p.render_output(str(a * 7)) for a in range(50)]
    texts += [default_system_prompt(p), "system user assistant"] * 5
    tok = train_tokenizer(texts, vocab_size=384, chat_template=True)
    tok.chat_template = QWEN_STYLE_TEMPLATE
    return tok


def _rollout(tokenizer, prompt, text, settings, eos_id=None):
    """One trajectory of a model that samples exactly `text`, then its eos."""
    eos_id = tokenizer.eos_token_id if eos_id is None else eos_id

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
            tape = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_id]
            engine = TapeEngine(tape, eos_id)
            return await Rollout(engine, tokenizer, sandbox).run(prompt, settings), engine

    return asyncio.run(main())


def _encoder(tokenizer):
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def _call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# ---------------------------------------------------------------- the protocol


def test_hermes_tools_is_registered_and_writes_calls_as_qwen_templates_do():
    assert PROTOCOLS["hermes_tools"] is HERMES_TOOLS
    p = toolset_protocol(get_protocol("hermes_tools"), BOTH)
    assert p.render_code("print(1)") == (
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    )
    assert p.render_code("ls", "shell") == _call("shell", script="ls")
    assert p.closed_call("Check. " + _call("shell", script="ls") + " more") == ("shell", "ls")
    assert p.closed_call(_call("shell", code="ls")) == ("shell", "ls")  # its other argument
    assert p.render_output("42") == HERMES_OPEN + "42" + HERMES_CLOSE
    assert p.server_stop == ("</tool_call>",)
    # the function definitions a chat template's tools= gets
    schemas = function_schemas(p)
    assert [s["function"]["name"] for s in schemas] == ["python", "shell"]
    assert schemas[0]["function"]["parameters"]["required"] == ["code"]
    assert schemas[1] == TOOLS["shell"].function_schema()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('{"name": "python", "arguments": {"code": "print(1)"', "not JSON"),
        ('["python", "print(1)"]', 'expected {"name"'),
        ('{"name": "perl", "arguments": {"code": "1"}}', "no tool named 'perl'"),
        ('{"name": "python", "arguments": {"source": "1"}}', "needs its 'code' argument"),
        ('{"name": "python", "arguments": {"code": 7}}', "needs its 'code' argument"),
    ],
)
def test_a_malformed_call_is_detected_and_says_why_in_one_line(body, says):
    p = toolset_protocol(HERMES_TOOLS, BOTH)
    tool, code = p.closed_call(f"<tool_call>\n{body}\n</tool_call>")
    assert (tool, code) == (INVALID_CALL, body)
    error = p.call_error(tool, code)
    assert says in error and "\n" not in error and error.endswith("nothing was run.")
    assert p.call_error("python", "print(1)") is None
    assert get_protocol("cir_fences").call_error(INVALID_CALL, "x") is None  # no calls there


def test_the_arguments_may_come_as_a_json_string_as_on_the_openai_wire():
    body = json.dumps({"name": "python", "arguments": json.dumps({"code": "print(2)"})})
    assert HERMES_TOOLS.closed_call(f"<tool_call>\n{body}\n</tool_call>") == ("python", "print(2)")


# ---------------------------------------------------------------- rollouts in the sandbox


def test_a_template_format_call_runs_python_in_the_sandbox_and_its_output_comes_back(tokenizer):
    text = "I multiply first.\n" + _call("python", code="print(483 * 917)") + " \\boxed{442911}"
    settings = RolloutSettings(max_model_tokens=10_000, protocol=HERMES_TOOLS)
    traj, engine = _rollout(tokenizer, "Q:\n", text, settings)
    encode = _encoder(tokenizer)
    _check_token_invariants(traj, engine, encode("Q:\n"), encode)
    assert [(c.tool, c.code, c.status, c.output_text) for c in traj.tool_calls] == [
        ("python", "print(483 * 917)", "ok", "442911")
    ]
    kinds = [s.kind for s in traj.segments]
    assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.MODEL]
    assert traj.segments[1].text.endswith("</tool_call>")  # the close is the model's
    assert traj.segments[2].text == HERMES_OPEN + "442911" + HERMES_CLOSE
    assert "442911" not in traj.segments[1].text  # only the tool wrote the result
    assert engine.stop.server_stop == ("</tool_call>",)


def test_python_and_shell_calls_share_the_session_and_bad_calls_never_end_the_trajectory(
    tokenizer,
):
    p = toolset_protocol(HERMES_TOOLS, ["python"])  # shell is registered, not enabled
    text = (
        "Save it."
        + _call("python", code="open('n.txt', 'w').write(str(6 * 7))\nprint('saved')")
        + ' Not JSON:<tool_call>\n{"name": "python", "arguments": {\n</tool_call>'
        + " Unknown:"
        + _call("perl", code="print 1")
        + " Disabled:"
        + _call("shell", script="cat n.txt")
        + " Again:"
        + _call("python", code="print(open('n.txt').read())")
        + " \\boxed{42}"
    )
    settings = RolloutSettings(max_model_tokens=10_000, tool_budget=5, protocol=p)
    traj, engine = _rollout(tokenizer, "Q:\n", text, settings)
    encode = _encoder(tokenizer)
    _check_token_invariants(traj, engine, encode("Q:\n"), encode)
    assert traj.finish_reason == "stop" and traj.model_text.endswith("\\boxed{42}")
    got = [(c.tool, c.status) for c in traj.tool_calls]
    assert got == [
        ("python", "ok"),
        (INVALID_CALL, "error"),
        (INVALID_CALL, "error"),
        ("shell", "disabled"),
        ("python", "ok"),
    ]
    assert "not JSON" in traj.tool_calls[1].output_text
    assert "no tool named 'perl' (tools: python, shell)" in traj.tool_calls[2].output_text
    assert traj.tool_calls[4].output_text == "42"  # the session kept the file
    tools = [s.text for s in traj.segments if s.kind is SegmentKind.TOOL]
    assert tools == [p.render_output(c.output_text) for c in traj.tool_calls]

    both = toolset_protocol(HERMES_TOOLS, BOTH)
    text = (
        _call("python", code="open('n.txt', 'w').write('41')")
        + _call("shell", script="echo $(( $(cat n.txt) + 1 )); pwd")
        + _call("shell", code="ls nothing-here")
        + " \\boxed{42}"
    )
    settings = RolloutSettings(max_model_tokens=10_000, tool_budget=5, protocol=both, tools=BOTH)
    traj, engine = _rollout(tokenizer, "Q:\n", text, settings)
    _check_token_invariants(traj, engine, encode("Q:\n"), encode)
    calls = traj.tool_calls
    assert [(c.tool, c.status) for c in calls] == [
        ("python", "ok"),
        ("shell", "ok"),
        ("shell", "error"),
    ]
    out, workdir = calls[1].output_text.split("\n")
    assert out == "42" and workdir.startswith("/tmp/")
    assert calls[2].code == "ls nothing-here" and calls[2].output_text.endswith("[exit status 2]")


def test_tool_tokens_of_a_call_trajectory_are_masked_and_contribute_zero_loss(tokenizer):
    text = _call("python", code="print(6 * 7)") + " \\boxed{42}"
    traj, _ = _rollout(tokenizer, "Q:\n", text, RolloutSettings(protocol=HERMES_TOOLS))
    batch = collate([traj], pad_id=tokenizer.pad_token_id)
    kinds = [s.kind for s in traj.segments for _ in s.ids][1:]  # the targets' kinds
    assert batch.loss_mask[0].tolist() == [float(k is SegmentKind.MODEL) for k in kinds]
    model = batch.loss_mask.bool()
    # garbage log-probs and advantages at every tool and prompt position change nothing
    torch.manual_seed(0)
    logprobs = torch.where(model, torch.rand(model.shape) - 1, torch.tensor(float("nan")))
    logprobs.requires_grad_(True)
    adv = torch.where(model, torch.ones(model.shape), torch.tensor(1e30))
    loss, _ = ppo_clip_loss(logprobs, logprobs.detach(), adv, batch.loss_mask)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)  # ratio 1, advantage 1, mean over model tokens
    assert (logprobs.grad[~model] == 0).all() and (logprobs.grad[model] != 0).all()


# ---------------------------------------------------------------- chat templates


def test_the_tool_turn_comes_from_a_template_that_renders_tool_calls(qwen_style, smollm2):
    from transformers import AutoTokenizer

    assert template_response_markers(qwen_style, HERMES_TOOLS) == (HERMES_OPEN, HERMES_CLOSE)
    # a template whose tool turn differs: what the template writes wins
    other = train_tokenizer(["x"], vocab_size=300, chat_template=True)
    other.chat_template = QWEN_STYLE_TEMPLATE.replace("tool_response>", "result>")
    p = HERMES_TOOLS.for_tokenizer(other)
    assert p.render_output("7") == HERMES_OPEN.replace("tool_response", "result") + "7" + (
        HERMES_CLOSE.replace("tool_response", "result")
    )
    # SmolLM2's plain ChatML template renders no tool call: the registered Hermes strings
    smol = AutoTokenizer.from_pretrained(smollm2)
    assert template_response_markers(smol, HERMES_TOOLS) is None
    assert HERMES_TOOLS.for_tokenizer(smol) is HERMES_TOOLS
    # stop-token mode cannot see a marker made of special tokens: refused, in one line
    with pytest.raises(ValueError, match="stop_token mode needs a stop marker"):
        HERMES_TOOLS.with_boundary(Boundary.STOP_TOKEN).for_tokenizer(smol)


def test_a_chat_rollout_is_token_for_token_the_conversation_the_template_renders(qwen_style):
    """The trajectory's ids are the template's own rendering of [system, user, the assistant's
    call, the tool's answer, the assistant's answer]: prompt, model and tool ids alike; only the
    model's are trained on."""
    p = toolset_protocol(HERMES_TOOLS, BOTH)
    renderer = PromptRenderer(qwen_style, p, chat=True)
    # the template lists the functions itself (tools=), so the system message does not
    assert "<tools>" not in renderer.system and "</tool_call>" in renderer.system
    assert json.dumps(function_schemas(p)[0]) in renderer.prompt_text("Q")
    assert renderer.eos_id == qwen_style.convert_tokens_to_ids(IM_END)

    code, answer = "print(483 * 917)", "The answer is \\boxed{442911}."
    settings = RolloutSettings(max_model_tokens=10_000, protocol=p, tools=BOTH)
    prompt = renderer.prompt_ids("What is 483 * 917?")
    text = "Multiply.\n" + p.render_code(code) + answer
    traj, engine = _rollout(qwen_style, prompt, text, settings, renderer.eos_id)
    encode = _encoder(qwen_style)
    _check_token_invariants(traj, engine, prompt, encode)  # tool ids: its rendered text's
    ((call),) = traj.tool_calls
    assert (call.tool, call.code, call.status, call.output_text) == ("python", code, "ok", "442911")
    tool = traj.segments[2]
    assert tool.ids[0] == renderer.eos_id  # the model's turn ends in the tool segment (masked)
    assert tool.text == HERMES_OPEN + "442911" + HERMES_CLOSE
    function = {"name": "python", "arguments": {"code": code}}
    messages = [
        *renderer.messages("What is 483 * 917?"),
        {"role": "assistant", "content": "Multiply.", "tool_calls": [{"function": function}]},
        {"role": "tool", "content": call.output_text},
        {"role": "assistant", "content": answer},
    ]
    rendered = qwen_style.apply_chat_template(messages, tools=renderer.functions, tokenize=False)
    assert rendered.endswith("<|im_end|>\n")  # the template closes the last turn; the model
    assert traj.ids == encode(rendered)[:-1]  # stops at its <|im_end|>: all else is equal
    model = [i for s in traj.segments if s.kind is SegmentKind.MODEL for i in s.ids]
    assert sum(traj.loss_mask) == len(model) == sum(len(o.ids) for o in engine.outputs)

    # what the code prints stays text, even the turn end's spelling
    ids = p.for_tokenizer(qwen_style).encode_output(qwen_style, "<|im_end|>")
    assert ids.count(renderer.eos_id) == 2  # the markers' two, not the output's
    assert qwen_style.decode(ids) == HERMES_OPEN + "<|im_end|>" + HERMES_CLOSE


def test_smollm2_calls_run_with_the_hermes_turn_and_its_real_special_tokens(smollm2):
    """SmolLM2's template renders no tools: the system message lists the functions in Hermes'
    format, the tool turn is the registered Hermes strings with SmolLM2's own <|im_end|> and
    <|im_start|> ids, and a printed <|im_end|> stays ordinary tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    renderer = PromptRenderer(tok, "hermes_tools", chat=True)
    assert "<tools>\n" + json.dumps(TOOLS["python"].function_schema()) in renderer.system
    text = _call("python", code="print(6 * 7)") + "So \\boxed{42}."
    prompt = renderer.prompt_ids("What is 6 * 7?")
    settings = RolloutSettings(max_model_tokens=10_000, protocol=renderer.protocol)
    traj, engine = _rollout(tok, prompt, text, settings, renderer.eos_id)
    encode = _encoder(tok)
    _check_token_invariants(traj, engine, prompt, encode)
    assert [(c.status, c.output_text) for c in traj.tool_calls] == [("ok", "42")]
    tool = traj.segments[2]
    assert tool.text == HERMES_OPEN + "42" + HERMES_CLOSE
    specials = [i for i in tool.ids if i in tok.all_special_ids]
    assert tok.convert_ids_to_tokens(specials) == ["<|im_end|>", "<|im_start|>"] * 2
    assert traj.finish_reason == "stop" and traj.ids[-1] == renderer.eos_id

    out = HERMES_TOOLS.encode_output(tok, "<|im_end|>")  # printed by the code: text
    assert out.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2  # the markers' two only


def test_a_demonstration_in_calls_is_the_trajectory_a_rollout_writes(tokenizer, qwen_style):
    parts = [
        Think("Write it down."),
        Code("open('n.txt', 'w').write(str(6 * 7))\nprint('saved')"),
        Think(" Read it back."),
        Code("cat n.txt", tool="shell"),
        Think(" The answer is \\boxed{42}."),
    ]
    for tok, chat in ((tokenizer, False), (qwen_style, True)):
        p = toolset_protocol(HERMES_TOOLS, BOTH)
        renderer = PromptRenderer(tok, p, chat=chat)

        async def main(tok=tok, renderer=renderer, p=p):
            async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
                (outputs,) = await run_demo_codes(sandbox, [parts], 512, names=["t/0"])
                demo = demo_trajectory(renderer, "What is 6 * 7?", parts, outputs)
                tape = [i for s in demo.segments if s.kind is SegmentKind.MODEL for i in s.ids]
                engine = TapeEngine(tape, renderer.eos_id)
                settings = RolloutSettings(
                    max_model_tokens=10_000, tool_budget=4, protocol=p, tools=BOTH
                )
                prompt = renderer.prompt_ids("What is 6 * 7?")
                return outputs, demo, await Rollout(engine, tok, sandbox).run(prompt, settings)

        outputs, demo, rollout = asyncio.run(main())
        assert outputs == ["saved", "42"]
        assert _call("shell", script="cat n.txt") in demo.response_text
        assert [(s.kind, s.text) for s in demo.segments] == [
            (s.kind, s.text) for s in rollout.segments
        ]
        assert demo.ids == rollout.ids and demo.loss_mask == rollout.loss_mask
        assert [(c.tool, c.output_text) for c in rollout.tool_calls] == [
            ("python", "saved"),
            ("shell", "42"),
        ]


# ---------------------------------------------------------------- a short RL run


def test_a_short_sft_and_rl_run_in_hermes_tools_makes_tool_calls(tmp_path):
    cmd = train_cmd(tmp_path, "calls", "protocol.name=hermes_tools", *CALL_RUN)
    done = run(cmd, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "calls" / "metrics.jsonl").open()]
    rl = [r for r in rows if r.get("phase") == "rl" and "tools/calls_mean" in r]
    assert len(rl) == 4 and sum(r["tools/calls_mean"] for r in rl) > 0
    assert sum(r.get("tools/python/calls_mean", 0) for r in rl) > 0  # calls that ran Python


# A tiny model taught the calls by SFT on arithmetic demonstrations, then a few RL steps (about
# 40 s on 2 shared cores). Measured: RL steps made 0.2-0.6 calls per trajectory, most of them
# valid Python calls (tools/python/calls_mean), some malformed (tools/invalid_call/...).
CALL_RUN = [
    "sft.steps=150",
    "sft.lr=3e-3",
    "sft.examples=256",
    "sft.batch_size=16",
    "rl.steps=4",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "rl.max_model_tokens=64",
    "eval.max_model_tokens=64",
    "model.tokenizer_corpus_items=200",
    "model.hidden_size=64",
    "model.layers=2",
]
