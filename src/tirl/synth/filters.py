"""The pure checks behind the filtering stages: n-gram contamination and code limits.

- Contamination (AgentMath §3.1: N-gram filtering against the evaluation sets): texts are
  normalized (lower case, words of letters and digits only) and a problem is contaminated when
  it shares any n-gram with a benchmark problem. A text shorter than n words is one n-gram of
  its own length, so a short benchmark problem copied verbatim is still caught.
- Code limits (AgentMath §3.1: AST depth and line count against needless code): the depth of a
  block's syntax tree and its count of non-blank lines.
"""

from __future__ import annotations

import ast
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


def ast_depth(code: str) -> int:
    """Depth of the syntax tree below the module (`x = 1` is 3: Assign > Name/Constant > ctx)."""

    def depth(node: ast.AST) -> int:
        return 1 + max((depth(c) for c in ast.iter_child_nodes(node)), default=0)

    return max((depth(n) for n in ast.parse(code).body), default=0)


def code_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def code_limit_reason(code: str, max_depth: int, max_lines: int, min_depth: int = 0) -> str | None:
    """Why a code block breaks the limits, or None."""
    try:
        depth = ast_depth(code)
    except SyntaxError:
        return "syntax error"
    if depth > max_depth:
        return "AST too deep"
    if code_lines(code) > max_lines:
        return "too many lines"
    if depth < min_depth:
        return "trivial code"
    return None
