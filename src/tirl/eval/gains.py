"""What RL changed over its SFT start, item by item, with a bootstrap CI (issue 32).

A run evaluates every variant on the same held-out items after SFT and after RL
(`samples/<variant>_<phase>_<set>.jsonl`, greedy). Two means with their own CIs overlap long
after the difference between them is clear, because most items score the same before and after:
the question "did RL help?" is answered by the mean of the per-item differences, paired on the
item, and the percentile bootstrap over items of that mean (`tirl.eval.metrics.bootstrap_ci`,
2,000 resamples, 95 %). Items that failed to run in either evaluation are left out of the pair.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tirl.eval.metrics import bootstrap_ci
from tirl.protocol.segments import Trajectory


def paired_gain(before: dict[str, float], after: dict[str, float]) -> dict:
    """Mean of after - before over the items both have, and its 95 % bootstrap CI over items.
    {"n": items paired, "D": mean difference, "ci": [low, high]} (NaN with no item)."""
    shared = sorted(set(before) & set(after))
    if not shared:
        return {"n": 0, "D": math.nan, "ci": [math.nan, math.nan]}
    diffs = np.array([after[k] - before[k] for k in shared])
    low, high = bootstrap_ci(diffs)
    return {"n": len(shared), "D": float(diffs.mean()), "ci": [low, high]}


def item_scores(path: Path) -> dict[str, dict[str, float]]:
    """{"reward": {task_id: reward}, "correct": {task_id: 0/1}} of an evaluation's samples
    file, failed samples left out."""
    out: dict[str, dict[str, float]] = {"reward": {}, "correct": {}}
    for line in path.read_text(encoding="utf-8").splitlines():
        traj = Trajectory.from_dict(json.loads(line))  # also reads files from before typed scores
        if traj.score is None or traj.task_id is None:  # failed: no score
            continue
        out["reward"][traj.task_id] = traj.score.reward
        out["correct"][traj.task_id] = float(traj.score.correct)
    return out


def rl_gains(run_dir: Path) -> list[dict]:
    """One row per (variant, eval set) evaluated both after SFT and after RL: the mean reward
    and accuracy before and after, and their paired gains (`paired_gain`)."""
    folder = Path(run_dir) / "samples"
    rows = []
    for after_path in sorted(folder.glob("*_rl_*.jsonl")):
        variant, eval_set = after_path.stem.split("_rl_", 1)
        before_path = folder / f"{variant}_sft_{eval_set}.jsonl"
        if not before_path.is_file():
            continue
        before, after = item_scores(before_path), item_scores(after_path)
        row = {"variant": variant, "eval_set": eval_set}
        for metric in ("reward", "correct"):
            gain = paired_gain(before[metric], after[metric])
            row[metric] = {
                "before": _mean(before[metric]),
                "after": _mean(after[metric]),
                **gain,
            }
        rows.append(row)
    return rows


def _mean(scores: dict[str, float]) -> float:
    return sum(scores.values()) / len(scores) if scores else math.nan


GAINS_HEADER = [
    "variant", "eval set", "items", "reward: SFT → RL", "gain [95 % CI]", "accuracy: SFT → RL",
    "gain [95 % CI]",
]  # fmt: skip


def gains_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The gains as table cells (header, body) for the run's report."""
    body = []
    for r in rows:
        cells = [r["variant"], r["eval_set"], str(r["reward"]["n"])]
        for metric in ("reward", "correct"):
            m = r[metric]
            cells += [f"{m['before']:.3f} → {m['after']:.3f}", _signed(m["D"], m["ci"])]
        body.append(cells)
    return GAINS_HEADER, body


def gains_text(rows: list[dict]) -> str:
    """The gains for a terminal: a heading line and one line per (variant, eval set)."""
    lines = ["RL against its SFT start (held-out items paired; gain [95 % bootstrap CI]):"]
    for r in rows:
        rw, acc = r["reward"], r["correct"]
        lines.append(
            f"  {r['variant']} {r['eval_set']} ({rw['n']} items): reward {rw['before']:.3f} →"
            f" {rw['after']:.3f}, gain {_signed(rw['D'], rw['ci'])}; accuracy gain"
            f" {_signed(acc['D'], acc['ci'])}"
        )
    return "\n".join(lines)


def _signed(d: float, ci: list[float]) -> str:
    if math.isnan(d):
        return "-"
    return f"{d:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"
