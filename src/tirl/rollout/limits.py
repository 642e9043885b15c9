"""The limits a trajectory runs under, as every loop that drives a rollout reads them: the
tool-call budget at a point of training, and whether a finished trajectory was cut by a limit.

tirl's trainer (`tirl.train.rl`) and the verl plugin (`tirl.integrations.verl.agent_loop`)
both use these, so they live below both, next to the rollout that enforces the limits
(`tirl.rollout.runner`: the budget per trajectory, the "skipped" answer to a block past it).
"""

from __future__ import annotations

from collections.abc import Sequence

from tirl.protocol.segments import Trajectory


def budget_at(schedule: Sequence[Sequence[float]], fraction: float) -> int:
    """The tool-call budget at `fraction` (0..1) of training.

    `schedule` is a list of [start fraction, budget] pairs sorted by fraction; the last pair
    whose start is <= `fraction` applies. CIR §3.1 grows the budget 2 -> 3 -> 4 during
    training: [[0, 2], [1/3, 3], [2/3, 4]].
    """
    budget = int(schedule[0][1])
    for start, value in schedule:
        if fraction >= start:
            budget = int(value)
    return budget


def is_truncated(traj: Trajectory) -> bool:
    """Cut by the model-token limit, the tool-call budget or the staleness bound (AgentMath's
    truncation)."""
    cut = traj.finish_reason in ("length", "stale")
    return cut or any(c.status == "skipped" for c in traj.tool_calls)
