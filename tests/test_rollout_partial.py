"""Partial rollouts: a trajectory cut into segments over several training steps keeps its
exact token ids, its live sandbox state and a policy version per token; stale ones restart."""

from __future__ import annotations

import asyncio

import pytest

from tirl.backends.hf import GenOutput, HFEngine
from tirl.protocol.fences import render_code
from tirl.protocol.segments import SegmentKind
from tirl.rollout.partial import PartialRolloutPool
from tirl.rollout.runner import (
    PartialRollout,
    Rollout,
    RolloutSettings,
    token_policy_versions,
)
from tirl.sandbox import Sandbox, SandboxLimits


class ScriptedEngine:
    """Samples a fixed script of model texts, token by token, honouring `max_new_tokens` and
    the stop function as a real engine does; records every (key, feed, sampled ids)."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.script = [
            i for t in turns for i in tokenizer(t, add_special_tokens=False)["input_ids"]
        ]
        self.eos = tokenizer.eos_token_id
        self.cursor = 0
        self.calls: list[tuple[object, list[int], list[int]]] = []
        self.released: list[object] = []

    async def generate(self, key, feed_ids, *, max_new_tokens, temperature=1.0, stop=None):
        assert feed_ids, "a rollout never feeds nothing"
        ids, reason = [], "length"
        while len(ids) < max_new_tokens:
            if self.cursor == len(self.script):
                ids.append(self.eos)
                reason = "stop"
                break
            ids.append(self.script[self.cursor])
            self.cursor += 1
            if stop is not None and stop(ids):
                reason = "boundary"
                break
        self.calls.append((key, list(feed_ids), list(ids)))
        return GenOutput(ids, [-0.5] * len(ids), reason)

    def release(self, key) -> None:
        self.released.append(key)


TURNS = [
    render_code("x = 41"),  # step 1 sets a variable...
    render_code("print(x + 1)"),  # ...step 2 reads it
    "The answer is 42.",
]


def test_a_trajectory_split_over_three_steps_is_one_token_exact_trajectory(tokenizer):
    engine = ScriptedEngine(tokenizer, TURNS)
    settings = RolloutSettings(max_model_tokens=200, tool_budget=4, segment_tool_calls=1)

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2)) as sandbox:
            pool = PartialRolloutPool(Rollout(engine, tokenizer, sandbox))
            per_step = [await pool.step(["Q:\n"] if v == 0 else [], settings, v) for v in range(3)]
            return per_step, pool.stats()

    per_step, stats = asyncio.run(main())
    assert [len(done) for done in per_step] == [0, 0, 1]
    assert stats["rollout/partial_resumed"] == 2 and stats["rollout/partial_carried"] == 0
    traj = per_step[2][0]
    assert traj.finish_reason == "stop"
    # the variable set in step 1 was read in step 2: the session stayed alive across steps
    assert [c.status for c in traj.tool_calls] == ["ok", "ok"]
    assert "42" in traj.tool_calls[1].output_text
    # token-in, token-out across the seams: prompt + each sampled run + each tool output
    tools = [s.ids for s in traj.segments if s.kind is SegmentKind.TOOL]
    sampled = [out for _, _, out in engine.calls]
    prompt = tokenizer("Q:\n", add_special_tokens=False)["input_ids"]
    assert traj.ids == prompt + sampled[0] + tools[0] + sampled[1] + tools[1] + sampled[2]
    # each step started a new engine key and re-prefilled the whole history (stale KV dropped)
    keys = [key for key, _, _ in engine.calls]
    assert len(set(keys)) == 3 and set(engine.released) == set(keys)
    assert engine.calls[1][1] == prompt + sampled[0] + tools[0]
    assert engine.calls[2][1] == traj.ids[: len(traj.ids) - len(sampled[2])]
    # one policy version per token: -1 off the model, the step's version on it
    expected = [-1] * len(prompt)
    for version, (out, tool) in enumerate(zip(sampled, [*tools, []])):
        expected += [version] * len(out) + [-1] * len(tool)
    assert token_policy_versions(traj) == expected


def test_segment_token_budget_cuts_mid_turn_and_greedy_resumes_exactly(scripted_model, tokenizer):
    """With the same weights, a trajectory cut every 5 tokens and re-prefilled at each cut is
    the trajectory generated in one go (same ids, same log-probabilities)."""
    settings = RolloutSettings(
        max_model_tokens=40, tool_budget=2, temperature=0.0, segment_tokens=5
    )
    eos = tokenizer.eos_token_id

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2)) as sandbox:
            whole = await Rollout(HFEngine(scripted_model, eos), tokenizer, sandbox).run_many(
                ["D:\n", "A:\n"], settings
            )
            rollout = Rollout(HFEngine(scripted_model, eos), tokenizer, sandbox)
            pieces = [await rollout.start(p, settings) for p in ["D:\n", "A:\n"]]
            steps = 1
            while any(isinstance(p, PartialRollout) for p in pieces):
                for i, p in enumerate(pieces):
                    if isinstance(p, PartialRollout):
                        assert p.trajectory.finish_reason == "partial"
                        # the session is opened at the first block and stays open across cuts
                        assert (p.session is not None) == bool(p.trajectory.tool_calls)
                        rollout.policy_version += 1
                        pieces[i] = await rollout.resume(p, settings)
                steps += 1
            return whole, pieces, steps

    whole, pieces, steps = asyncio.run(main())
    assert steps >= 3
    for a, b in zip(whole, pieces):
        assert b.ids == a.ids and b.finish_reason == a.finish_reason
        assert [(c.code, c.status) for c in b.tool_calls] == [
            (c.code, c.status) for c in a.tool_calls
        ]
        lp_a = [x for s in a.segments if s.logprobs for x in s.logprobs]
        lp_b = [x for s in b.segments if s.logprobs for x in s.logprobs]
        assert lp_b == pytest.approx(lp_a, abs=1e-4)
        versions = [v for v in token_policy_versions(b) if v >= 0]
        assert versions == sorted(versions) and len(set(versions)) >= 3  # several versions


@pytest.mark.parametrize("on_stale", ["restart", "finish"])
def test_the_staleness_bound_restarts_or_finishes_old_trajectories(tiny_model, tokenizer, on_stale):
    # eos -1: nothing ends early, so each trajectory needs 30 / 3 = 10 segments
    settings = RolloutSettings(
        max_model_tokens=30, temperature=1.0, use_tools=False, segment_tokens=3
    )

    async def main():
        pool = PartialRolloutPool(
            Rollout(HFEngine(tiny_model, -1), tokenizer, None), max_staleness=1, on_stale=on_stale
        )
        per_step = [
            await pool.step(["Compute 1 * 2."] if v == 0 else [], settings, v) for v in range(4)
        ]
        carried = list(pool.carried)
        stats = pool.stats()
        await pool.aclose()
        return per_step, carried, stats

    per_step, carried, stats = asyncio.run(main())
    assert stats["rollout/partial_stale"] >= 1
    if on_stale == "finish":
        # versions 0 and 1 sampled it; at version 2 its oldest token is 2 - 0 > 1 behind
        assert [len(d) for d in per_step] == [0, 0, 1, 0]
        stale = per_step[2][0]
        assert stale.finish_reason == "stale" and stale.num_model_tokens == 6
        assert {v for v in token_policy_versions(stale) if v >= 0} == {0, 1}
        assert stats["rollout/partial_restarted"] == 0 and carried == []
    else:
        assert [len(d) for d in per_step] == [0, 0, 0, 0]
        assert stats["rollout/partial_restarted"] == 1
        (partial,) = carried
        traj = partial.trajectory
        assert traj.meta["restarts"] == 1
        # restarted at version 2 from the prompt alone, then resumed at version 3
        assert [v for v in token_policy_versions(traj) if v >= 0] == [2] * 3 + [3] * 3
        assert partial.oldest_version == 2
