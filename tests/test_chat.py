"""Chat prompts and demonstrations as tokens: a real chat tokenizer (Qwen2.5's format, trained
here), a real tiny model, the real sandbox, the HF engine and the rollout runner.

What must hold: a chat prompt is exactly the template's ids; the interpreter's tokens sit inside
the assistant turn with loss mask 0, in a demonstration and in a rollout alike; a `\\boxed{}`
outside the model's own text never scores; a printed `<|im_end|>` stays text; and plain
demonstrations keep the quickstart's ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
import torch
import torch.nn.functional as F

from tirl.backends.hf import HFEngine
from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import IM_END, IM_START, TinyModelSpec, build_model, train_tokenizer
from tirl.protocol import get_protocol
from tirl.protocol.segments import SegmentKind, Trajectory
from tirl.protocol.tokens import encode_literal
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.synth.arithmetic import demonstration_texts
from tirl.tasks import Code, Think, make_source
from tirl.tasks.demos import demo_trajectory, run_demo_codes
from tirl.tasks.prompts import PromptRenderer, default_system_prompt

PROTOCOLS = ("cir_fences", "agentmath_tags")


@pytest.fixture(scope="module")
def task():
    return make_source({"source": "arithmetic"}).item("test", 0)


@pytest.fixture(scope="module")
def chat_tokenizer():
    texts = []
    for item in ArithmeticEnv().items("train", 200, start=10**6):
        texts.append("".join(t for _, t in demonstration_texts(item, item.answer)))
    for name in PROTOCOLS:
        texts += [default_system_prompt(get_protocol(name))] * 5
    texts += ['print(chr(92) + "boxed{1} <|im_" + "end|>")\ndone', "system user assistant"] * 20
    return train_tokenizer(texts, vocab_size=384, chat_template=True)


def box_printing_code(answer: str) -> str:
    """Code whose output holds the gold answer boxed and the end-of-turn token's spelling, while
    its own text (which is model text) holds neither: the backslash is chr(92), and the token's
    spelling is built from two halves."""
    return f'print(chr(92) + "boxed{{{answer}}} <|im_" + "end|>")'


def in_turn_checks(traj: Trajectory, renderer: PromptRenderer) -> None:
    """Interpreter tokens come after the prompt's `<|im_start|>assistant\\n`, have mask 0, and
    the only end-of-turn id after the prompt is the trajectory's last id."""
    tok = renderer.tokenizer
    opener = tok(f"{IM_START}assistant\n", add_special_tokens=False)["input_ids"]
    prompt_len = traj.prompt_len
    assert traj.ids[prompt_len - len(opener) : prompt_len] == opener
    im_end = tok.convert_tokens_to_ids(IM_END)
    assert renderer.eos_id == im_end
    after_prompt = traj.ids[prompt_len:]
    assert after_prompt.count(im_end) == 1 and after_prompt[-1] == im_end
    pos = 0
    tool_positions = []
    for seg in traj.segments:
        if seg.kind is SegmentKind.TOOL:
            tool_positions += range(pos, pos + len(seg.ids))
            assert im_end not in seg.ids and "<|im_end|>" in seg.text
        pos += len(seg.ids)
    assert tool_positions and min(tool_positions) >= prompt_len
    assert max(tool_positions) < len(traj.ids) - 1  # before the turn's end
    assert {traj.loss_mask[p] for p in tool_positions} == {0}
    assert traj.loss_mask[-1] == 1  # the model learns to end its turn


# ---------------------------------------------------------------------------- prompts


@pytest.mark.parametrize("name", PROTOCOLS)
def test_chat_prompt_ids_are_the_templates_own(chat_tokenizer, name):
    renderer = PromptRenderer(chat_tokenizer, name)  # chat=None: the template is used
    assert renderer.chat and renderer.system == default_system_prompt(renderer.protocol)
    messages = [
        {"role": "system", "content": renderer.system},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    expected = chat_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    expected = expected["input_ids"] if isinstance(expected, Mapping) else expected
    assert renderer.prompt_ids("What is 6 * 7?") == list(expected)
    text = renderer.prompt_text("What is 6 * 7?")
    assert text.startswith(f"{IM_START}system\n") and text.endswith(f"{IM_START}assistant\n")
    assert renderer.eos_id == chat_tokenizer.convert_tokens_to_ids(IM_END)
    marker = {"cir_fences": "```output", "agentmath_tags": "<interpreter>"}[name]
    assert marker in renderer.system and "\\boxed{}" in renderer.system


def test_stop_token_prompts_say_to_write_the_marker_and_plain_prompts_are_unchanged(
    chat_tokenizer, tokenizer
):
    stop = PromptRenderer(chat_tokenizer, get_protocol("cir_fences", "stop_token"))
    assert "write ```output right after it" in stop.system
    assert "right after" not in PromptRenderer(chat_tokenizer, "cir_fences").system
    plain = PromptRenderer(tokenizer, "cir_fences")  # no template: plain
    assert not plain.chat and plain.eos_id == tokenizer.eos_token_id
    text = "Problem: What is 6 * 7?\nSolution:\n"
    assert plain.prompt_text("What is 6 * 7?") == text
    assert (
        plain.prompt_ids("What is 6 * 7?") == tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    forced = PromptRenderer(chat_tokenizer, "cir_fences", chat=False)
    assert forced.prompt_text("q") == "Problem: q\nSolution:\n"
    none = PromptRenderer(chat_tokenizer, "cir_fences", system="")
    assert none.prompt_text("q") == f"{IM_START}user\nq{IM_END}\n{IM_START}assistant\n"
    with pytest.raises(ValueError, match="need a chat template"):
        PromptRenderer(tokenizer, "cir_fences", chat=True)


# ---------------------------------------------------------------------------- demos


def test_plain_demonstrations_keep_the_quickstarts_ids(tokenizer, task):
    """Today's quickstart tokens, from the literal texts: each segment tokenized on its own,
    eos at the end; in stop-token mode the model's segment also writes the stop marker."""
    q, a, expr = task.problem, task.answer, task.meta["expression"]
    source = make_source({"source": "arithmetic"})

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = ids(f"Problem: {q}\nSolution:\n")
    answer = ids(f"The answer is \\boxed{{{a}}}.") + [tokenizer.eos_token_id]
    expected = {
        "exact_match": prompt
        + ids(f"```python\nprint({expr})\n```")
        + ids(f"\n```output\n{a}\n```\n")
        + answer,
        "stop_token": prompt
        + ids(f"```python\nprint({expr})\n```\n```output")
        + ids(f"\n{a}\n```\n")
        + answer,
    }
    for boundary, want in expected.items():
        renderer = PromptRenderer(tokenizer, get_protocol("cir_fences", boundary))
        parts = source.demonstration(task, use_tools=True)
        traj = demo_trajectory(renderer, q, parts, [a], {})
        assert traj.ids == want, boundary
        assert [s.kind for s in traj.segments] == [
            SegmentKind.PROMPT,
            SegmentKind.MODEL,
            SegmentKind.TOOL,
            SegmentKind.MODEL,
        ]
    text_only = demo_trajectory(
        PromptRenderer(tokenizer, "cir_fences"), q, source.demonstration(task, False), [], {}
    )
    assert text_only.ids == prompt + ids(f"My estimate is \\boxed{{{a}}}.") + [
        tokenizer.eos_token_id
    ]


def test_printed_end_of_turn_stays_ordinary_tokens(chat_tokenizer):
    im_end = chat_tokenizer.convert_tokens_to_ids(IM_END)
    text = "\n```output\nbefore <|im_end|> after <|endoftext|>\n```\n"
    # an ordinary call would end the turn inside the interpreter's output...
    assert im_end in chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = encode_literal(chat_tokenizer, text)  # ...this one never does
    assert not set(ids) & set(chat_tokenizer.all_special_ids)
    assert chat_tokenizer.decode(ids) == text
    renderer = PromptRenderer(chat_tokenizer, "cir_fences")
    demo = demo_trajectory(renderer, "q", [Code("print(1)"), Think("done")], ["<|im_end|>"], {})
    (tool,) = [s for s in demo.segments if s.kind is SegmentKind.TOOL]
    assert im_end not in tool.ids and chat_tokenizer.decode(tool.ids) == tool.text


@pytest.mark.parametrize("name", PROTOCOLS)
def test_chat_demonstration_keeps_the_interpreter_inside_the_assistant_turn(
    chat_tokenizer, task, name
):
    system = f"The gold answer is \\boxed{{{task.answer}}}."  # a box the model did not write
    renderer = PromptRenderer(chat_tokenizer, name, system=system)
    parts = [Think("Let me compute.\n"), Code(box_printing_code(task.answer)), Think("done")]
    shown = f"\\boxed{{{task.answer}}} <|im_end|>"
    traj = demo_trajectory(renderer, task.problem, parts, [shown], {"id": task.id})
    assert traj.segments[0].ids == renderer.prompt_ids(task.problem)
    assert [s.kind for s in traj.segments][1:] == [
        SegmentKind.MODEL,
        SegmentKind.TOOL,
        SegmentKind.MODEL,
    ]
    in_turn_checks(traj, renderer)
    assert traj.tool_calls[0].output_text == shown and traj.meta == {"id": task.id}
    # the boxes are in the prompt and the tool output, not in the model's text: no score
    assert system in traj.segments[0].text
    assert not task.score(traj.model_text).correct
    assert task.score(traj.model_text + f" \\boxed{{{task.answer}}}").correct


def test_a_demonstration_ending_with_code_ends_with_a_model_eos(chat_tokenizer):
    renderer = PromptRenderer(chat_tokenizer, "cir_fences")
    traj = demo_trajectory(renderer, "q", [Code("print(1)", "1")], None, {})
    assert traj.segments[-1].kind is SegmentKind.MODEL
    assert traj.segments[-1].ids == [renderer.eos_id] and traj.loss_mask[-1] == 1
    with pytest.raises(ValueError, match="no output"):
        demo_trajectory(renderer, "q", [Code("print(1)")], None, {})


# ---------------------------------------------------------------------------- rollouts


def memorize(model, traj: Trajectory, steps: int) -> None:
    """Train `model` on one trajectory's model tokens until greedy decoding repeats them (one
    thread: on a loaded machine this tiny model trains several times faster so)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _memorize(model, traj, steps)
    finally:
        torch.set_num_threads(threads)


def _memorize(model, traj: Trajectory, steps: int) -> None:
    ids = torch.tensor([traj.ids])
    targets = ids[:, 1:]
    mask = torch.tensor([traj.loss_mask[1:]], dtype=torch.bool)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        logits = model(ids).logits[:, :-1]
        if (logits.argmax(-1) == targets)[mask].all():  # greedy repeats every model token
            break
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        loss = per_token[mask].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def test_chat_rollout_matches_its_demonstration_and_never_scores_the_interpreter(
    chat_tokenizer, task
):
    system = f"Gold: \\boxed{{{task.answer}}}"
    renderer = PromptRenderer(chat_tokenizer, "cir_fences", system=system)
    parts = [Code(box_printing_code(task.answer)), Think("done")]
    spec = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256)
    model = build_model(chat_tokenizer, spec, seed=0)
    settings = RolloutSettings(max_model_tokens=80, temperature=0.0, protocol=renderer.protocol)

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
            (outputs,) = await run_demo_codes(sandbox, [parts], 512, names=[task.id])
            demo = demo_trajectory(renderer, task.problem, parts, outputs, {})
            memorize(model, demo, steps=300)
            engine = HFEngine(model, renderer.eos_id, seed=0)
            rollout = Rollout(engine, chat_tokenizer, sandbox)
            prompt = renderer.prompt_ids(task.problem)
            by_ids, by_text = await rollout.run_many(
                [prompt, renderer.prompt_text(task.problem)], settings
            )
            engine.close()
            return outputs, demo, by_ids, by_text

    outputs, demo, traj, by_text = asyncio.run(main())
    assert outputs == [f"\\boxed{{{task.answer}}} <|im_end|>"]  # the real sandbox printed it
    assert traj.finish_reason == "stop" and traj.tool_calls[0].status == "ok"
    assert traj.segments[0].ids == renderer.prompt_ids(task.problem)
    in_turn_checks(traj, renderer)
    # token-in, token-out: the rollout's ids are the demonstration's, segment by segment
    assert [(s.kind, s.ids) for s in traj.segments] == [(s.kind, s.ids) for s in demo.segments]
    assert traj.loss_mask == demo.loss_mask
    assert by_text.ids == traj.ids  # a text prompt that tokenizes to the same ids: same run
    assert not task.score(traj.model_text).correct  # boxes in system and tool output only
    assert "\\boxed" in traj.segments[0].text and "\\boxed" not in traj.model_text


def test_a_failing_demonstration_code_names_its_task():
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
            ok = await run_demo_codes(
                sandbox, [[Code("x = 6"), Code("print(x * 7)")], [Code("y", "kept")]], 512
            )
            with pytest.raises(RuntimeError, match="demonstration code for task t/1 failed"):
                await run_demo_codes(
                    sandbox, [[Code("print(1)")], [Code("1/0")]], 512, names=["t/0", "t/1"]
                )
            return ok

    # one session per demonstration (x carries over); a recorded output is not run again
    assert asyncio.run(main()) == [["", "42"], ["kept"]]
