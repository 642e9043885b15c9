"""CIR's claims judged from an ablation: the full recipe against each arm that removes one part.

Each arm named in `CIR_CLAIMS` stands for one claim of the CIR paper (papers/000: §2.3.2's six
strategies, and the paradigm claim of Table 1): the reference arm (the full recipe, the
ablation's first variant) is better than the arm without that part. An ablation evaluates
every arm greedily on the same held-out items after RL, so the question is answered paired by
item: D = mean over items of (reference correct - arm correct), pooled over seeds as
(seed, item) pairs, with the 95 % percentile bootstrap CI over those pairs
(`tirl.eval.gains.paired_gain`).

Verdicts: "reproduced" when the whole CI lies above 0 (the full recipe is ahead beyond the
noise of which items were drawn), "not reproduced" when it lies below 0 (the arm without the
part is ahead), "inconclusive" when it contains 0; when both arms answer every item alike at 0
or 1 the reason says so (a floor or ceiling: the task cannot separate them). The CI covers item
sampling only; with one seed it says nothing about another seed's RL, which the table's spread
over seeds shows.
"""

from __future__ import annotations

import math
from pathlib import Path

from tirl.eval.gains import item_scores, paired_gain

# arm -> the claim it tests (the reference arm beats it), and where the paper makes it
CIR_CLAIMS: dict[str, tuple[str, str]] = {
    "text-only": ("code-integrated RL beats text-only RL", "Table 1"),
    "-exact-match": ("exact-match code boundaries beat stop-token boundaries", "§2.3.2, Fig. 1"),
    "-tool-mask": ("masking interpreter output from the loss beats training on it", "§2.3.2"),
    "-budget-growth": ("a tool budget growing 2 -> 3 -> 4 beats a fixed budget", "§3.1, §3.2.2"),
    "-no-entropy": ("no entropy bonus beats an entropy bonus", "§2.3.2"),
    "-no-kl": ("no KL penalty beats a KL penalty", "§2.3.2"),
    "-clip-higher": ("clip-higher beats symmetric clipping", "§2.3.2"),
}

VERDICTS = ("reproduced", "not reproduced", "inconclusive")


def verdict(ci: list[float], tied_at: float | None = None) -> tuple[str, str]:
    """(verdict, why) for the CI of reference - arm; `tied_at`: the accuracy both arms share
    when they answered every item alike at 0 or 1 (a floor or ceiling: the task cannot tell
    them apart)."""
    low, high = ci
    if math.isnan(low) or math.isnan(high):
        return "inconclusive", "no item was scored in both arms"
    if tied_at in (0.0, 1.0):
        return (
            "inconclusive",
            f"both arms score {tied_at:.0f} on every item: the task cannot separate them",
        )
    if low > 0:
        return "reproduced", "the full recipe is ahead: the CI lies above 0"
    if high < 0:
        return "not reproduced", "the arm without the part is ahead: the CI lies below 0"
    return "inconclusive", "the CI contains 0"


def pooled_correct(seed_dirs: list[Path], arm: str, eval_set: str) -> dict[str, float]:
    """{"<seed dir>/<task id>": 0/1} of an arm's greedy evaluation after RL, every seed."""
    out = {}
    for seed_dir in seed_dirs:
        path = seed_dir / "samples" / f"{arm}_rl_{eval_set}.jsonl"
        if path.is_file():
            for item, correct in item_scores(path)["correct"].items():
                out[f"{seed_dir.name}/{item}"] = correct
    return out


def claim_rows(seed_dirs: list[Path], arms: list[str], eval_set: str) -> list[dict]:
    """One row per arm after the first (the reference) that names a CIR claim:
    {"arm", "claim", "where", "n", "D", "ci", "verdict", "why"}, D = reference - arm."""
    reference = pooled_correct(seed_dirs, arms[0], eval_set)
    rows = []
    for arm in arms[1:]:
        if arm not in CIR_CLAIMS:
            continue
        claim, where = CIR_CLAIMS[arm]
        scores = pooled_correct(seed_dirs, arm, eval_set)
        gain = paired_gain(scores, reference)
        paired = reference.keys() & scores.keys()
        values = {reference[k] for k in paired} | {scores[k] for k in paired}
        word, why = verdict(gain["ci"], values.pop() if len(values) == 1 else None)
        rows.append({"arm": arm, "claim": claim, "where": where, **gain,
                     "verdict": word, "why": why})  # fmt: skip
    return rows


def claim_cells(rows: list[dict], reference: str) -> tuple[list[str], list[list[str]]]:
    """The claims table's header and cells."""
    header = ["claim (paper)", "arm", "pairs", f"{reference} - arm [95% CI]", "verdict", "why"]
    cells = [
        [
            f"{r['claim']} ({r['where']})",
            r["arm"],
            str(r["n"]),
            f"{r['D']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]",
            r["verdict"],
            r["why"],
        ]
        for r in rows
    ]
    return header, cells
