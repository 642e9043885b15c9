"""What a task's scorer says of one answer, as a type every layer can hold.

`Score` lives here, in the lowest layer, so that a `tirl.protocol.segments.Trajectory` can carry
its own score as a typed field (`Trajectory.score`) instead of loose `meta` keys. Scorers are made
by task sources (`tirl.tasks`), which re-export `Score` as `tirl.tasks.Score`; nothing here scores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Score:
    """What a scorer says of one answer: `reward` in [0, 1], `correct`, the `reason`, and the
    answer it read (`predicted`, None when none was found)."""

    reward: float
    correct: bool
    reason: str = ""
    predicted: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Score:
        return cls(
            reward=float(d["reward"]),
            correct=bool(d["correct"]),
            reason=str(d.get("reason") or ""),
            predicted=d.get("predicted"),
        )
