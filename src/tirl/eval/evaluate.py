"""Evaluate a policy on held-out tasks with the same rollout and reward code as training.

Tasks are `tirl.tasks.Task`s of any source; each is asked as its prompt's token ids (the
caller's `prompt_ids(task)`, from `tirl.tasks.prompts.PromptRenderer`, plain or chat) and scored
by its own scorer on the model's text (`tirl.tasks.scoring.score_trajectory`, the scorer
`tirl eval --benchmark` uses too): `traj.score` says correct, the reward in [0, 1], the
predicted answer and why.

Failed samples: a trajectory whose engine or sandbox failed (finish_reason "error": a server
that cannot be reached, a sandbox that was lost; or "cancelled") says nothing about the policy.
It is not scored, and it is left out of the accuracy and of every other metric; the metrics count
it ("eval/failed" of "eval/samples"). `check_failed_share` turns too many of them into a
`FailedSamplesError`, one line saying how many failed and how a rerun retries them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from tirl.eval.metrics import avg_at_k, pass_at_k
from tirl.protocol.segments import Trajectory
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings, trajectory_seed
from tirl.tasks.base import Task
from tirl.tasks.scoring import score_trajectory

PromptIds = Callable[[Task], Sequence[int]]  # a task's prompt as token ids

FAILED_FINISH = ("error", "cancelled")  # finish reasons of samples the infrastructure failed


class FailedSamplesError(RuntimeError):
    """More samples failed (engine, server or sandbox) than the run allows; a rerun retries
    them. The message is one line."""


def is_failed(traj: Trajectory) -> bool:
    return traj.finish_reason in FAILED_FINISH


def first_failure(trajs: Sequence[Trajectory]) -> str:
    """What went wrong in the first failed trajectory ("" when none failed)."""
    return next((t.meta.get("error") or t.finish_reason for t in trajs if is_failed(t)), "")


def check_failed_share(
    failed: int, total: int, max_share: float, where: str, rerun: str, error: str = ""
) -> None:
    """Raise FailedSamplesError when `failed` / `total` exceeds `max_share`; `error` is an
    example of what went wrong (shortened to its first line)."""
    if total and failed / total > max_share:
        error = error.strip().splitlines()[0][:160] if error.strip() else ""
        cause = f"e.g. {error}" if error else "engine, server or sandbox errors"
        raise FailedSamplesError(
            f"{where}: {failed} of {total} samples failed ({cause}), more than the"
            f" {max_share:.1%} allowed; they are left out of every metric; {rerun}"
        )


def mean_pass_at_most_k(per_item: list[list[bool]], k: int) -> float:
    """Mean over items of pass@k, an item with n < k samples (some failed) counting pass@n."""
    return sum(pass_at_k(len(s), sum(s), min(k, len(s))) for s in per_item) / len(per_item)


async def evaluate(
    rollout: Rollout,
    tasks: Sequence[Task],
    settings: RolloutSettings,
    prompt_ids: PromptIds,
    k: int = 1,
    progress: str | None = None,
    seed: int = 0,
) -> tuple[dict, list[Trajectory]]:
    """Accuracy, mean task reward, tool statistics and lengths (in model tokens) over `tasks`.

    With `settings.temperature` 0 every task is decoded once, greedily, and "eval/accuracy" is
    the share solved. Otherwise each task is sampled `k` times and "eval/accuracy" is avg@k
    (the mean over tasks of the share of its k samples that are correct; CIR reports avg@16 at
    temperature 1.0), with "eval/pass@k" beside it. Failed samples (see the module doc) are
    left out; an item all of whose samples failed is left out of the accuracy (nan if all are).
    "eval/reward" is the mean of the scorers' rewards (partial credit where a task gives it).
    Sample j of item i is seeded by `trajectory_seed(seed, i, j)`: the same `seed` gives the
    same draws whatever else the engine runs beside them.
    """
    start = time.perf_counter()
    k = 1 if settings.temperature == 0 else k
    prompts = [list(prompt_ids(t)) for t in tasks for _ in range(k)]
    # sampled: each sample its own stream, fixed by (seed, item, sample), so the same policy
    # draws the same samples and two policies evaluated with one seed share their random draws
    metas = (
        [{"seed": trajectory_seed(seed, i, j)} for i in range(len(tasks)) for j in range(k)]
        if settings.temperature > 0
        else None
    )
    trajs = await rollout.run_many(prompts, settings, metas, progress=progress)
    per_item: list[list[bool]] = []
    scored: list[Trajectory] = []
    for i, task in enumerate(tasks):
        samples = []
        for traj in trajs[i * k : (i + 1) * k]:
            if is_failed(traj):
                traj.task_id = task.id
                traj.meta.update(question=task.problem, gold=task.answer, status="failed")
                continue
            samples.append(score_trajectory(traj, task).correct)
            scored.append(traj)
        if samples:
            per_item.append(samples)
    rewards = [t.score.reward for t in scored]
    metrics = {
        "eval/accuracy": avg_at_k(per_item) if per_item else math.nan,
        "eval/pass@k": mean_pass_at_most_k(per_item, k) if per_item else math.nan,
        "eval/reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "eval/k": k,
        "eval/temperature": settings.temperature,
        "eval/n_items": len(tasks),
        "eval/samples": len(trajs),
        "eval/failed": len(trajs) - len(scored),
        "eval/truncation_rate": (
            sum(t.finish_reason == "length" for t in scored) / len(scored) if scored else math.nan
        ),
        **(aggregate_tool_stats([tool_stats(t) for t in scored]) if scored else {}),
        "time/eval_s": time.perf_counter() - start,
    }
    return metrics, trajs


async def evaluate_policy(
    rollout: Rollout,
    tasks: Sequence[Task],
    settings: RolloutSettings,
    prompt_ids: PromptIds,
    samples_per_item: int = 0,
    temperature: float = 1.0,
    label: str = "eval",
    seed: int = 0,
) -> tuple[dict, list[Trajectory]]:
    """A greedy pass ("eval/accuracy"), then avg@k with sampling at `temperature`
    ("eval/avg@k", k = `samples_per_item`) when k > 0. `settings` carries everything else
    (token limit, tool budget, protocol); its temperature is ignored; `seed` seeds the samples
    (`evaluate`). Returns the merged metrics and the greedy trajectories."""
    greedy = replace(settings, temperature=0.0)
    metrics, trajs = await evaluate(rollout, tasks, greedy, prompt_ids, progress=f"{label}, greedy")
    k = samples_per_item
    if k > 0:
        sampled, _ = await evaluate(
            rollout,
            tasks,
            replace(settings, temperature=temperature),
            prompt_ids,
            k,
            progress=f"{label}, avg@{k}",
            seed=seed,
        )
        metrics.update(
            {
                "eval/avg@k": sampled["eval/accuracy"],
                "eval/pass@k": sampled["eval/pass@k"],
                "eval/k": sampled["eval/k"],
                "eval/temperature": sampled["eval/temperature"],
                "eval/failed": metrics["eval/failed"] + sampled["eval/failed"],
                "eval/samples": metrics["eval/samples"] + sampled["eval/samples"],
                "time/eval_s": metrics["time/eval_s"] + sampled["time/eval_s"],
            }
        )
    return metrics, trajs
