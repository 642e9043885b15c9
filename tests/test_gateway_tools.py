"""Native OpenAI tool calls in `tirl serve` and the training gateway (`tirl.apps.server_tools`).

What it proves: a request of [system S, user Q] with tirl's function definitions as `tools` is
token for token the prompt tirl's own hermes_tools rollout builds with system S, and after the
model's call and the tool's answer the next prompt is that rollout's context, with the tiny
chat tokenizer (plain ChatML: tirl writes the tools) and a Qwen2.5-style template (the template
writes them); a completion's `<tool_call>` blocks come back as `tool_calls`; through the gateway
a call written as the template writes it is spliced (the raw completion is the returned text)
and one with other JSON spacing is refused at its position; every bad input is a 400 naming
its field; examples/gateway/tool_agent.py (the `openai` SDK's `tools=`) runs through the
gateway and its session is exactly tirl's rollout. The model is the tiny chat model with its
next token forced by position (`forced`), so what it writes is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import json
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from test_tool_calls import QWEN_STYLE_TEMPLATE, _rollout, qwen_style  # noqa: F401

from tirl.apps.gateway import Gateway, run_agents
from tirl.apps.server_requests import BadRequest, ModelLimits, parse_chat
from tirl.apps.server_tools import ToolCalls, tool_rendering
from tirl.backends.hf import HFEngine
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.protocol import HERMES_TOOLS
from tirl.protocol.segments import SegmentKind
from tirl.rollout.runner import RolloutSettings
from tirl.rollout.sessions import SessionRefused
from tirl.tasks.prompts import PromptRenderer, default_system_prompt
from tirl.tools import function_schemas

EXAMPLE = Path(__file__).parents[1] / "examples" / "gateway" / "tool_agent.py"
SYSTEM = "Solve it. Call python when you need to compute."
QUESTION = "What is 6 * 7?"
CODE = "print(6 * 7)"
ANSWER = "The answer is \\boxed{42}."
TOOLS = function_schemas(HERMES_TOOLS)


def _example():
    spec = importlib.util.spec_from_file_location("tool_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chat_tok():
    texts = [HERMES_TOOLS.render_code(f"print({a} * 7)") + HERMES_TOOLS.render_output(str(a * 7))
             for a in range(40)]  # fmt: skip
    texts += [default_system_prompt(HERMES_TOOLS), SYSTEM, QUESTION, ANSWER] * 5
    return train_tokenizer(texts, vocab_size=400, chat_template=True)


@pytest.fixture(scope="module")
def chat_model(chat_tok):
    spec = TinyModelSpec(hidden_size=32, layers=1, heads=2, max_positions=1024)
    return build_model(chat_tok, spec, seed=0).eval()


def _limits(tok) -> ModelLimits:
    return ModelLimits(frozenset({"tiny"}), len(tok), 4096, 64)


def _ids(tok, messages, **extra) -> list[int]:
    return parse_chat({"messages": messages, "tools": TOOLS, **extra}, _limits(tok), tok).prompts[0]


def _wire(message: dict) -> dict:
    """An assistant message as the server returned it, sent back as a client does."""
    return {k: v for k, v in message.items() if v is not None or k == "content"}


def _tool_turn(call_message: dict, output: str) -> dict:
    return {"role": "tool", "tool_call_id": call_message["tool_calls"][0]["id"], "content": output}


# ---------------------------------------------------------------- the key invariant


@pytest.mark.parametrize("template", ["chatml", "qwen_style"])
def test_the_servers_prompts_are_tirls_own_hermes_rollout(template, chat_tok, qwen_style):  # noqa: F811
    """[system S, user Q] + tirl's functions is the prompt tirl's rollout samples from with
    system S; after the model's call (read back as `tool_calls` and sent back as a client
    does) and the tool's answer, the next prompt is the rollout's context, token for token."""
    tok = chat_tok if template == "chatml" else qwen_style
    assert tool_rendering(tok).mode == ("hermes" if template == "chatml" else "template")
    renderer = PromptRenderer(tok, HERMES_TOOLS, system=SYSTEM, chat=True)
    assert '"name": "python"' in renderer.prompt_text(QUESTION)  # the functions are listed
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    prompt = renderer.prompt_ids(QUESTION)
    assert _ids(tok, messages) == prompt

    # the model writes prose, a call as the template writes it, then its answer
    prose = "I multiply.\n" if template == "qwen_style" else "I multiply. "
    call = prose + HERMES_TOOLS.render_code(CODE)
    settings = RolloutSettings(max_model_tokens=10_000, protocol=renderer.protocol)
    traj, _ = _rollout(tok, prompt, call + ANSWER, settings, renderer.eos_id)
    kinds = [s.kind for s in traj.segments]
    assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.MODEL]
    context = [i for s in traj.segments[:3] for i in s.ids]  # up to the next assistant opening

    separator = tool_rendering(tok).separator
    message = ToolCalls(separator, stop_at_call=True).message(call)
    assert message["content"] == prose.rstrip("\n") if separator else prose
    (called,) = message["tool_calls"]
    assert called["id"].startswith("call_") and called["type"] == "function"
    assert called["function"] == {"name": "python", "arguments": json.dumps({"code": CODE})}
    output = traj.tool_calls[0].output_text
    assert output == "42"
    after = [*messages, _wire(message), _tool_turn(message, output)]
    assert _ids(tok, after) == context


def test_a_malformed_call_block_stays_content_and_calls_need_tools(chat_tok):
    calls = ToolCalls("", stop_at_call=False)
    assert calls.message('<tool_call>\n{"name": "python", "arguments": \n</tool_call>') is None
    assert calls.message("no call at all") is None
    two = HERMES_TOOLS.render_code("1") + " then " + HERMES_TOOLS.render_call("f", {"x": 1})
    message = calls.message(two)
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["python", "f"]
    assert json.loads(message["tool_calls"][1]["function"]["arguments"]) == {"x": 1}
    assert message["tool_calls"][0]["id"] != message["tool_calls"][1]["id"]
    user = [{"role": "user", "content": QUESTION}]
    assert parse_chat({"messages": user}, _limits(chat_tok), chat_tok).tools is None
    none = {"messages": user, "tools": TOOLS, "tool_choice": "none"}
    assert parse_chat(none, _limits(chat_tok), chat_tok).tools is None  # listed, not parsed


# ---------------------------------------------------------------- bad input: one 400 each

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "python", "arguments": '{"code": "1"}'}}  # fmt: skip
BASE = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]


def _assistant(**function) -> dict:
    call = {**CALL, "function": {**CALL["function"], **function}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


BAD = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [TOOLS[0], 5]}, "tools[1]"),
    ({"tools": [TOOLS[0], {"type": "code", "function": {"name": "f"}}]}, "tools[1].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "a b"}}]},
     "tools[1].function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]},
     "tools[0].function.description"),
    ({"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]},
     "tools[0].function.returns"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "python"}}}, "tool_choice"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [*BASE, _assistant(arguments="{not json")]},
     "messages[2].tool_calls[0].function.arguments"),
    ({"messages": [*BASE, _assistant(arguments="[1]")]},
     "messages[2].tool_calls[0].function.arguments"),
    ({"messages": [*BASE, _assistant(arguments=7)]}, "messages[2].tool_calls[0].function.arguments"),
    ({"messages": [*BASE, _assistant(name=5)]}, "messages[2].tool_calls[0].function.name"),
    ({"messages": [*BASE, {"role": "assistant", "content": "x", "tool_calls": {}}]},
     "messages[2].tool_calls"),
    ({"messages": [*BASE, {"role": "assistant", "content": "", "tool_calls": [{**CALL, "x": 1}]}]},
     "messages[2].tool_calls[0].x"),
    ({"messages": [*BASE, {"role": "user", "content": "x", "tool_calls": [CALL]}]},
     "messages[2].tool_calls"),
    ({"messages": [*BASE, {"role": "user", "content": "x", "tool_call_id": "c"}]},
     "messages[2].tool_call_id"),
    ({"messages": [*BASE, {"role": "tool", "content": "x", "tool_call_id": 5}]},
     "messages[2].tool_call_id"),
    ({"messages": [*BASE, {"role": "tool", "content": None}]}, "messages[2].content"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "param"), BAD, ids=[p for _, p in BAD])
def test_each_bad_tool_input_is_a_400_naming_its_field(change, param, chat_tok):
    body = {"messages": BASE, "tools": TOOLS, **change}
    with pytest.raises(BadRequest) as e:
        parse_chat(body, _limits(chat_tok), chat_tok)
    assert e.value.param == param and e.value.status == 400
    assert "\n" not in str(e.value)


def test_a_template_that_can_take_no_tools_is_one_400(chat_tok):
    tok = copy.deepcopy(chat_tok)
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert tool_rendering(tok) is None
    with pytest.raises(BadRequest, match="cannot be rendered") as e:
        parse_chat({"messages": BASE, "tools": TOOLS}, _limits(tok), tok)
    assert e.value.param == "tools" and "\n" not in str(e.value)
    parse_chat({"messages": BASE}, _limits(tok), tok)  # without tools it still serves


# ---------------------------------------------------------------- through the gateway


def forced(model, tok, tape: list[int]):
    """A copy of `model` whose next token after position p is `tape[p + 1]` (then eos):
    a model that writes exactly the conversation `tape`, whatever it is prompted with."""
    model = copy.deepcopy(model)
    eos = tok.eos_token_id

    def hook(module, args, kwargs, output):
        logits = output.logits  # [B, T, V]
        positions = kwargs["position_ids"][:, -logits.shape[1] :]  # [B, T]
        nxt = positions + 1
        ids = [[tape[p] if p < len(tape) else eos for p in row] for row in nxt.tolist()]
        logits.fill_(-1e9)
        for b, row in enumerate(ids):
            for t, i in enumerate(row):
                logits[b, t, i] = 0.0
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    return model


@contextlib.asynccontextmanager
async def serving(model, tok):
    engine = HFEngine(model, tok.eos_token_id, max_batch=4)
    gateway = Gateway(engine, tok, "tiny", temperature=1.0)
    try:
        async with gateway.serving():
            yield gateway
    finally:
        engine.close()


def _tape(tok, system: str, call: str) -> tuple[list[int], PromptRenderer]:
    """tirl's own rollout of a model that writes `call`, gets 42, and answers."""
    renderer = PromptRenderer(tok, HERMES_TOOLS, system=system, chat=True)
    settings = RolloutSettings(max_model_tokens=10_000, protocol=renderer.protocol)
    prompt = renderer.prompt_ids(QUESTION)
    traj, _ = _rollout(tok, prompt, call + ANSWER, settings, renderer.eos_id)
    assert [c.output_text for c in traj.tool_calls] == ["42"]
    return traj.ids, renderer


@pytest.mark.parametrize("spacing", ["template", "compact"])
def test_a_call_written_as_the_template_writes_it_splices_another_is_refused(
    spacing, chat_tok, chat_model
):
    call = HERMES_TOOLS.render_code(CODE)
    if spacing == "compact":  # the same call, JSON without spaces: re-rendered, it differs
        call = call.replace('": ', '":').replace(', "', ',"')
    tape, _ = _tape(chat_tok, SYSTEM, call)
    model = forced(chat_model, chat_tok, tape)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]

    async def main():
        async with serving(model, chat_tok) as gateway:
            session = gateway.open_session()
            url = f"{session.base_url}/chat/completions"
            body = {"messages": messages, "tools": TOOLS, "parallel_tool_calls": False}
            async with aiohttp.ClientSession(trust_env=False) as http:
                async with http.post(url, json=body) as r:
                    first = await r.json()
                choice = first["choices"][0]
                message = choice["message"]
                again = [*messages, _wire(message), _tool_turn(message, "42")]
                async with http.post(url, json={**body, "messages": again}) as r:
                    second = await r.json()
                    assert r.status == 200, second
            calls = list(session.calls)
            try:
                return choice, second, calls, gateway.collect(session.id)
            except SessionRefused as e:
                return choice, second, calls, e

    choice, second, calls, traj = asyncio.run(main())
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"code": "print(6 * 7)"}'
    assert calls[0].returned_text == call  # the raw completion, stopped at its call
    if spacing == "template":
        assert calls[1].spliced and second["choices"][0]["message"]["content"] == ANSWER
        assert second["choices"][0]["finish_reason"] == "stop"
        assert traj.ids == tape  # exactly tirl's own rollout
        kinds = [s.kind for s in traj.segments]
        assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.MODEL]
        assert traj.segments[2].text == HERMES_TOOLS.render_output("42")
    else:
        assert not calls[1].spliced and "leaves the previous call" in calls[1].splice_note
        assert isinstance(traj, SessionRefused) and traj.call == 1
        start = len(calls[0].prompt_ids)
        assert start < traj.position < start + len(calls[0].completion_ids)  # in the call
        assert "does not extend the conversation" in str(traj)


def test_the_tool_agent_example_runs_through_the_gateway_as_tirls_rollout(chat_tok, chat_model):
    """examples/gateway/tool_agent.py, unmodified (the `openai` SDK's tools=): its call ran
    (42 came back), the tool turn is masked, and the session is tirl's own hermes_tools
    rollout with the example's system message, id for id."""
    example = _example()
    assert example.PYTHON == TOOLS[0]  # tirl's python tool, as the docstring says
    tape, renderer = _tape(chat_tok, example.SYSTEM, "Compute. " + HERMES_TOOLS.render_code(CODE))
    assert f"'prompt.system={example.SYSTEM}'" in " ".join(example.__doc__.split())
    model = forced(chat_model, chat_tok, tape)

    async def main():
        async with serving(model, chat_tok) as gateway:
            return await run_agents(
                gateway,
                [sys.executable, str(EXAMPLE)],
                [QUESTION],
                score=lambda traj, task: float("\\boxed{42}" in traj.model_text),
                env={"AGENT_MAX_TOKENS": "96"},
            )

    (traj,) = asyncio.run(main())
    assert traj.finish_reason != "error", traj.meta.get("error")
    assert traj.meta["reward"] == 1.0 and traj.meta["gateway_calls"] == 2
    assert traj.ids == tape
    kinds = [s.kind for s in traj.segments]
    assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.MODEL]
    tool = traj.segments[2]
    assert tool.text == HERMES_TOOLS.render_output("42") and tool.logprobs is None
    start = sum(len(s.ids) for s in traj.segments[:2])
    assert traj.loss_mask[start : start + len(tool.ids)] == [0] * len(tool.ids)  # masked
    assert sum(traj.loss_mask) == len(traj.segments[1].ids) + len(traj.segments[3].ids) > 0
    assert traj.segments[1].text.endswith("</tool_call>") and traj.segments[3].text.startswith(
        "The answer"
    )


def test_a_bad_tools_request_fails_alone_and_smollm2_gets_the_hermes_rendering(
    chat_tok, chat_model, smollm2
):
    """Over HTTP: a bad `tools` is a 400 naming the field while another session's call with
    tools is answered; SmolLM2's plain ChatML template takes tools the hermes_tools way."""
    from transformers import AutoTokenizer

    assert tool_rendering(AutoTokenizer.from_pretrained(smollm2)).mode == "hermes"
    model = forced(chat_model, chat_tok, [])  # writes eos at once
    messages = [{"role": "user", "content": QUESTION}]

    async def main():
        async with serving(model, chat_tok) as gateway:
            bad, good = gateway.open_session(), gateway.open_session()
            async with aiohttp.ClientSession(trust_env=False) as http:

                async def post(session, tools):
                    url = f"{session.base_url}/chat/completions"
                    body = {"messages": messages, "tools": tools, "max_tokens": 4}
                    async with http.post(url, json=body) as r:
                        return r.status, await r.json()

                return await asyncio.gather(
                    post(bad, [TOOLS[0], {"type": "function", "function": {"name": ""}}]),
                    post(good, TOOLS),
                )

    (status, error), (ok, answer) = asyncio.run(main())
    assert status == 400 and error["error"]["param"] == "tools[1].function.name"
    assert ok == 200 and answer["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_call_comes_whole_as_a_tool_calls_delta_and_is_recorded_as_sampled(
    chat_tok, chat_model
):
    """verifiers' own chat programs stream with tools: the openai SDK's stream of a call."""
    call = HERMES_TOOLS.render_code(CODE)
    tape, _ = _tape(chat_tok, SYSTEM, call)
    model = forced(chat_model, chat_tok, tape)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]

    async def main():
        async with serving(model, chat_tok) as gateway:
            session = gateway.open_session()
            # trust_env=False: never through a proxy from the environment; loopback only.
            async with openai.DefaultAsyncHttpxClient(trust_env=False) as http:
                client = openai.AsyncOpenAI(
                    base_url=session.base_url, api_key="unused", http_client=http, max_retries=0
                )
                stream = await client.chat.completions.create(
                    model="tiny", messages=messages, tools=TOOLS, parallel_tool_calls=False,
                    stream=True, stream_options={"include_usage": True},
                )  # fmt: skip
                chunks = [chunk async for chunk in stream]
            return chunks, list(session.calls)

    chunks, calls = asyncio.run(main())
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert all(not d.content for d in deltas)  # the call never leaks out as text
    (last,) = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert last.finish_reason == "tool_calls"
    (streamed,) = last.delta.tool_calls
    assert streamed.index == 0 and streamed.id.startswith("call_") and streamed.type == "function"
    assert streamed.function.name == "python"
    assert streamed.function.arguments == '{"code": "print(6 * 7)"}'
    assert chunks[-1].usage.completion_tokens == len(calls[0].completion_ids)
    assert calls[0].returned_text == call  # recorded as sampled, for the next splice
