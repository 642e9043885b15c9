"""Protocols (CIR fences, AgentMath tags) in both boundary modes, as seeded property tests.

The detection tests feed random texts through `Protocol.closed_block` chunk by chunk, the way
a sampler grows its output. The rollout tests drive the real `Rollout`, the real tokenizer and
the real `Sandbox` with `TapeEngine`, a test double of the model only: it "samples" a fixed
tape of ids and stops exactly where `HFEngine` would (eos, the stop function, or length).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tirl.backends.hf import GenOutput
from tirl.protocol import (
    AGENTMATH_TAGS,
    CIR_FENCES,
    PROTOCOLS,
    Boundary,
    Protocol,
    get_protocol,
)
from tirl.protocol.fences import closed_code_block, render_code, render_tool_output
from tirl.protocol.segments import SegmentKind
from tirl.rollout.runner import BUDGET_SPENT_MESSAGE, Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits

EXACT, STOP = Boundary.EXACT_MATCH, Boundary.STOP_TOKEN
ALL_PROTOCOLS = [p.with_boundary(b) for p in PROTOCOLS.values() for b in (EXACT, STOP)]
WORDS = ["Let", "me", "compute", "the", "product", "first", "then", "check", "it", "so"]


class TapeEngine:
    """The model's test double: returns the next ids of a fixed tape, stopping like HFEngine."""

    def __init__(self, tape: list[int], eos_id: int) -> None:
        self.tape, self.eos_id, self.pos = tape, eos_id, 0
        self.feeds: list[list[int]] = []
        self.outputs: list[GenOutput] = []

    async def generate(self, key, feed_ids, *, max_new_tokens, temperature=1.0, stop=None):
        self.feeds.append(list(feed_ids))
        self.stop = stop
        ids: list[int] = []
        reason = "length"
        while len(ids) < max_new_tokens:
            if self.pos == len(self.tape):
                reason = "stop"
                break
            ids.append(self.tape[self.pos])
            self.pos += 1
            if ids[-1] == self.eos_id:
                reason = "stop"
                break
            if stop is not None and stop(ids):
                reason = "boundary"
                break
        # distinct logprobs, so that the test sees they are carried to the right tokens
        out = GenOutput(ids, [-0.001 * (self.pos - len(ids) + i) for i in range(len(ids))], reason)
        self.outputs.append(out)
        return out

    def release(self, key) -> None:
        pass


def _free_text(rng: random.Random) -> str:
    # at least 8 characters, never a marker: text between blocks
    return " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) + ".\n"


PRINTS: dict[str, str] = {}  # what each generated code prints, for checking the sandbox


def _random_code(rng: random.Random) -> tuple[str, str]:
    """A block's code and what it prints."""
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    if rng.random() < 0.5:
        code, printed = f"print({a} * {b})", str(a * b)
    else:
        code, printed = f"x = {a}\nprint(x + {b})", str(a + b)
    PRINTS[code] = printed
    return code, printed


def _random_text(rng: random.Random, protocol: Protocol) -> tuple[str, list[str], list[str]]:
    """Model text with 0-4 blocks; in stop-token mode each block may lack its stop marker.

    Returns the text, every block's code, and the codes that carry the stop marker.
    """
    exact = protocol.with_boundary(EXACT)
    text, codes, marked_codes = _free_text(rng), [], []
    for _ in range(rng.randint(0, 4)):
        code, _ = _random_code(rng)
        has_marker = rng.random() < 0.6
        block = protocol.render_code(code) if has_marker else exact.render_code(code)
        text += block + _free_text(rng)
        codes.append(code)
        if has_marker:
            marked_codes.append(code)
    return text, codes, marked_codes


def _chunks(rng: random.Random, text: str, max_size: int) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, max_size)
        out.append(text[i : i + n])
        i += n
    return out


def _detect(protocol, chunks: list[str], find=None) -> list:
    """What a rollout would run: grow the text chunk by chunk; a detection starts a new turn.
    `find`: the detector (default `protocol.closed_block`; `protocol.closed_call` for tools)."""
    find = find or protocol.closed_block
    executed, turn = [], ""
    for chunk in chunks:
        turn += chunk
        found = find(turn)
        if found is not None:
            executed.append(found)
            turn = ""  # the tool output is appended; detection starts over after it
    return executed


# ---------------------------------------------------------------- rendering and defaults


def test_default_protocol_is_cir_fences_with_exact_match_and_unchanged_rendering():
    settings = RolloutSettings()
    assert settings.protocol is CIR_FENCES and CIR_FENCES.boundary is EXACT
    assert settings.budget_spent_message == BUDGET_SPENT_MESSAGE
    assert render_code("print(1)") == "```python\nprint(1)\n```"
    assert render_tool_output("42") == "\n```output\n42\n```\n"
    assert CIR_FENCES.server_stop == ("```",)  # what OpenAIEngine asks its server to stop at
    assert closed_code_block("```python\nprint(1)\n``") is None


def test_tags_render_as_agentmath_writes_them():
    assert AGENTMATH_TAGS.render_code("print(1)") == "<code>\nprint(1)\n</code>"
    assert AGENTMATH_TAGS.render_output("1") == "\n<interpreter>\n1\n</interpreter>\n"
    assert AGENTMATH_TAGS.closed_block("<think>x</think>\n<code>\nprint(1)\n</code>") == "print(1)"
    assert AGENTMATH_TAGS.closed_block("<think>x</think>\n<code>\nprint(1)\n</cod") is None
    assert AGENTMATH_TAGS.with_boundary(STOP).stop_marker == "<interpreter>"
    assert AGENTMATH_TAGS.with_boundary(STOP).server_stop == ("<interpreter>",)
    assert get_protocol("agentmath_tags", "stop_token") == AGENTMATH_TAGS.with_boundary(STOP)
    with pytest.raises(KeyError):
        get_protocol("xml")


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=lambda p: f"{p.name}-{p.boundary.value}")
def test_a_demonstration_reads_the_same_in_both_modes_and_its_block_is_detected(protocol):
    exact = protocol.with_boundary(EXACT)
    rng = random.Random(0)
    for _ in range(50):
        code, out = _random_code(rng)
        assert protocol.closed_block(protocol.render_code(code)) == code
        # the boundary moves the split between model and tool, never the text
        assert protocol.render_code(code) + protocol.render_output(out) == exact.render_code(
            code
        ) + exact.render_output(out)


# ---------------------------------------------------------------- detection, chunk by chunk


@pytest.mark.parametrize("max_chunk", [1, 3, 8])
@pytest.mark.parametrize("protocol", PROTOCOLS.values(), ids=lambda p: p.name)
def test_exact_match_runs_every_complete_block_once_and_never_a_half_written_one(
    protocol, max_chunk
):
    rng = random.Random(1000 + max_chunk)
    for _ in range(200):
        text, codes, _ = _random_text(rng, protocol)
        assert _detect(protocol, _chunks(rng, text, max_chunk)) == codes
    for _ in range(20):
        block = protocol.render_code(_random_code(rng)[0])
        # every proper prefix of a block is a half-written block: nothing runs
        assert all(protocol.closed_block(block[:i]) is None for i in range(len(block)))


@pytest.mark.parametrize("max_chunk", [1, 3, 8])
@pytest.mark.parametrize("protocol", PROTOCOLS.values(), ids=lambda p: p.name)
def test_stop_token_mode_runs_only_blocks_followed_by_the_stop_marker(protocol, max_chunk):
    stop_mode = protocol.with_boundary(STOP)
    rng = random.Random(2000 + max_chunk)
    missed = 0
    for _ in range(200):
        text, codes, marked = _random_text(rng, stop_mode)
        chunks = _chunks(rng, text, max_chunk)
        assert _detect(stop_mode, chunks) == marked
        # exact match on the same text runs every block: the executions stop-token mode misses
        assert _detect(protocol, chunks) == codes
        missed += len(codes) - len(marked)
    assert missed > 50  # the property was exercised on missing markers


# ---------------------------------------------------------------- the rollout, end to end


def _rollout(tokenizer, prompt, model_texts, settings, limits=None):
    """Run one trajectory per tape; returns (trajectory, engine) pairs."""
    return _rollout_each(tokenizer, prompt, [(text, settings) for text in model_texts], limits)


def _rollout_each(tokenizer, prompt, texts_and_settings, limits=None):
    """One trajectory per (tape, settings), all in one sandbox (started once: it costs a
    second or so each time); returns (trajectory, engine) pairs."""

    async def main():
        async with Sandbox(limits or SandboxLimits(timeout_s=2.0)) as sandbox:
            results = []
            for text, settings in texts_and_settings:
                tape = tokenizer(text, add_special_tokens=False)["input_ids"]
                engine = TapeEngine(tape + [tokenizer.eos_token_id], tokenizer.eos_token_id)
                traj = await Rollout(engine, tokenizer, sandbox).run(prompt, settings)
                results.append((traj, engine))
            return results

    return asyncio.run(main())


def _check_token_invariants(traj, engine, prompt_ids, encode):
    """ids = prompt + sampled and tool ids interleaved; the mask marks exactly the sampled."""
    sampled = [o for o in engine.outputs if o.ids]
    model = [s for s in traj.segments if s.kind is SegmentKind.MODEL]
    tool = [s for s in traj.segments if s.kind is SegmentKind.TOOL]
    assert [s.ids for s in model] == [o.ids for o in sampled]
    assert [s.logprobs for s in model] == [o.logprobs for o in sampled]
    assert traj.segments[0].ids == prompt_ids and traj.segments[0].kind is SegmentKind.PROMPT
    assert all(s.ids == encode(s.text) for s in tool)  # tool text tokenized on its own
    assert engine.feeds == [prompt_ids] + [s.ids for s in tool][: len(engine.feeds) - 1]
    expected_ids, expected_mask = [], []
    for s in traj.segments:
        expected_ids += s.ids
        expected_mask += [int(s.kind is SegmentKind.MODEL)] * len(s.ids)
    assert traj.ids == expected_ids and traj.loss_mask == expected_mask
    assert sum(traj.loss_mask) == sum(len(o.ids) for o in engine.outputs)
    assert engine.pos == len(engine.tape)  # every sampled id is in the trajectory


def test_random_interleavings_keep_sampled_and_tool_ids_apart(tokenizer):
    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rng = random.Random(7)
    prompt = "Q: compute.\n"
    cases = []
    for i in range(12):
        protocol = ALL_PROTOCOLS[i % len(ALL_PROTOCOLS)]
        text, codes, marked = _random_text(rng, protocol)
        budget = rng.randint(0, 3)
        settings = RolloutSettings(
            max_model_tokens=10_000,
            tool_budget=budget,
            protocol=protocol,
            budget_spent_message=f"no more tools ({i})",
        )
        cases.append((text, codes if protocol.boundary is EXACT else marked, settings))

    ran_total = skipped_total = 0
    runs = _rollout_each(tokenizer, prompt, [(text, settings) for text, _, settings in cases])
    for (_, expected_codes, settings), (traj, engine) in zip(cases, runs, strict=True):
        _check_token_invariants(traj, engine, encode(prompt), encode)
        assert traj.finish_reason == "stop"
        assert [c.code for c in traj.tool_calls] == expected_codes
        ran = traj.tool_calls[: settings.tool_budget]
        assert [(c.status, c.output_text) for c in ran] == [("ok", PRINTS[c.code]) for c in ran]
        for call in traj.tool_calls[settings.tool_budget :]:
            assert (call.status, call.output_text) == ("skipped", settings.budget_spent_message)
        tool_texts = [s.text for s in traj.segments if s.kind is SegmentKind.TOOL]
        assert tool_texts == [
            settings.protocol.render_output(c.output_text) for c in traj.tool_calls
        ]
        ran_total += len(ran)
        skipped_total += len(traj.tool_calls) - len(ran)
    assert ran_total >= 5 and skipped_total >= 2  # both paths were exercised


def test_tags_protocol_end_to_end_with_the_real_sandbox(tokenizer):
    text = (
        "<think>I multiply first.</think>\n<code>\nprint(483 * 917)\n</code>"
        "The answer is \\boxed{442911}."
    )
    settings = RolloutSettings(max_model_tokens=10_000, tool_budget=2, protocol=AGENTMATH_TAGS)
    ((traj, engine),) = _rollout(tokenizer, "Q:\n", [text], settings)
    assert engine.stop.server_stop == ("</code>",)  # what a completions server should stop at
    assert [(c.code, c.status) for c in traj.tool_calls] == [("print(483 * 917)", "ok")]
    kinds = [s.kind for s in traj.segments]
    assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.MODEL]
    assert traj.segments[1].text.endswith("</code>")
    assert traj.segments[2].text == "\n<interpreter>\n442911\n</interpreter>\n"
    assert "442911" not in traj.segments[1].text  # only the tool wrote the result
    assert traj.model_text.endswith("\\boxed{442911}.")


@pytest.mark.parametrize("protocol", PROTOCOLS.values(), ids=lambda p: p.name)
def test_stop_token_rollout_misses_a_block_without_the_marker_and_runs_one_with_it(
    tokenizer, protocol
):
    stop_mode = protocol.with_boundary(STOP)
    code = "print(6 * 7)"
    without = protocol.render_code(code) + " So the answer is 42."
    with_marker = stop_mode.render_code(code) + " So the answer is 42."
    settings = RolloutSettings(max_model_tokens=10_000, protocol=stop_mode)
    (missed, _), (ran, _) = _rollout(tokenizer, "Q:\n", [without, with_marker], settings)

    # CIR Figure 1a: the block is complete but the model never wrote the marker: nothing ran
    assert missed.tool_calls == []
    assert [s.kind for s in missed.segments] == [SegmentKind.PROMPT, SegmentKind.MODEL]

    assert [(c.code, c.status, c.output_text) for c in ran.tool_calls] == [(code, "ok", "42")]
    model, tool = ran.segments[1], ran.segments[2]
    assert model.text.endswith(stop_mode.stop_marker)  # the model opened the output block
    assert tool.text == stop_mode.render_output("42")
    # and exact match runs the block the stop-token mode missed
    ((exact, _),) = _rollout(
        tokenizer, "Q:\n", [without], RolloutSettings(max_model_tokens=10_000, protocol=protocol)
    )
    assert [c.output_text for c in exact.tool_calls] == ["42"]
