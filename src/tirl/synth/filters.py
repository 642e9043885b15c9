"""The pure checks behind the filtering stages: n-gram contamination and code limits.

- Contamination (AgentMath §3.1: N-gram filtering against the evaluation sets): the index lives
  in `tirl.tasks.contamination` (the `dataset` task source uses it too) and is re-exported here.
- Code limits (AgentMath §3.1: AST depth and line count against needless code): the depth of a
  block's syntax tree and its count of non-blank lines.
"""

from __future__ import annotations

import ast

from tirl.tasks.contamination import ContaminationIndex, ngrams, normalize_words  # noqa: F401


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
