"""The statistics of `tirl study races`'s report (`tirl.studies.races_report`): bootstrap
resamples over seeds and items, paired differences and their verdicts, whether claim 4 can be
judged, and what an arm's measured curve says it would take. Pure functions of arrays."""

from __future__ import annotations

import math
import statistics

import numpy as np

from tirl.studies.races_tasks import EVAL_SIZES

RESAMPLES = 2000


def bootstrap_draws(rng: np.random.Generator, n_seeds: int, n_items: dict[str, int]) -> list[tuple]:
    """The bootstrap's resamples: (seed indices, {set: item indices})."""
    return [
        (rng.integers(0, n_seeds, n_seeds),
         {s: rng.integers(0, n, n) for s, n in n_items.items()})
        for _ in range(RESAMPLES)
    ]  # fmt: skip


def nan_mean(matrix: np.ndarray, seeds: np.ndarray | None = None, items: np.ndarray | None = None):
    m = matrix if seeds is None else matrix[seeds]
    m = m if items is None else m[:, items]
    return float(np.nanmean(m)) if np.isfinite(m).any() else math.nan


def heldout_score(mats: dict[str, np.ndarray], draw=None) -> float:
    """Mean over the held-out sets of each set's mean item score (one resample if `draw`)."""
    seeds, items = draw if draw is not None else (None, {})
    return statistics.fmean(nan_mean(m, seeds, items.get(s)) for s, m in mats.items())


def ci(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan
    return float(np.percentile(finite, 2.5)), float(np.percentile(finite, 97.5))


def verdict(lo: float, hi: float, *, above: float = 0.0) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive"
    if lo > above:
        return "reproduced"
    if hi < 0:
        return "not reproduced"
    return "inconclusive"


def start_verdict(lo: float, hi: float) -> str:
    """Where an arm ended against the SFT model it started from, on the CI of the difference."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no score"
    if lo > 0:
        return "beats its SFT start"
    if hi < 0:
        return "below its SFT start"
    return "within the noise"


def paired_difference(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], draws: list[tuple]
) -> tuple[float, tuple[float, float]]:
    """held-out(a) - held-out(b) and its CI, both resampled with the same draws (the same seeds
    and items: paired). `a` and `b` are [seeds, items] per set, over the same sets."""
    point = heldout_score(a) - heldout_score(b)
    return point, ci([heldout_score(a, d) - heldout_score(b, d) for d in draws])


def versus_start(arm: dict[str, np.ndarray], start: dict[str, np.ndarray], draws) -> dict:
    """An arm after RL against its SFT start, on every held-out set and on the compositions
    alone. `arm` is [seeds, items] per set, `start` [items] per set: every seed starts from
    the same SFT model, so its row repeats for each seed and the resampling stays paired."""
    start_rows = {s: np.broadcast_to(v, arm[s].shape) for s, v in start.items()}
    d, c = paired_difference(arm, start_rows, draws)
    comp = ("compositions",)
    cd, cc = paired_difference({s: arm[s] for s in comp}, {s: start_rows[s] for s in comp}, draws)
    return {"D": d, "ci": c, "verdict": start_verdict(*c), "compositions_D": cd,
            "compositions_ci": cc, "compositions_verdict": start_verdict(*cc)}  # fmt: skip


def what_it_would_take(
    curve: list[tuple[int, float]], gain: float, ci_: tuple[float, float], items: int
) -> dict:
    """A linear extrapolation from an arm's measured held-out compositions (issue 46's "a
    measured scaling estimate that shows what it would take"):
    - `slope`: the least-squares slope of the score per RL step over `curve` (the SFT start at
      step 0, then each RL evaluation);
    - `steps`: the RL steps from the start at that slope for a gain as large as the CI's
      half-width h = (hi - lo) / 2, the noise of `items` held-out items (NaN without an upward
      trend);
    - `items`: the held-out items at which the measured `gain` clears its CI, the half-width
      shrinking as 1 / sqrt(items): items * (h / gain)^2 (NaN without a gain).
    Both assume the trend and the per-item spread stay as measured: an estimate, not a result."""
    points = [(x, y) for x, y in curve if math.isfinite(y)]
    half = (ci_[1] - ci_[0]) / 2
    slope = math.nan
    if len({x for x, _ in points}) >= 2:
        xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
        slope = float(np.sum((xs - xs.mean()) * (ys - ys.mean())) / np.sum((xs - xs.mean()) ** 2))
    steps = math.ceil(half / slope) if slope > 0 and math.isfinite(half) else math.nan
    needed = math.ceil(items * (half / gain) ** 2) if gain > 0 and math.isfinite(half) else math.nan
    return {"slope": slope, "half_width": half, "steps": steps, "items": needed}


def claim4_testability(
    start_comp: dict[str, np.ndarray], sizes: list[int], first_rewards: dict[str, float]
) -> dict:
    """Can the size sweep say anything? SEQ-3/4/5 learn only from groups with a success, so if
    the SFT start solves no held-out chain of size 3+, none of those arms can beat another and
    claim 4's verdict would be about noise. `start_comp` is the start's per-item composition
    reward and correctness, `sizes` each item's chain size, `first_rewards` the sweep arms'
    training reward at their first RL step."""
    size_of = np.array(sizes)
    by_size = {}
    for k in EVAL_SIZES:
        idx = size_of == k
        by_size[str(k)] = {
            "items": int(idx.sum()),
            "reward": nan_mean(start_comp["reward"][idx][None]) if idx.any() else math.nan,
            "accuracy": nan_mean(start_comp["correct"][idx][None]) if idx.any() else math.nan,
        }
    long_chains = start_comp["correct"][size_of >= 3]
    solved, n = int((long_chains == 1.0).sum()), len(long_chains)
    testable = solved > 0
    sentence = (
        f"claim 4 is testable: the SFT start solves {solved} of {n} held-out compositions of"
        " size 3+"
        if testable
        else f"claim 4 is not testable: the SFT start solves none of the {n} held-out"
        " compositions of size 3+, so the SEQ-3/4/5 arms start without a success to learn from"
    )
    return {"testable": testable, "solved": solved, "of": n, "sft_by_size": by_size,
            "first_step_train_reward": first_rewards, "sentence": sentence}  # fmt: skip
