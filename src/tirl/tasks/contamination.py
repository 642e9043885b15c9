"""N-gram contamination against evaluation sets (AgentMath §3.1: N-gram filtering).

Texts are normalized (lower case, words of letters and digits only) and a problem is
contaminated when it shares any n-gram with a benchmark problem. A text shorter than n words is
one n-gram of its own length, so a short benchmark problem copied verbatim is still caught.
Used by the `dataset` task source (its `decontaminate` key) and by `tirl synth`'s filter stage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_WORD = re.compile(r"[a-z0-9]+")


def normalize_words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = normalize_words(text)
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class ContaminationIndex:
    """The n-grams of a set of benchmark problems."""

    def __init__(self, problems: Iterable[str], n: int = 13) -> None:
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self.short: set[tuple[str, ...]] = set()  # whole texts shorter than n words
        for p in problems:
            for g in ngrams(p, n):
                (self.grams if len(g) == n else self.short).add(g)

    def contaminated(self, text: str) -> bool:
        words = tuple(normalize_words(text))
        if not words:
            return False
        if any(words[i : i + len(s)] == s for s in self.short for i in range(len(words))):
            return True
        return bool(ngrams(text, self.n) & self.grams)
