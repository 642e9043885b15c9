"""Evaluate a policy on held-out tasks with the same rollout and reward code as training."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tirl.envs.arithmetic import Task, verify
from tirl.eval.metrics import avg_at_k, mean_pass_at_k
from tirl.protocol.segments import Trajectory
from tirl.rewards.answer import answer_from_trajectory
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.synth.arithmetic import prompt_for


def score(traj: Trajectory, task: Task) -> Trajectory:
    """Record the predicted answer and its correctness in `traj.meta`."""
    predicted = answer_from_trajectory(traj)
    traj.meta.update(
        question=task.question,
        gold=task.answer,
        predicted=predicted,
        correct=verify(task, predicted),
    )
    return traj


async def evaluate(
    rollout: Rollout,
    tasks: Sequence[Task],
    settings: RolloutSettings,
    k: int = 1,
    progress: str | None = None,
) -> tuple[dict, list[Trajectory]]:
    """Accuracy, tool statistics and lengths (in model tokens) over `tasks`.

    With `settings.temperature` 0 every task is decoded once, greedily, and "eval/accuracy" is
    the share solved. Otherwise each task is sampled `k` times and "eval/accuracy" is avg@k
    (the mean over tasks of the share of its k samples that are correct; CIR reports avg@16 at
    temperature 1.0), with "eval/pass@k" beside it.
    """
    start = time.perf_counter()
    k = 1 if settings.temperature == 0 else k
    prompts = [prompt_for(t) for t in tasks for _ in range(k)]
    trajs = await rollout.run_many(prompts, settings, progress=progress)
    per_item = [
        [bool(score(trajs[i * k + j], t).meta["correct"]) for j in range(k)]
        for i, t in enumerate(tasks)
    ]
    metrics = {
        "eval/accuracy": avg_at_k(per_item),
        "eval/pass@k": mean_pass_at_k(per_item, k),
        "eval/k": k,
        "eval/temperature": settings.temperature,
        "eval/n_items": len(tasks),
        "eval/truncation_rate": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        **aggregate_tool_stats([tool_stats(t) for t in trajs]),
        "time/eval_s": time.perf_counter() - start,
    }
    return metrics, trajs
