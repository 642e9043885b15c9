"""The training gateway (`tirl.apps.gateway`) with a real tiny chat model and an unmodified agent
program (tests/data/gateway_agent.py: the `openai` SDK, a multi-turn loop, Python run by the
agent itself) as a subprocess against 127.0.0.1.

What it proves: the assembled trajectory is exactly the recorded ids (each call's prompt is
the history so far, the model's own ids reused, token in), with model tokens masked 1 and
carrying the sampler's log-probs and everything the agent added masked 0 without log-probs;
one dropped separator token, in the recorded ids or through a template that renders a past
turn without its newline, refuses the session naming the call and the token position; the
reward endpoint; bad requests (an unknown session, bad JSON, a bad reward, n > 1) get one
4xx each and never disturb another session; `run_agents` returns one rewarded trajectory per
run; overlapping calls refuse a session and a streamed call is recorded. Not covered: training
on them (`tirl train` wiring; examples/gateway/train_digits.py trains through the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from tiny_run import RL_STEPS, offline_env, train_cmd

from tirl.apps.gateway import Gateway, agent_env, run_agents
from tirl.backends.hf import HFEngine
from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import IM_END, TinyModelSpec, build_model, train_tokenizer
from tirl.protocol.segments import SegmentKind
from tirl.rollout.sessions import (
    RecordedCall,
    SessionRefused,
    assemble_trajectory,
    splice_prompt,
)
from tirl.synth.arithmetic import demonstration_texts

AGENT = Path(__file__).parent / "data" / "gateway_agent.py"

# A template that renders a past assistant turn without the newline after its role, while
# the generation prompt has it: call 2's prompt drops one separator of call 1's.
NO_NEWLINE_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer():
    texts = []
    for item in ArithmeticEnv().items("train", 200, start=10**6):
        texts.append("".join(t for _, t in demonstration_texts(item, item.answer)))
    texts += ["system user assistant Solve the task. Write Python in ```python blocks"] * 20
    return train_tokenizer(texts, vocab_size=384, chat_template=True)


@pytest.fixture(scope="module")
def chat_model(chat_tokenizer):
    spec = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=512)
    return build_model(chat_tokenizer, spec, seed=0).eval()


@contextlib.asynccontextmanager
async def serving(model, tokenizer, **kwargs):
    engine = HFEngine(model, tokenizer.eos_token_id, max_batch=8)
    gateway = Gateway(engine, tokenizer, "tiny", **kwargs)
    try:
        async with gateway.serving():
            yield gateway
    finally:
        engine.close()


async def run_agent(session, extra_env: dict | None = None) -> str:
    env = agent_env(session, "What is 6 * 7?")
    env.update({"AGENT_EXPECT": "", **(extra_env or {})})  # it posts a reward (0: no answer)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(AGENT),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out.decode()


@pytest.fixture(scope="module")
def agent_session(chat_model, chat_tokenizer):
    """One run of the unmodified agent: its recorded calls and the session as a trajectory."""

    async def main():
        async with serving(chat_model, chat_tokenizer) as gateway:
            session = gateway.open_session(meta={"who": "test"})
            await run_agent(session, {"AGENT_TURNS": "3", "AGENT_MAX_TOKENS": "12"})
            calls = list(session.calls)
            return calls, gateway.collect(session.id)

    return asyncio.run(main())


def test_the_agents_trajectory_is_exactly_the_recorded_ids(agent_session, chat_tokenizer):
    calls, traj = agent_session
    assert len(calls) == 3
    last = calls[-1]
    assert traj.ids == last.prompt_ids + last.completion_ids
    history: list[int] = []
    for k, call in enumerate(calls):
        assert call.prompt_ids[: len(history)] == history  # each prompt extends the history
        assert call.spliced == (k > 0)  # and reused the sampled ids (token in)
        assert call.splice_note is None
        history = call.prompt_ids + call.completion_ids
    kinds = [s.kind for s in traj.segments]
    M, T = SegmentKind.MODEL, SegmentKind.TOOL
    assert kinds == [SegmentKind.PROMPT, M, T, M, T, M]
    models = [s for s in traj.segments if s.kind is M]
    assert [s.ids for s in models] == [c.completion_ids for c in calls]
    assert [s.logprobs for s in models] == [c.logprobs for c in calls]
    assert all(s.logprobs is None for s in traj.segments if s.kind is not M)
    # What the agent added after each turn: the template's end of the turn (unless the model
    # sampled it), its output message, the next generation prompt.
    for tool, call in zip([s for s in traj.segments if s.kind is T], calls):
        assert "```output\n(no code to run)\n```" in tool.text
        assert tool.text.endswith("<|im_start|>assistant\n")
        ended = call.completion_ids[-1] == chat_tokenizer.eos_token_id
        assert tool.text.startswith("\n" if ended else IM_END)
    mask = traj.loss_mask
    pos = 0
    for s in traj.segments:
        assert set(mask[pos : pos + len(s.ids)]) <= {int(s.kind is M)}
        pos += len(s.ids)
    assert sum(mask) == sum(len(c.completion_ids) for c in calls) == traj.num_model_tokens
    assert traj.meta["who"] == "test" and traj.meta["gateway_calls"] == 3
    assert "posted_reward" in traj.meta and traj.meta["posted_reward"] == 0.0


def test_the_sampled_ids_are_reused_where_re_tokenizing_would_differ(chat_tokenizer):
    """Token in: a model that spelled a word letter by letter keeps its letters in the next
    prompt, where encoding the returned text again would merge them."""
    tok = chat_tokenizer
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    prompt = "<|im_start|>user\nCompute 12 * 34.<|im_end|>\n<|im_start|>assistant\n"
    letters = [i for ch in "print(408)" for i in encode(ch)]
    assert encode("print(408)") != letters  # BPE merges what the model sampled apart
    prev = RecordedCall(
        encode(prompt), letters, [-1.0] * len(letters), "length", prompt, "print(408)"
    )
    text = prompt + "print(408)<|im_end|>\n<|im_start|>user\n408<|im_end|>\n"
    found = splice_prompt(prev, text, encode, tok.eos_token_id, IM_END)
    rest = encode("<|im_end|>\n<|im_start|>user\n408<|im_end|>\n")
    assert found.ids == prev.history + rest
    assert found.ids != encode(text)  # what re-tokenizing would have fed the model instead


@pytest.mark.parametrize("where", ["generation prompt's newline", "sampled last token"])
def test_one_dropped_separator_token_refuses_the_session_at_its_position(
    agent_session, chat_tokenizer, where
):
    calls, _ = agent_session
    first = calls[0]
    at = len(first.prompt_ids) - 1
    if where == "sampled last token":
        at = len(first.prompt_ids) + len(first.completion_ids) - 1
    prompt = list(calls[1].prompt_ids)
    del prompt[at]  # one token of the history gone from call 2's prompt
    broken = [first, dataclasses.replace(calls[1], prompt_ids=prompt), *calls[2:]]
    decode = lambda ids: chat_tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    assemble_trajectory(calls, decode)  # the unbroken session is fine
    with pytest.raises(SessionRefused) as refused:
        assemble_trajectory(broken, decode)
    assert refused.value.call == 1
    assert refused.value.position == at
    message = str(refused.value)
    assert message.startswith(
        f"call 2 of the session does not extend the conversation so far: at token {at}"
    )
    assert repr(decode(calls[1].prompt_ids[at : at + 1]))[1:-1] in message  # the token, decoded


def test_a_template_that_drops_a_past_turns_newline_is_refused_where_it_diverged(
    chat_model, chat_tokenizer
):
    tok = copy.deepcopy(chat_tokenizer)
    tok.chat_template = NO_NEWLINE_TEMPLATE

    async def main():
        async with serving(chat_model, tok) as gateway:
            session = gateway.open_session()
            await run_agent(session, {"AGENT_TURNS": "2", "AGENT_MAX_TOKENS": "8"})
            calls = list(session.calls)
            with pytest.raises(SessionRefused) as refused:
                gateway.collect(session.id)
            return calls, refused.value

    calls, refused = asyncio.run(main())
    first, second = calls
    assert not second.spliced and "at character" in second.splice_note
    history = first.prompt_ids + first.completion_ids
    expected = next(i for i, (a, b) in enumerate(zip(history, second.prompt_ids)) if a != b)
    assert refused.call == 1 and refused.position == expected
    # The divergence is at the end of call 1's generation prompt: its newline.
    assert expected == len(first.prompt_ids) - 1
    assert "\\n" in tok.decode(history[expected : expected + 1]).encode("unicode_escape").decode()
    assert f"at token {expected}" in str(refused) and "could not reuse the sampled ids" in str(
        refused
    )


def test_splice_reuses_the_sampled_end_of_turn_and_reports_a_different_one():
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    eos = 0
    prev = RecordedCall([1, 2], [7, 8, eos], [-1.0, -1.0, -1.0], "stop", "P>", "ab")
    done = splice_prompt(prev, "P>ab<E>\nU", encode, eos, "<E>")
    assert done.ids == [1, 2, 7, 8, eos] + encode("\nU") and done.note is None
    other = splice_prompt(prev, "P>ab</turn>\nU", encode, eos, "<E>")
    assert other.ids is None and "ended its turn with '<E>'" in other.note
    edited = splice_prompt(prev, "P>a<E>\nU", encode, eos, "<E>")
    assert edited.ids is None and "at character 3" in edited.note
    cut = dataclasses.replace(prev, completion_ids=[7, 8], logprobs=[-1.0, -1.0])
    assert splice_prompt(cut, "P>ab<E>\nU", encode, eos, "<E>").ids == [1, 2, 7, 8] + encode(
        "<E>\nU"
    )
    assert splice_prompt(None, "anything", encode, eos, "<E>").ids is None


def test_a_branching_session_is_refused():
    decode = lambda ids: "".join(map(str, ids))  # noqa: E731
    a = RecordedCall([1, 2], [3], [-0.5], "length")
    again = RecordedCall([1, 2], [4], [-0.5], "length")  # a new conversation, same prompt
    with pytest.raises(SessionRefused) as refused:
        assemble_trajectory([a, again], decode)
    assert refused.value.position == 2 and "its prompt ends there" in str(refused.value)
    with pytest.raises(SessionRefused, match="no generation call"):
        assemble_trajectory([], decode)


def test_reward_endpoint_and_bad_requests_never_break_other_sessions(chat_model, chat_tokenizer):
    async def main():
        async with serving(chat_model, chat_tokenizer) as gateway:
            a, b = gateway.open_session(), gateway.open_session()
            chat = {"messages": [{"role": "user", "content": "What is 6 * 7?"}], "max_tokens": 4}
            async with aiohttp.ClientSession(trust_env=False) as http:

                async def post(url, body, raw=None):
                    data = raw if raw is not None else json.dumps(body)
                    async with http.post(url, data=data) as r:
                        return r.status, await r.json()

                root_a = a.base_url.rsplit("/v1", 1)[0]
                root = gateway.url
                # a bad call on a, a good one on b, in between
                bad = [
                    await post(f"{root}/sessions/nope/v1/chat/completions", chat),
                    await post(f"{a.base_url}/chat/completions", None, raw=b"{not json"),
                    await post(f"{a.base_url}/chat/completions", {**chat, "n": 2}),
                    await post(f"{root_a}/reward", {"reward": "high"}),
                    await post(f"{root_a}/reward", None, raw=b'{"reward": NaN}'),
                    await post(f"{root_a}/reward", {"reward": 1, "extra": 2}),
                    await post(f"{root}/sessions/nope/reward", {"reward": 1}),
                ]
                ok_b = await post(f"{b.base_url}/chat/completions", chat)
                ok_a = await post(f"{a.base_url}/chat/completions", chat)
                posted = await post(f"{root_a}/reward", {"reward": 0.75})
                async with http.get(f"{a.base_url}/models") as r:
                    models = await r.json()
                gateway.end_session(a.id)
                ended = await post(f"{a.base_url}/chat/completions", chat)
            return bad, ok_a, ok_b, posted, models, ended, gateway.collect(a.id), gateway

    bad, ok_a, ok_b, posted, models, ended, traj, gateway = asyncio.run(main())
    statuses = [s for s, _ in bad]
    assert statuses == [404, 400, 400, 400, 400, 400, 404]
    params = [body["error"]["param"] for _, body in bad]
    assert params == ["session", "body", "n", "reward", "reward", "reward", "session"]
    assert all("\n" not in body["error"]["message"] for _, body in bad)  # one line each
    assert ok_a[0] == ok_b[0] == 200 and ok_a[1]["choices"][0]["message"]["role"] == "assistant"
    assert posted == (200, {"session": traj.meta["session"], "reward": 0.75})
    assert models["data"][0]["id"] == "tiny"
    assert ended[0] == 409 and ended[1]["error"]["code"] == "session_ended"
    assert traj.meta["posted_reward"] == 0.75 and traj.meta["gateway_calls"] == 1
    assert gateway.engine.loop_alive()


def test_completions_are_spliced_too(chat_model, chat_tokenizer):
    async def main():
        async with serving(chat_model, chat_tokenizer, temperature=1.0) as gateway:
            s = gateway.open_session()
            async with aiohttp.ClientSession(trust_env=False) as http:
                url = f"{s.base_url}/completions"
                body = {"prompt": "Compute 12 * 34.", "max_tokens": 6, "seed": 3}
                async with http.post(url, json=body) as r:
                    first = (await r.json())["choices"][0]["text"]
                body = {"prompt": "Compute 12 * 34." + first + "\nGo on.", "max_tokens": 6}
                async with http.post(url, json=body) as r:
                    assert r.status == 200
            calls = list(s.calls)
            return calls, gateway.collect(s.id)

    calls, traj = asyncio.run(main())
    assert calls[1].spliced and calls[1].prompt_ids[: len(calls[0].history)] == calls[0].history
    assert [s.kind.value for s in traj.segments] == ["prompt", "model", "tool", "model"]


def test_run_agents_returns_one_rewarded_trajectory_per_run(chat_model, chat_tokenizer):
    async def main():
        async with serving(chat_model, chat_tokenizer, temperature=1.0) as gateway:
            return await run_agents(
                gateway,
                [sys.executable, str(AGENT)],
                ["What is 1 + 1?", "What is 2 + 2?"],
                group_size=2,
                concurrency=4,
                env={"AGENT_EXPECT": ""},  # each run posts its reward
            ), gateway

    trajs, gateway = asyncio.run(main())
    assert len(trajs) == 4 and not gateway.sessions
    assert [t.meta["task"] for t in trajs] == [0, 0, 1, 1]
    assert all(t.finish_reason != "error" and t.meta["reward"] == 0.0 for t in trajs)
    assert len({t.meta["session"] for t in trajs}) == 4


def test_the_example_agent_runs_through_the_gateway(chat_model, chat_tokenizer):
    example = Path(__file__).parents[1] / "examples" / "gateway" / "agent.py"

    async def main():
        async with serving(chat_model, chat_tokenizer, temperature=1.0) as gateway:
            return await run_agents(
                gateway,
                [sys.executable, str(example)],
                ["What is 3 + 4?"],
                score=lambda traj, task: float("7" in traj.model_text),
                env={"AGENT_MAX_TOKENS": "16"},
            )

    (traj,) = asyncio.run(main())
    assert traj.finish_reason != "error", traj.meta.get("error")
    assert traj.meta["reward"] in (0.0, 1.0) and traj.num_model_tokens > 0


def test_overlapping_calls_refuse_the_session_and_a_streamed_call_is_recorded(
    chat_model, chat_tokenizer
):
    chat = {"messages": [{"role": "user", "content": "What is 6 * 7?"}], "max_tokens": 6}

    async def main():
        async with serving(chat_model, chat_tokenizer) as gateway:
            one, two = gateway.open_session(), gateway.open_session()
            async with aiohttp.ClientSession(trust_env=False) as http:

                async def call(session, **extra):
                    url = f"{session.base_url}/chat/completions"
                    async with http.post(url, json={**chat, **extra}) as r:
                        assert r.status == 200
                        return await r.read()

                await asyncio.gather(call(one), call(one))  # two in flight at once
                await call(two, stream=True)
            with pytest.raises(SessionRefused, match="one call at a time"):
                gateway.collect(one.id)
            return gateway.collect(two.id)

    streamed = asyncio.run(main())
    assert streamed.meta["gateway_calls"] == 1 and streamed.num_model_tokens > 0


# ---------------------------------------------------------------- tirl train through an agent


def test_tirl_train_samples_rl_through_an_unmodified_agent_program(tmp_path):
    """`rollout.agent.command`: RL's trajectories are the agent program's calls through the
    gateway (every RL trajectory is one run of the program, which logs it), trained on and
    checkpointed like tirl's own; evaluation still samples with tirl's rollout."""
    log = tmp_path / "agent.jsonl"
    cmd = train_cmd(
        tmp_path,
        "agent",
        "prompt.chat=true",
        "model.max_positions=1024",  # the chat template's system turn is long in a tiny BPE
        "rl.adaptive_batch=false",
        f"rollout.agent.command=[{sys.executable}, {AGENT}]",
    )
    done = subprocess.run(
        cmd, env={**offline_env(), "AGENT_LOG": str(log)}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == RL_STEPS * 2 * 2  # steps x prompts x group members, one run each
    counts = Counter(r["task"] for r in runs)  # each task's question, once per group member
    assert len(counts) == RL_STEPS * 2 and set(counts.values()) == {2}
    records = [json.loads(line) for line in (tmp_path / "agent" / "metrics.jsonl").open()]
    rl = [r for r in records if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == list(range(RL_STEPS))
    assert all(r["batch/trajectories_sampled"] == 4 and r["train/updated"] == 1 for r in rl)


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["variants=[code, text]"], "set variants: [code]"),
        (["rl.segment_tokens=8"], "partial rollouts"),
        (["rollout.agent.command=[python, '']"], "non-empty strings"),
    ],
)
def test_an_agent_setting_that_cannot_run_is_one_line(tmp_path, extra, expected):
    cmd = train_cmd(tmp_path, "bad", "rollout.agent.command=[python, agent.py]", *extra)
    done = subprocess.run(cmd, env=offline_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tirl: error: ") and "rollout.agent.command: " in line
    assert expected in line


def test_the_self_grading_example_posts_its_own_reward(chat_model, chat_tokenizer):
    """examples/gateway/code_agent.py grades itself (did its code run?) and posts the reward,
    which is what `tirl train` then trains on (docs/gateway.md)."""
    example = Path(__file__).parents[1] / "examples" / "gateway" / "code_agent.py"

    async def main():
        async with serving(chat_model, chat_tokenizer, temperature=1.0) as gateway:
            return await run_agents(
                gateway, [sys.executable, str(example)], ["What is 3 + 4?"], group_size=2
            )

    trajs = asyncio.run(main())
    assert all(t.finish_reason != "error" for t in trajs), [t.meta.get("error") for t in trajs]
    assert all(t.meta["reward"] == t.meta["posted_reward"] in (0.0, 1.0) for t in trajs)
