"""Sampling-based accuracy metrics: avg@k, pass@k, maj@k.

Inputs are per-item lists of per-sample results (already verified and normalized); these
functions only aggregate. Answers are compared as given: normalize them (e.g. with
`tirl.rewards.answer.normalize_integer_answer`) before calling `maj_at_k`.
"""

from __future__ import annotations


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
