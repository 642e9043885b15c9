"""Evaluation metrics over plain inputs: accuracy (avg@k, pass@k, maj@k, greedy) with bootstrap
confidence intervals, CIR Table 4 code statistics, token efficiency, per-category breakdowns.

Inputs are per-item lists of per-sample results (already verified and normalized), per-response
`tirl.rewards.toolstats.tool_stats` dicts and token counts; these functions only aggregate, so
they are testable without a model. Answers are compared as given: normalize them (e.g. with
`tirl.rewards.answer.normalize_integer_answer`) before calling `maj_at_k`. Rates whose
denominator is 0 are nan, not 0 (as in `aggregate_tool_stats`); `tirl.files.json_text` writes them as null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def avg_at_k(correct: list[list[bool]]) -> float:
    """avg@k: mean over items of c_i / n_i, where item i has n_i samples of which c_i are correct.

    This is the expected single-sample accuracy (CIR and AgentMath report it as avg@k, also
    called mean@k). Items may have different n_i; each item weighs the same.
    """
    if not correct:
        raise ValueError("avg_at_k needs at least one item")
    total = 0.0
    for i, samples in enumerate(correct):
        if not samples:
            raise ValueError(f"item {i} has no samples")
        total += sum(bool(x) for x in samples) / len(samples)
    return total / len(correct)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code"):

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that k samples drawn without replacement from the n contain a correct one.
    Computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), which avoids huge binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n; got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n; got n={n}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(correct: list[list[bool]], k: int) -> float:
    """Mean over items of `pass_at_k(n_i, c_i, k)`; every item needs at least k samples."""
    if not correct:
        raise ValueError("mean_pass_at_k needs at least one item")
    return sum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct) / len(correct)


def majority_answer(answers: list[str | None]) -> str | None:
    """Most frequent non-None answer; a tie goes to the answer that occurs first. None if all
    answers are None."""
    counts: dict[str, int] = {}  # insertion order = order of first occurrence
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    best: str | None = None
    for a, c in counts.items():
        if best is None or c > counts[best]:  # strict: an earlier answer keeps a tie
            best = a
    return best


def maj_at_k(answers: list[list[str | None]], gold: list[str], k: int) -> float:
    """maj@k: share of items whose majority vote over the first k sampled answers equals gold.

    None answers (nothing extracted) do not vote. Ties are broken by the earliest first
    occurrence among the first k answers: with answers ["7", "3", "3", "7"], "7" wins.
    An item whose first k answers are all None counts as wrong. Every item needs at least k
    answers.
    """
    if len(answers) != len(gold):
        raise ValueError(f"{len(answers)} answer lists but {len(gold)} gold answers")
    if not answers:
        raise ValueError("maj_at_k needs at least one item")
    if k < 1:
        raise ValueError(f"need k >= 1; got {k}")
    hits = 0
    for i, (samples, g) in enumerate(zip(answers, gold, strict=True)):
        if len(samples) < k:
            raise ValueError(f"item {i} has {len(samples)} answers, fewer than k={k}")
        vote = majority_answer(samples[:k])
        hits += vote is not None and vote == g
    return hits / len(answers)


def greedy_accuracy(correct: Sequence[bool]) -> float:
    """Share of items whose single (greedy, temperature 0) response is correct: sum(c_i) / N.

    CIR reports MATH-500 this way. It equals `avg_at_k` with one sample per item.
    """
    if not correct:
        raise ValueError("greedy_accuracy needs at least one item")
    return sum(bool(c) for c in correct) / len(correct)


# ---------------------------------------------------------------------------------------------
# Bootstrap confidence intervals


def bootstrap_ci(
    scores: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval for the mean of per-item scores.

    Definition: with N scores s_1..s_N, draw B = `n_resamples` resamples of N item indices
    uniformly with replacement (numpy `default_rng(seed)`), take each resample's mean, and
    return the alpha/2 and 1 - alpha/2 quantiles of those B means, alpha = 1 - `confidence`
    (numpy's default linear interpolation between order statistics). Efron & Tibshirani, "An
    Introduction to the Bootstrap" (1993), ch. 13.

    Only the spread from *which items* the benchmark holds is covered; the samples drawn per
    item are held fixed. The same inputs and seed give the same interval.
    """
    if len(scores) == 0:
        raise ValueError("bootstrap_ci needs at least one score")
    if n_resamples < 1:
        raise ValueError(f"need n_resamples >= 1; got {n_resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"need 0 < confidence < 1; got {confidence}")
    values = np.asarray(scores, dtype=np.float64)  # [N]
    n = len(values)
    rng = np.random.default_rng(seed)
    chunk = max(1, 2**20 // n)  # resamples per draw, so the [chunk, N] index array stays small
    means = np.empty(n_resamples)  # [B]
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))  # [chunk, N]
        means[start:stop] = values[idx].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def avg_at_k_ci(
    correct: list[list[bool]],
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval for avg@k: `bootstrap_ci` over the per-item scores
    c_i / n_i, i.e. items are resampled with replacement and avg@k is recomputed on each
    resample (each item keeps all of its own samples)."""
    if not correct:
        raise ValueError("avg_at_k_ci needs at least one item")
    scores = []
    for i, samples in enumerate(correct):
        if not samples:
            raise ValueError(f"item {i} has no samples")
        scores.append(sum(bool(x) for x in samples) / len(samples))
    return bootstrap_ci(scores, n_resamples=n_resamples, confidence=confidence, seed=seed)


# ---------------------------------------------------------------------------------------------
# CIR Table 4: code execution split by answer correctness


def _nan_ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def code_block_stats(stats: Sequence[dict], correct: Sequence[bool]) -> dict[str, float]:
    """CIR Table 4 style code statistics, for correct and wrong responses separately.

    `stats[j]` is `tirl.rewards.toolstats.tool_stats` of response j (only `num_calls`,
    `any_error` and `last_ok` are read) and `correct[j]` whether its answer was right. A code
    block counts when it was executed: blocks refused because the interaction budget was spent
    ("skipped") are not blocks here. For each group g in correct, wrong, all:

    - `code/{g}/n`: number of responses in g.
    - `code/{g}/blocks_mean`: mean executed blocks per response, over all responses in g
      (a response without code counts 0).
    - `code/{g}/with_code_rate`: share of responses in g with at least one executed block.
    - `code/{g}/full_pass_rate`: share of responses whose executed blocks all returned "ok",
      over responses in g with at least one block (CIR "Full Pass Rate").
    - `code/{g}/error_rate`: share with at least one block that did not return "ok", over the
      same responses (CIR "Error Rate"); it is 1 - full_pass_rate.
    - `code/{g}/final_pass_rate`: share whose last executed block returned "ok", over the same
      responses (CIR "Final Pass Rate").

    CIR does not say how responses without code enter its rates; its full-pass and error rates
    sum to 100% in both rows (60.6 + 39.4, 36.0 + 64.0), which this definition reproduces. The
    three rates are nan for a group with no code at all; `blocks_mean` is nan for an empty group.
    """
    if len(stats) != len(correct):
        raise ValueError(f"{len(stats)} tool stats but {len(correct)} correctness flags")
    groups = {
        "correct": [s for s, c in zip(stats, correct) if c],
        "wrong": [s for s, c in zip(stats, correct) if not c],
        "all": list(stats),
    }
    out: dict[str, float] = {}
    for g, members in groups.items():
        with_code = [s for s in members if s["num_calls"] > 0]
        passed = sum(not s["any_error"] for s in with_code)
        out[f"code/{g}/n"] = len(members)
        out[f"code/{g}/blocks_mean"] = _nan_ratio(
            sum(s["num_calls"] for s in members), len(members)
        )
        out[f"code/{g}/with_code_rate"] = _nan_ratio(len(with_code), len(members))
        out[f"code/{g}/full_pass_rate"] = _nan_ratio(passed, len(with_code))
        out[f"code/{g}/error_rate"] = _nan_ratio(len(with_code) - passed, len(with_code))
        out[f"code/{g}/final_pass_rate"] = _nan_ratio(
            sum(bool(s["last_ok"]) for s in with_code), len(with_code)
        )
    return out


# ---------------------------------------------------------------------------------------------
# Token efficiency


def token_efficiency(correct: Sequence[bool], model_tokens: Sequence[int]) -> dict[str, float]:
    """Accuracy against response length, over responses j with correctness c_j in {0, 1} and
    t_j model tokens (what the policy generated: tool output is not counted, as in
    `tool_stats`' `model_tokens`; pass model + tool tokens to count everything).

    - `tokens/mean`: sum(t_j) / M over all M responses (CIR Table 2's "#Tokens").
    - `tokens/correct_mean`, `tokens/wrong_mean`: mean t_j over correct (wrong) responses.
    - `tokens/accuracy_per_1k`: 1000 * sum(c_j) / sum(t_j), i.e. accuracy divided by the mean
      length in thousands of tokens: correct answers per 1,000 generated tokens.
    - `tokens/per_correct`: sum(t_j) / sum(c_j), tokens spent per correct answer.

    Means over an empty group and ratios with a zero denominator are nan.
    """
    if len(correct) != len(model_tokens):
        raise ValueError(f"{len(correct)} correctness flags but {len(model_tokens)} token counts")
    if not correct:
        raise ValueError("token_efficiency needs at least one response")
    right = [t for t, c in zip(model_tokens, correct) if c]
    wrong = [t for t, c in zip(model_tokens, correct) if not c]
    total = sum(model_tokens)
    return {
        "tokens/mean": total / len(model_tokens),
        "tokens/correct_mean": _nan_ratio(sum(right), len(right)),
        "tokens/wrong_mean": _nan_ratio(sum(wrong), len(wrong)),
        "tokens/accuracy_per_1k": _nan_ratio(1000 * len(right), total),
        "tokens/per_correct": _nan_ratio(total, len(right)),
    }


# ---------------------------------------------------------------------------------------------
# Per-category breakdown

UNCATEGORIZED = "uncategorized"


def _mean(values: Sequence[Any]) -> float:
    return sum(float(v) for v in values) / len(values)


def by_category(
    values: Sequence[T],
    categories: Sequence[Hashable | None],
    metric: Callable[[list[T]], Any] = _mean,
) -> dict[Hashable, Any]:
    """A metric computed separately on each category's items.

    Items are grouped by `categories[i]` (None goes to "uncategorized"), keeping their order,
    and `metric` is applied to each group's list of values; the result maps category to value,
    sorted by category name. The default metric is the mean (values such as 0/1 correctness
    or per-item scores); pass e.g. `avg_at_k` with per-item sample lists, or `len` for counts:
    `by_category(per_item, [it.category for it in items], avg_at_k)`. Group by MATH level with
    `[it.meta["level"] for it in items]` (any hashable category is accepted).
    """
    if len(values) != len(categories):
        raise ValueError(f"{len(values)} values but {len(categories)} categories")
    groups: dict[Hashable, list[T]] = {}
    for v, c in zip(values, categories):
        groups.setdefault(UNCATEGORIZED if c is None else c, []).append(v)
    return {c: metric(groups[c]) for c in sorted(groups, key=str)}
