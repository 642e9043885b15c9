"""What RL changed over its SFT start, item by item, with a bootstrap CI (issue 32).

A run evaluates every variant on the same held-out items after SFT and after RL
(`samples/<variant>_<phase>_<set>.jsonl`, greedy). Two means with their own CIs overlap long
after the difference between them is clear, because most items score the same before and after:
the question "did RL help?" is answered by the mean of the per-item differences, paired on the
item, and the percentile bootstrap over items of that mean (`tirl.eval.metrics.bootstrap_ci`,
2,000 resamples, 95 %). Items that failed to run in either evaluation are left out of the pair.

The same pairing answers the run's other questions (`other_gains`): what SFT added to the model
as loaded (with `eval.base`), and how far the code variant is ahead of the text-only one.
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
        if before_path.is_file():
            rows.append({"variant": variant, "eval_set": eval_set,
                         **compare(before_path, after_path)})  # fmt: skip
    return rows


def other_gains(run_dir: Path) -> list[dict]:
    """The run's other paired comparisons on the same held-out items: what SFT added to the
    model as loaded (`eval.base`: base -> sft, per variant), and the code variant against the
    text-only one after the last phase both reached. Rows as `rl_gains`', with `comparison`
    naming the two sides."""
    folder = Path(run_dir) / "samples"

    def path(variant: str, phase: str, eval_set: str) -> Path:
        return folder / f"{variant}_{phase}_{eval_set}.jsonl"

    rows = []
    for base in sorted(folder.glob("*_base_*.jsonl")):
        variant, eval_set = base.stem.split("_base_", 1)
        if path(variant, "sft", eval_set).is_file():
            label = f"{variant}: base → SFT"
            rows.append({"comparison": label, "variant": variant, "eval_set": eval_set,
                         **compare(base, path(variant, "sft", eval_set))})  # fmt: skip
    for code in sorted(folder.glob("code_sft_*.jsonl")):
        eval_set = code.stem[len("code_sft_") :]
        phase = "rl" if path("code", "rl", eval_set).is_file() else "sft"
        text = path("text", phase, eval_set)
        if text.is_file():
            label = f"text → code ({phase.upper()})"
            rows.append({"comparison": label, "variant": "code", "eval_set": eval_set,
                         **compare(text, path("code", phase, eval_set))})  # fmt: skip
    return rows


def compare(before_path: Path, after_path: Path) -> dict:
    """{"reward": ..., "correct": ...}: the two evaluations' means and their paired gain."""
    before, after = item_scores(before_path), item_scores(after_path)
    return {
        metric: {
            "before": _mean(before[metric]),
            "after": _mean(after[metric]),
            **paired_gain(before[metric], after[metric]),
        }  # fmt: skip
        for metric in ("reward", "correct")
    }


def _mean(scores: dict[str, float]) -> float:
    return sum(scores.values()) / len(scores) if scores else math.nan


GAINS_HEADER = [
    "variant", "eval set", "items", "reward: SFT → RL", "gain [95 % CI]", "accuracy: SFT → RL",
    "gain [95 % CI]",
]  # fmt: skip


def gains_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The gains as table cells (header, body) for the run's report."""
    return GAINS_HEADER, [[r["variant"], r["eval_set"], *_metric_cells(r)] for r in rows]


COMPARISON_HEADER = [
    "comparison", "eval set", "items", "reward", "gain [95 % CI]", "accuracy", "gain [95 % CI]",
]  # fmt: skip


def comparison_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """`other_gains` rows as table cells (header, body)."""
    return COMPARISON_HEADER, [[r["comparison"], r["eval_set"], *_metric_cells(r)] for r in rows]


def _metric_cells(r: dict) -> list[str]:
    cells = [str(r["reward"]["n"])]
    for metric in ("reward", "correct"):
        m = r[metric]
        cells += [f"{m['before']:.3f} → {m['after']:.3f}", _signed(m["D"], m["ci"])]
    return cells


def gains_text(rows: list[dict], heading: str = "RL against its SFT start") -> str:
    """The gains for a terminal: a heading line and one line per row."""
    lines = [f"{heading} (held-out items paired; gain [95 % bootstrap CI]):"]
    for r in rows:
        rw, acc = r["reward"], r["correct"]
        lines.append(
            f"  {r.get('comparison', r['variant'])} {r['eval_set']} ({rw['n']} items): reward"
            f" {rw['before']:.3f} → {rw['after']:.3f}, gain {_signed(rw['D'], rw['ci'])};"
            f" accuracy gain {_signed(acc['D'], acc['ci'])}"
        )
    return "\n".join(lines)


def _signed(d: float, ci: list[float]) -> str:
    if math.isnan(d):
        return "-"
    return f"{d:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"
