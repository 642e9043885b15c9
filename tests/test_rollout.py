"""Rollouts with a real tiny model, a real tokenizer and the real sandbox."""

import asyncio

import torch
from conftest import CODES  # noqa: E402  (the scripted model's prompts and code)

from tirl.backends.hf import HFEngine
from tirl.envs.arithmetic import ArithmeticItem
from tirl.protocol.segments import SegmentKind
from tirl.rollout.runner import BUDGET_SPENT_MESSAGE, Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tasks.scoring import score_trajectory
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.batch import collate, token_logprobs


def _rollout(model, tokenizer, prompts, settings, limits=None):
    async def main():
        async with Sandbox(limits or SandboxLimits(timeout_s=1.0)) as sandbox:
            engine = HFEngine(model, tokenizer.eos_token_id, seed=0)
            trajs = await Rollout(engine, tokenizer, sandbox).run_many(prompts, settings)
            engine.close()
            return trajs

    return asyncio.run(main())


GREEDY = RolloutSettings(max_model_tokens=40, tool_budget=2, temperature=0.0)


def test_exceptions_and_timeouts_reach_the_model_as_text(scripted_model, tokenizer):
    error, timeout = _rollout(scripted_model, tokenizer, ["A:\n", "B:\n"], GREEDY)
    assert error.tool_calls[0].code == "print(1/0)"
    assert error.tool_calls[0].status == "error"
    tool_text = next(s.text for s in error.segments if s.kind is SegmentKind.TOOL)
    assert "ZeroDivisionError: division by zero" in tool_text and tool_text.startswith(
        "\n```output\n"
    )
    assert timeout.tool_calls[0].status == "timeout"
    assert "TimeoutError" in next(s.text for s in timeout.segments if s.kind is SegmentKind.TOOL)
    # the trajectories went on after the tool output instead of crashing
    assert error.segments[-1].kind is SegmentKind.MODEL


def test_a_box_printed_by_the_interpreter_never_scores(scripted_model, tokenizer):
    (traj,) = _rollout(scripted_model, tokenizer, ["C:\n"], GREEDY)
    tool_text = next(s.text for s in traj.segments if s.kind is SegmentKind.TOOL)
    assert "\\boxed{42}" in tool_text  # the interpreter printed it...
    task = ArithmeticSource().task(ArithmeticItem("q", "42", "42", "product", "test", 0))
    score_trajectory(traj, task)
    assert traj.score.predicted is None and traj.score.correct is False  # ...and it does not count


def test_ids_trained_on_are_exactly_the_ids_sampled(scripted_model, tokenizer):
    engine_outputs = []
    settings = RolloutSettings(max_model_tokens=40, tool_budget=2, temperature=1.0)

    async def main():
        async with Sandbox() as sandbox:
            engine = HFEngine(scripted_model, tokenizer.eos_token_id, seed=3)
            original = engine.generate

            async def recording_generate(key, feed, **kw):
                out = await original(key, feed, **kw)
                engine_outputs.append((key, list(feed), list(out.ids)))
                return out

            engine.generate = recording_generate
            trajs = await Rollout(engine, tokenizer, sandbox).run_many(list(CODES) * 2, settings)
            engine.close()
            return trajs

    trajs = asyncio.run(main())
    batch = collate(trajs, tokenizer.pad_token_id)
    for row, traj in enumerate(trajs):
        model_ids = [s.ids for s in traj.segments if s.kind is SegmentKind.MODEL]
        assert all(any(ids == out for _, _, out in engine_outputs) for ids in model_ids)
        n = len(traj.ids)
        assert batch.input_ids[row, :n].tolist() == traj.ids
    # the trainer's own forward pass scores the sampled tokens as the sampler did
    with torch.no_grad():
        logprobs, _ = token_logprobs(scripted_model, batch)
    gap = ((logprobs - batch.sampler_logprobs).abs() * batch.loss_mask).max().item()
    assert gap < 1e-4


def test_budget_spent_blocks_are_not_run(scripted_model, tokenizer):
    (traj,) = _rollout(
        scripted_model,
        tokenizer,
        ["D:\n"],
        RolloutSettings(max_model_tokens=40, tool_budget=0, temperature=0.0),
    )
    assert traj.tool_calls[0].status == "skipped"
    assert BUDGET_SPENT_MESSAGE in traj.response_text


def test_text_only_rollouts_never_call_the_sandbox(scripted_model, tokenizer):
    settings = RolloutSettings(max_model_tokens=30, temperature=0.0, use_tools=False)

    async def main():
        engine = HFEngine(scripted_model, tokenizer.eos_token_id)
        trajs = await Rollout(engine, tokenizer, sandbox=None).run_many(["D:\n"], settings)
        engine.close()
        return trajs

    (traj,) = asyncio.run(main())
    assert traj.tool_calls == [] and all(s.kind is not SegmentKind.TOOL for s in traj.segments)


def _text_only(model, tokenizer, settings, limit_now=None):
    """A greedy text-only rollout of "D:\\n"; `limit_now`: the rollout's max_model_tokens_now."""

    async def main():
        engine = HFEngine(model, tokenizer.eos_token_id, seed=0)
        rollout = Rollout(engine, tokenizer, None, max_model_tokens_now=limit_now)
        (traj,) = await rollout.run_many(["D:\n"], settings)
        engine.close()
        return traj

    return asyncio.run(main())


def test_a_limit_that_shrinks_with_the_reply_is_as_if_it_held_from_the_start(
    scripted_model, tokenizer
):
    """verl's stage expansion settles a trajectory's limit when its first reply says which
    policy version sampled it: the result must be the trajectory sampled under that limit."""
    settings = RolloutSettings(max_model_tokens=12, temperature=0.0, use_tools=False)
    short = _text_only(scripted_model, tokenizer, settings)
    assert short.finish_reason == "length"
    reads = [30]  # the first read: the request asks for 30 tokens; then 12

    def limit_now():
        return reads.pop() if reads else 12

    cut = _text_only(scripted_model, tokenizer, settings, limit_now)
    assert not reads and cut.num_model_tokens == 12
    assert cut.ids == short.ids and cut.finish_reason == "length"
    assert len(cut.segments[-1].logprobs) == 12


def test_max_trajectories_bounds_the_sessions_open_at_once_and_samples_the_same(
    scripted_model, tokenizer
):
    """Each trajectory holds its sandbox session from its first code block to its end: a cap
    on trajectories caps the sessions. Seeded trajectories come out the same either way."""
    settings = RolloutSettings(max_model_tokens=40, tool_budget=2, temperature=1.0)
    prompts = list(CODES) * 3
    metas = [{"seed": i} for i in range(len(prompts))]

    async def main(cap):
        async with Sandbox() as sandbox:
            engine = HFEngine(scripted_model, tokenizer.eos_token_id, seed=0)
            rollout = Rollout(engine, tokenizer, sandbox, max_trajectories=cap)
            peak = 0

            async def watch():
                nonlocal peak
                while True:
                    peak = max(peak, len(rollout.running()))
                    await asyncio.sleep(0)

            watcher = asyncio.create_task(watch())
            trajs = await rollout.run_many(prompts, settings, metas)
            watcher.cancel()
            engine.close()
            return trajs, peak

    capped, peak = asyncio.run(main(2))
    free, free_peak = asyncio.run(main(None))
    assert peak == 2 < free_peak
    assert [t.ids for t in capped] == [t.ids for t in free]
