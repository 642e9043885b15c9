"""Schedules that change with training progress."""

from __future__ import annotations

from collections.abc import Sequence


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
