"""Read the final answer out of a trajectory: the last `\\boxed{...}` in the model's own tokens.

Invariant (DESIGN.md 3): the answer is read from `Trajectory.model_text` only. A `\\boxed{}` the
interpreter printed is tool output and never scores; otherwise a policy could learn to
`print("\\boxed{...}")` a guessed answer and be credited for the tool's text.

Scope: string extraction and integer normalization (AIME-style answers). Symbolic equivalence of
general math answers belongs to a verifier (e.g. math-verify), not here.
"""

from __future__ import annotations

import re

from tirl.protocol.segments import Trajectory

# `\boxed{`, `\boxed {`, `\fbox{`; the trailing `{` is part of the match.
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _match_brace(text: str, start: int) -> int | None:
    """Index just past the `}` that closes the group whose content starts at `start`, or None.

    Backslash escapes (`\\{`, `\\}`, `\\\\`) are skipped, so `\\{1, 2\\}` is content, not nesting.
    """
    depth = 1
    i = start
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last top-level `\\boxed{...}` (or `\\boxed {...}`, `\\fbox{...}`) in `text`.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`). A box inside another
    box is part of the outer one's content. Returns the content stripped of surrounding
    whitespace, or None if there is no box or the last box is not closed.
    """
    answer: str | None = None
    pos = 0
    while (m := _BOX_OPEN.search(text, pos)) is not None:
        end = _match_brace(text, m.end())
        if end is None:
            return None  # the last box opened never closes: no answer
        answer = text[m.end() : end - 1].strip()
        pos = end
    return answer


# An optionally signed integer, digits either plain or in comma-separated thousands groups.
_INT_RE = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")


def normalize_integer_answer(s: str | None) -> int | None:
    """Parse an integer answer leniently about formatting, strictly about value.

    Accepted: surrounding `$` (also `\\$`), whitespace anywhere, thousands separators
    (`1,000`, LaTeX `1{,}000` and `1\\,000`), one trailing period, leading zeros, a sign
    (`+5`, `-5`, Unicode minus). Anything else — decimals (`5.0`, `2.5`), fractions, words,
    badly grouped commas (`12,34`, which may be a list of two answers) — gives None.
    """
    if s is None:
        return None
    t = s.replace("\\$", "").replace("$", "").replace("{,}", ",").replace("\\,", "")
    t = "".join(t.split()).replace("\u2212", "-")
    if t.endswith("."):
        t = t[:-1]
    if not _INT_RE.fullmatch(t):
        return None
    return int(t.replace(",", ""))


_CODE_BLOCK = re.compile(r"```python\n.*?(\n```|$)", re.DOTALL)


def answer_from_trajectory(traj: Trajectory) -> str | None:
    """The last boxed answer in the model's prose (DESIGN.md invariant 3).

    Tool output is never read, and neither is the inside of the model's own code blocks:
    `print("\\boxed{42}")` is a program that prints a box, not an answer.
    """
    return extract_boxed(_CODE_BLOCK.sub("", traj.model_text))
