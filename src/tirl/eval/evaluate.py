"""Evaluate a policy on held-out tasks with the same rollout and reward code as training."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tirl.envs.arithmetic import Task, verify
from tirl.eval.metrics import avg_at_k
from tirl.protocol.segments import Trajectory
from tirl.rewards.answer import answer_from_trajectory
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.synth.arithmetic import prompt_for


def score(traj: Trajectory, task: Task) -> Trajectory:
    """Record the predicted answer and its correctness in `traj.meta`."""
    predicted = answer_from_trajectory(traj)
    traj.meta.update(
        question=task.question, gold=task.answer, predicted=predicted, correct=verify(task, predicted)
    )
    return traj


async def evaluate(
    rollout: Rollout, tasks: Sequence[Task], settings: RolloutSettings, k: int = 1, progress: str | None = None
) -> tuple[dict, list[Trajectory]]:
    """avg@k accuracy, tool statistics and lengths (in model tokens) over `tasks`."""
    start = time.perf_counter()
    prompts = [prompt_for(t) for t in tasks for _ in range(k)]
    trajs = await rollout.run_many(prompts, settings, progress=progress)
    per_item = [[bool(score(trajs[i * k + j], t).meta["correct"]) for j in range(k)] for i, t in enumerate(tasks)]
    metrics = {
        "eval/accuracy": avg_at_k(per_item),
        f"eval/avg@{k}": avg_at_k(per_item),
        "eval/k": k,
        "eval/n_items": len(tasks),
        "eval/truncation_rate": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        **aggregate_tool_stats([tool_stats(t) for t in trajs]),
        "time/eval_s": time.perf_counter() - start,
    }
    return metrics, trajs
