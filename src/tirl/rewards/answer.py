"""Read the final answer from the model's own tokens: the last `\\boxed{...}` or `<answer>` tag.

Invariant 3 of docs/architecture.md: the answer is read from `Trajectory.model_text` only. A
`\\boxed{}` the interpreter printed is tool output and never scores; otherwise a policy could
learn to `print("\\boxed{...}")` a guessed answer and be credited for the tool's text.

Scope: string extraction and integer normalization (AIME-style answers). Symbolic equivalence of
general math answers is `tirl.rewards.verify` (math-verify in worker processes), not here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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


def _last_boxed(text: str) -> tuple[int, str | None] | None:
    """(start, content) of the last top-level box; content None if that box never closes."""
    last: tuple[int, str | None] | None = None
    pos = 0
    while (m := _BOX_OPEN.search(text, pos)) is not None:
        end = _match_brace(text, m.end())
        if end is None:
            return m.start(), None  # the last box opened never closes: no answer
        last = (m.start(), text[m.end() : end - 1].strip())
        pos = end
    return last


def extract_boxed(text: str) -> str | None:
    """Content of the last top-level `\\boxed{...}` (or `\\boxed {...}`, `\\fbox{...}`) in `text`.

    Nested braces are matched (`\\boxed{\\frac{1}{2}}` -> `\\frac{1}{2}`). A box inside another
    box is part of the outer one's content. Returns the content stripped of surrounding
    whitespace, or None if there is no box or the last box is not closed.
    """
    found = _last_boxed(text)
    return None if found is None else found[1]


_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)


def _last_answer_tag(text: str) -> tuple[int, str | None] | None:
    """(start, answer) of the last `<answer>` tag; answer None if the tag never closes or is empty.

    A box inside the tag is unwrapped: `<answer>so \\boxed{42}</answer>` answers 42.
    """
    opens = list(_ANSWER_OPEN.finditer(text))
    if not opens:
        return None
    start = opens[-1]
    close = _ANSWER_CLOSE.search(text, start.end())
    if close is None:
        return start.start(), None  # cut off before `</answer>`: no answer
    content = text[start.end() : close.start()]
    boxed = _last_boxed(content)
    answer = boxed[1] if boxed is not None else content.strip()
    return start.start(), answer or None


_EXTRACTORS = {"boxed": _last_boxed, "answer_tag": _last_answer_tag}


def extract_answer(text: str, formats: Sequence[str] = ("boxed", "answer_tag")) -> str | None:
    """The last answer in `text` in any of `formats`: "boxed" (`\\boxed{}`, `\\fbox{}`) or
    "answer_tag" (`<answer>...</answer>`).

    "Last" is by where the answer starts, so a later box beats an earlier tag and the other way
    round. As with `extract_boxed`, an answer that is opened last but never closed (a truncated
    generation) gives None rather than an earlier answer. Pass the model's own text only.
    """
    unknown = [f for f in formats if f not in _EXTRACTORS]
    if unknown or not formats:
        raise ValueError(f"unknown answer formats {unknown}; valid: {', '.join(_EXTRACTORS)}")
    found = [hit for f in formats if (hit := _EXTRACTORS[f](text)) is not None]
    return max(found, key=lambda hit: hit[0])[1] if found else None


# An optionally signed integer, digits either plain or in comma-separated thousands groups.
_INT_RE = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")
# Whitespace between two digits: a thousands separator (`1 000`), never nothing (`1 46`).
_SPACE_BETWEEN_DIGITS = re.compile(r"(?<=\d)\s+(?=\d)")


def normalize_integer_answer(s: str | None) -> int | None:
    """Parse an integer answer leniently about formatting, strictly about value.

    Accepted: surrounding `$` (also `\\$`), whitespace around the number, thousands separators
    (`1,000`, LaTeX `1{,}000` and `1\\,000`, a space: `1 000`), one trailing period, leading
    zeros, a sign (`+5`, `-5`, Unicode minus). Anything else — decimals (`5.0`, `2.5`),
    fractions, words, badly grouped digits (`12,34` or `1 46`, which may be two answers, and
    must not read as 1234 or 146) — gives None.
    """
    if s is None:
        return None
    t = s.replace("\\$", "").replace("$", "").replace("{,}", ",").replace("\\,", ",")
    t = _SPACE_BETWEEN_DIGITS.sub(",", t)  # a separator like a comma: checked for grouping
    t = "".join(t.split()).replace("\u2212", "-")
    if t.endswith("."):
        t = t[:-1]
    if not _INT_RE.fullmatch(t):
        return None
    return int(t.replace(",", ""))


# The model's own code blocks, closed or cut off, for any tool: a fence in any language but the
# interpreter's answer (```` ```bash ````, a plugin tool's word; a bare ``` names no tool),
# AgentMath's `<code>`, and a tag written as a tag-shaped protocol writes a tool's block (`<word>`
# then a newline; `tirl.protocol`) other than the tags that hold prose: reasoning, the answer,
# the interpreter's reply. A shell block that echoes a box prints one, like Python's print.
_PROSE_TAGS = "think|answer|interpreter"
_CODE_BLOCK = re.compile(
    r"```(?!output\b)[\w.+-]+\n.*?(\n```|$)"
    r"|<code>.*?(</code>|$)"
    rf"|<(?!(?:{_PROSE_TAGS})>)(?P<tag>[\w.+-]+)>\n.*?(\n</(?P=tag)>|$)",
    re.DOTALL,
)


def prose_text(traj: Trajectory) -> str:
    """What a scorer reads: the model's text without the inside of its code blocks. Tool output
    is never part of it (architecture.md invariant 3), and `print("\\boxed{42}")` is a program that
    prints a box, not an answer."""
    return _CODE_BLOCK.sub("", traj.model_text)


def answer_from_trajectory(traj: Trajectory, formats: Sequence[str] = ("boxed",)) -> str | None:
    """The last answer in the model's prose (architecture.md invariant 3); boxed only by default.

    Tool output is never read, and neither is the inside of the model's own code blocks:
    `print("\\boxed{42}")` is a program that prints a box, not an answer. `formats` as in
    `extract_answer`; pass ("boxed", "answer_tag") for prompts that ask for `<answer>` tags.
    """
    return extract_answer(prose_text(traj), formats)
