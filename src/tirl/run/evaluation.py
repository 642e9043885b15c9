"""What a run needs from `tirl.eval`, as an object its caller hands in: the training pipeline
never imports `tirl.eval` (docs/architecture.md), so `tirl.apps.evaluation` builds this from
eval's functions and `tirl train` / `tirl ablate` / `tirl study` pass it down."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.protocol.segments import Trajectory


@dataclass(frozen=True)
class Evaluation:
    """What the pipeline needs from `tirl.eval`, handed in by the caller (train never imports
    eval). `evaluate_policy(rollout, tasks, settings, prompt_ids, samples_per_item, temperature,
    label, seed=)` -> (metrics, greedy trajectories); `first_failure(trajectories)` -> what went
    wrong in the first failed one; `check_failed_share(failed, total, max_share, where, rerun)`
    raises when too many samples failed; `write_report(run_dir, eval_results=,
    metrics_path=, samples=, config=, tokenizer=, title=)`; `summary_table(results, run_dir)` -> text."""

    evaluate_policy: Callable[..., Awaitable[tuple[dict, list[Trajectory]]]]
    check_failed_share: Callable[..., None]
    first_failure: Callable[[list[Trajectory]], str]
    write_report: Callable[..., Any]
    summary_table: Callable[[dict, Path], str]


# RL's sampler for `rollout.agent`, handed in like `Evaluation` (`tirl.apps.agents.agent_rollout`):
# (tirl's own Rollout, the task at position i, the run config) -> an object with Rollout's
# `run_many` and `engine`.
AgentRollouts = Callable[[Any, Callable[[int], Any], Any], Any]
