"""Did RL have anything to learn from? A run whose every group scored alike learned nothing.

GRPO-style advantages are a trajectory's reward against its group's (`tirl.algos.advantages`):
when all members of a group are right, or all wrong, every advantage in it is 0 and so is the
gradient. A run where that holds for every group of every step exits normally with flat
curves, and a user cannot tell "RL does not help here" from "RL never had a signal". This
module reads `metrics.jsonl` (`train/uniform_group_share`, `train/accuracy`,
`train/truncation_rate` of each RL step) and says so in words, with what usually helps; the
report puts the notes at its top and the console prints them after the summary table.
"""

from __future__ import annotations

from collections.abc import Iterable

# Below this share of informative groups, a run is called nearly silent.
NEARLY_SILENT = 0.9


def rl_signal_notes(records: Iterable[dict]) -> list[str]:
    """One note per variant whose RL steps had (almost) no group with mixed outcomes."""
    steps: dict[str, list[dict]] = {}
    for r in records:
        if r.get("phase") == "rl" and "train/uniform_group_share" in r:
            steps.setdefault(str(r.get("variant", "")), []).append(r)
    notes = []
    for variant, rows in steps.items():
        uniform = sum(r["train/uniform_group_share"] for r in rows) / len(rows)
        if uniform < NEARLY_SILENT:
            continue
        accuracy = _mean(r.get("train/accuracy") for r in rows)
        truncated = _mean(r.get("train/truncation_rate") for r in rows)
        if uniform >= 1.0:
            head = (
                f"{variant}: RL learned nothing: in all {len(rows)} steps every group's"
                " trajectories scored alike, so every advantage was 0 and no update moved the"
                " policy."
            )
        else:
            head = (
                f"{variant}: RL had almost nothing to learn from: {uniform:.0%} of its groups"
                f" over {len(rows)} steps scored alike (advantage 0)."
            )
        notes.append(f"{head} {_why(accuracy, truncated)}")
    return notes


def _why(accuracy: float | None, truncated: float | None) -> str:
    """What the rollouts say about the cause, and what usually helps."""
    if accuracy is not None and accuracy >= 0.95:
        return (
            f"Nearly every sample was right (accuracy {accuracy:.2f}): the items are too easy"
            " for this start; train on harder ones (data.train, rl.curriculum)."
        )
    said = f"Samples were right {accuracy:.0%} of the time" if accuracy is not None else ""
    if truncated is not None and truncated >= 0.3:
        said += f" and {truncated:.0%} were cut at rl.max_model_tokens"
    said = f"{said}. " if said else ""
    return (
        f"{said}What usually helps: an SFT start that solves some items (more sft.steps, a"
        " higher sft.lr, demonstrations in the model's own format), easier items first"
        " (rl.curriculum), larger groups (rl.group_size) or a higher rl.temperature, and room"
        " to finish (rl.max_model_tokens)."
    )


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
