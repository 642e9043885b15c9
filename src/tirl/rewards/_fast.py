"""The verifier's fast path: verdicts that need no sympy, each the one sympy would give.

Most math answers are plain numbers or small expressions. `fast_verdict` decides a pair of them
by exact value (`tirl.rewards._exact`) where math-verify plus tirl's guards (the "slow" path in
`tirl.rewards._judge`) would give the same verdict and reason, and returns None everywhere else:
the slow path then decides. It runs in the caller's process, ahead of the worker pool, with no
timeout, so everything here is string work and bounded rational arithmetic.

What math-verify does that shapes the rules (each checked by tests/test_verify_fast.py against
the slow path): it compares plain numbers as numbers, exactly or, with a decimal, to 6 decimals;
expressions by `simplify(a - b) == 0` and numerically to 15 digits (so a difference far below
the numbers involved vanishes); `x=3` against a plain answer by its value; `(a,b)` as an interval
where a < b and as a tuple otherwise; other brackets as intervals however empty (`[2,1)` equals
`[3,1)`, `[2,2]` equals 2); `1,000` as a thousand but `32, 349` and `+1,219` as lists; a bare
list, `\\{...\\}` and `a \\pm b` alike as a set ({1,1} is 1).

Not in scope: sets with decimals or equations in them, matrices beyond "not a number",
complex numbers (latex2sympy reads `i` as a symbol, inconsistently), functions, units and text.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NamedTuple

from tirl.rewards._exact import ExactValue, exact_value

_SPACE = re.compile(r"\s+")
# Spellings latex2sympy reads alike: `\left(` is `(`, `\dfrac` and `\tfrac` are `\frac`.
_SAME_MEANING = (
    (re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])"), ""),
    (re.compile(r"\\[dt]frac(?![A-Za-z])"), r"\\frac"),
    (re.compile(r"\^\{\\circ\}"), r"^\\circ"),
)
# A plain number as answers write it: an integer, a decimal, `\frac{a}{b}` (or `\frac12`) or
# `a/b`; optionally `x=` before it (a letter `_exact` reads as a variable: `e` is Euler's number,
# `i` may be imaginary), a dollar sign, a sign, and a degree sign after it. math-verify reads
# `x=3` as 3 against a plain number and drops the dollar and degree signs. Thousands grouped by
# `,`, `{,}` or `,\!` make one integer only unsigned or with a minus, without `x=` or a degree
# sign, with a first group not starting with 0 and no space after a comma (math-verify reads
# `0,111` as 0.111, and `+1,219`, `x=1,452` and `32, 349` as lists).
_NUMBER = re.compile(
    r"(?:(?P<var>[abfjknpqruvwxyz])=)?(?:\\\$)?(?P<sign>[+-]?)"
    r"(?:(?P<int>\d+|[1-9]\d{0,2}(?:(?:,|\{,\}|,\\!)\d{3})+)|(?P<dec>\d*\.\d+)"
    r"|\\frac ?(?P<num>\{[+-]?\d+\}|\d)(?P<den>\{[+-]?\d+\}|\d)|(?P<over>\d+)/(?P<under>\d+))"
    r"(?P<degrees>\^\\circ)?"
)
_ASSIGNMENT = re.compile(r"([abfjknpqruvwxyz])=(?!=)")
_SPACED_COMMA = re.compile(r"\s(?:,|\{,\})|(?:,|\{,\})\s")
_MAX_EXACT_DIGITS = 40  # longer plain integers are left to `exact_value`
_MAX_DECIMAL_DIGITS = 15  # beyond a double's precision sympy's Float rounding decides: left to it
# A unit after a number; only words math-verify is known to drop (tests/test_verify_fast.py).
_UNIT = re.compile(r"\\(?:text|mbox)\{([a-z ]+)\}(?:\^[23])?$")
_UNIT_WORDS = frozenset(
    "cm m km mm inch inches feet ft cent cents degree degrees meter meters unit units hour hours"
    " minute minutes second seconds day days mile miles year years".split()
) | {"square units"}
_THOUSANDS_COMMA = re.compile(r",\d{3}(?!\d)")
_INFINITY = {"\\infty": math.inf, "+\\infty": math.inf, "-\\infty": -math.inf}


class Scalar(NamedTuple):
    """One number or simple expression, as the fast path compares it."""

    value: ExactValue
    variable: str = ""  # the `x` of `x=3`
    plain: bool = False  # a plain number (`_NUMBER`): math-verify compares it as one number


def same_meaning(s: str) -> str:
    """`s` spelled one way: `\\left`, `\\dfrac` and whitespace LaTeX ignores taken out."""
    for pattern, replacement in _SAME_MEANING:
        s = pattern.sub(replacement, s)
    return _squeeze(s)


def _squeeze(s: str) -> str:
    """`s` with the whitespace that cannot change its meaning taken out.

    A run of spaces becomes one space between two letters or digits (`\\pi r` is not `\\pir`,
    `\\text{a b}` is not `\\text{ab}`, `1 2` is left to math-verify) and after a backslash (`\\ `
    is a command); elsewhere it is dropped, as LaTeX's math mode drops it (`x + 1` is `x+1`).
    """

    def keep(m: re.Match[str]) -> str:
        before = s[m.start() - 1] if m.start() else ""
        after = s[m.end()] if m.end() < len(s) else ""
        return " " if before == "\\" or (before.isalnum() and after.isalnum()) else ""

    return _SPACE.sub(keep, s)


def _plain_number(s: str) -> Scalar | None:
    """A plain number (`_NUMBER`) as an exact value (a decimal marked inexact), or None."""
    m = _NUMBER.fullmatch(s)
    if m is None:
        return None
    if m["dec"] is not None:
        if len(m["dec"].replace(".", "").lstrip("0")) > _MAX_DECIMAL_DIGITS:
            return None
        value, inexact = Fraction(m["dec"]), True
    elif sum(c.isdigit() for c in s) > _MAX_EXACT_DIGITS:
        return None
    elif m["int"] is not None:
        if not m["int"].isdigit() and (m["sign"] == "+" or m["var"] or m["degrees"]):
            return None
        value, inexact = Fraction(int(re.sub(r"\D", "", m["int"]))), False
    else:
        top, bottom = (m["num"], m["den"]) if m["num"] is not None else (m["over"], m["under"])
        numerator, denominator = int(top.strip("{}")), int(bottom.strip("{}"))
        if denominator == 0:  # zoo: math-verify's business (it is not equal to itself)
            return None
        value, inexact = Fraction(numerator, denominator), False
    return Scalar(ExactValue.number(-value if m["sign"] == "-" else value, inexact), m["var"], True)


def _scalar(s: str, plain: bool = True) -> Scalar | None:
    """`s` as one number or simple expression, or None (a list, a set, text, a function...).

    `plain=False` skips the plain-number reading (for an answer with `, ` in it)."""
    if plain and (number := _plain_number(s)) is not None:
        return number
    if (m := _ASSIGNMENT.match(s)) is not None:  # `y=2x+3`: math-verify compares the sides
        value = exact_value(s[m.end() :])
        return None if value is None else Scalar(value, m[1])
    value = exact_value(s)
    return None if value is None else Scalar(value)


def fast_verdict(gold: str, pred: str) -> tuple[bool, str] | None:
    """The verdict without sympy where the answers make it certain, or None.

    After `_string_steps` (which find identical answers equal), in order: two numbers or simple
    expressions are compared by their exact values (`_compare`); a number is not a tuple, an
    interval or a matrix; two tuples or intervals of the same shape are compared element by
    element; two sets (`\\{1,2\\}`, `1, 2`, `1 \\pm \\sqrt{2}`) as sets; and a number is not a
    set of two or more numbers. Anything else is left to sympy.
    """
    gold_same, pred_same = same_meaning(gold), same_meaning(pred)
    # `32, 349` is two answers to math-verify, `32,349` one number: the space is gone by now.
    g_plain, p_plain = not _SPACED_COMMA.search(gold), not _SPACED_COMMA.search(pred)
    g, p = _scalar(gold_same, g_plain), _scalar(pred_same, p_plain)
    if g is not None and p is not None:
        return _compare(g, p)
    g_unit, p_unit = _UNIT.search(gold_same), _UNIT.search(pred_same)
    if g_unit or p_unit:  # `5\text{ cm}`: math-verify drops a unit, the guards compare two
        if (g_unit and p_unit and g_unit[0] != p_unit[0]) or "\\circ" in gold + pred:
            return None  # two units (a degree sign is one too): the guards compare them
        if any(m and m[1].strip() not in _UNIT_WORDS for m in (g_unit, p_unit)):
            return None
        g = _scalar(gold_same[: g_unit.start()] if g_unit else gold_same, g_plain)
        p = _scalar(pred_same[: p_unit.start()] if p_unit else pred_same, p_plain)
        return _compare(g, p) if g is not None and p is not None else None
    g_seq, p_seq = _sequence(gold_same), _sequence(pred_same)
    if (g is not None and p_seq is not None and _is_never_a_number(p_seq)) or (
        p is not None and g_seq is not None and _is_never_a_number(g_seq)
    ):
        return False, "not equivalent"
    if g_seq is not None and p_seq is not None:
        return _compare_sequences(g_seq, p_seq)
    if g_seq is not None or p_seq is not None:
        return None
    g_set, p_set = _finite_set(gold_same), _finite_set(pred_same)
    if g_set is not None and p_set is not None:
        return _compare_sets(g_set, p_set)
    if (g is not None and p_set is not None and len(p_set) > 1) or (
        p is not None and g_set is not None and len(g_set) > 1
    ):
        return False, "not equivalent"  # two or more different numbers are not one number
    return None


def _compare(g: Scalar, p: Scalar) -> tuple[bool, str] | None:
    """Two exact values, judged as math-verify judges them, or None where it might not agree.

    Equal exact forms are "equivalent" (with a decimal, only two plain numbers of at most 15
    digits: sympy reads a decimal as a Float). Two plain integers are compared exactly, as
    math-verify compares them. Anything else is "not equivalent" only when far apart
    (`_far_apart`); closer calls are left to math-verify and the guards.
    """
    if g.variable and p.variable and g.variable != p.variable:
        return None  # `x=3` vs `y=3`: two equations (one alone is unwrapped to its value)
    inexact = g.value.inexact or p.value.inexact
    if g.plain and p.plain:
        a, b = g.value.rational, p.value.rational
        assert a is not None and b is not None
        if a == b:
            return None if inexact and (_long(a) or _long(b)) else (True, "equivalent")
        if not inexact and a.denominator == b.denominator == 1:
            return False, "not equivalent"
    elif not inexact and g.value.form == p.value.form:
        return True, "equivalent"
    return _far_apart(g.value, p.value, rounded=inexact)


def _apart(far: bool) -> tuple[bool, str] | None:
    return (False, "not equivalent") if far else None


# Differences math-verify can miss: below 1e-9 of the numbers involved (it evaluates to 15
# digits and chops what is below that precision) and, where a decimal is rounded to 6 places,
# below 2e-6.
_RELATIVE = Fraction(1, 10**9)
_ROUNDING = Fraction(2, 10**6)


def _far_apart(g: ExactValue, p: ExactValue, rounded: bool) -> tuple[bool, str] | None:
    """ "not equivalent" if the difference is beyond what math-verify's arithmetic can miss.

    math-verify compares expressions by `simplify(a - b) == 0` and numerically to 15 digits,
    where a difference far below the numbers an answer passes through vanishes
    (`-(-10^{23}+n)-3` equals `-(-10^{23}+n)-4` to it), and rounds decimals to 6 places. So
    the difference must exceed 1e-9 of the largest number either answer holds or passes
    through (and 1e-9 absolute), and 2e-6 where a decimal is involved.
    """
    difference = g.minus(p)
    d, a, b = difference.rational, g.rational, p.rational
    if d is not None and a is not None and b is not None:  # rationals: exactly, any size
        bound = max(Fraction(1), g.peak, p.peak, abs(a), abs(b)) * _RELATIVE
        return _apart(abs(d) > (max(bound, _ROUNDING) if rounded else bound))
    try:
        peak = float(max(g.peak, p.peak))
    except OverflowError:
        return None
    scale = max(1.0, peak, g.size(), p.size())
    if not math.isfinite(scale):
        return None
    bound = scale * float(_RELATIVE)
    return _apart(difference.size() > (max(bound, float(_ROUNDING)) if rounded else bound))


# A tuple or interval: its brackets ("()", "[)", ...), its elements (each a scalar or an
# infinity) and whether it is proper: True for a tuple or an interval with low < high, False
# for an empty interval or a point (`[2,1)`, `[2,2]`), None where that is not known. A matrix:
# the brackets "matrix", no elements, proper.
Sequence = tuple[str, list[Scalar | float], bool | None]


def _sequence(s: str) -> Sequence | None:
    """A tuple or interval of simple elements, or a matrix; or None.

    math-verify reads `(a,b)` as an interval where a < b and as a tuple otherwise, and other
    brackets as intervals, however empty: `[2,1)` and `[3,1)` are the same empty set to it,
    and `[2,2]` is {2}, equal to 2. Square brackets around three or more elements, sets and bare
    lists (`1,1` is 1 to math-verify) are not read.
    """
    if s.startswith("\\begin{") and s[7:].startswith(("pmatrix}", "bmatrix}")):
        return _matrix(s)
    brackets = s[:1] + s[-1:]
    if brackets not in ("()", "(]", "[)", "[]"):
        return None
    depth, parts, start = 0, [], 1
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return None  # `(1,2) \cup (3,4)`: the first bracket closes early
        elif ch == "," and depth == 1:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:-1])
    elements: list[Scalar | float] = []
    for part in parts:
        # `1{,}000` is three elements to math-verify (it turns `{,}` into a comma) and one here.
        element = _INFINITY.get(part) if "," not in part else None
        if element is None and "," not in part and (scalar := _scalar(part)) is not None:
            element = None if scalar.variable else scalar  # `(x=1, 2)`: not a plain tuple
        if element is None:
            return None
        elements.append(element)
    if len(elements) == 2 and brackets != "()":
        return brackets, elements, _low_below_high(*elements)
    if len(elements) < 2 or (len(elements) > 2 and brackets != "()"):
        return None
    return brackets, elements, True  # `(a,b)`: an interval if a < b, else a tuple


def _matrix(s: str) -> Sequence:
    """A matrix: "matrix RxC" and its elements row by row, or just "matrix" (never a number)
    where an element is not a simple scalar."""
    env = s[7:15]  # "pmatrix}" or "bmatrix}"
    if not s.endswith("\\end{" + env):
        return "matrix", [], True
    rows = [row.split("&") for row in s[15 : -len(env) - 5].split("\\\\")]
    elements: list[Scalar | float] = []
    for cell in (cell for row in rows for cell in row):
        scalar = _scalar(cell.strip())  # `\\ -1` keeps its space: `\ ` is a command
        if scalar is None or scalar.variable or len({len(row) for row in rows}) != 1:
            return "matrix", [], True
        elements.append(scalar)
    return f"matrix {len(rows)}x{len(rows[0])}", elements, True


def _low_below_high(low: Scalar | float, high: Scalar | float) -> bool | None:
    a, b = (e if isinstance(e, float) else e.value.to_float() for e in (low, high))
    if a is None or b is None:
        return None
    margin = 1e-9 * max(
        1.0, abs(a) if math.isfinite(a) else 1.0, abs(b) if math.isfinite(b) else 1.0
    )
    if b - a > margin:
        return True
    if a - b > margin:
        return False
    same = not isinstance(low, float) and not isinstance(high, float) and _compare(low, high)
    return False if same and same[0] else None  # `[2,2]`: a point


def _is_never_a_number(sequence: Sequence) -> bool:
    """Anything but `[a,a]` (which math-verify reads as {a}, equal to a) is not one number."""
    brackets, _, proper = sequence
    return proper is True or brackets != "[]"


def _compare_sequences(g: Sequence, p: Sequence) -> tuple[bool, str] | None:
    """Same brackets and length: equal if every element is; different if one element is and
    both are proper, or if just one is proper (an interval is not an empty set or a point)."""
    (g_brackets, g_elements, g_proper), (p_brackets, p_elements, p_proper) = g, p
    if g_brackets != p_brackets or len(g_elements) != len(p_elements) or not g_elements:
        return None
    verdicts = []
    for a, b in zip(g_elements, p_elements):
        if isinstance(a, float) or isinstance(b, float):
            verdicts.append((True, "equivalent") if a == b else (False, "not equivalent"))
        else:
            verdicts.append(_compare(a, b))
    if all(v is not None and v[0] for v in verdicts):
        return True, "equivalent"
    if {g_proper, p_proper} == {True, False}:
        return False, "not equivalent"
    if g_proper and p_proper and any(v is not None and not v[0] for v in verdicts):
        return False, "not equivalent"
    return None


def _long(value: Fraction) -> bool:
    """More significant digits than a decimal carries exactly through sympy's Float."""
    return max(len(str(abs(value.numerator))), len(str(value.denominator))) > _MAX_DECIMAL_DIGITS


# ---------------------------------------------------------------- sets


def _finite_set(s: str) -> dict[tuple, ExactValue] | None:
    """The elements of `\\{a, b\\}`, of a bare list `a, b` or of `a \\pm b`, by exact form; or
    None. Elements must be exact (no decimal) and plain (no `x=`); `a \\pm b` is {a+b, a-b}.

    A bare list is refused where math-verify might read it as one number: a comma before
    exactly three digits (`1,000`), `{,}` or `,\\!`.
    """
    if s.startswith("\\{") and s.endswith("\\}"):
        inner = s[2:-2]
    elif _THOUSANDS_COMMA.search(s) or "{,}" in s or ",\\!" in s:
        return None
    else:
        inner = s
    parts = _top_level_split(inner, ",")
    if parts is None or (inner is s and len(parts) < 2 and "\\pm" not in s):
        return None
    elements: dict[tuple, ExactValue] = {}
    for part in parts:
        values = _plus_minus(part)
        if values is None:
            return None
        elements.update((value.form, value) for value in values)
    return elements


def _plus_minus(s: str) -> list[ExactValue] | None:
    """[value] of one exact element, or [a+b, a-b] of `a \\pm b`; None if not exact."""
    halves = s.split("\\pm")
    if len(halves) > 2:
        return None
    values = [exact_value(h) if h else ExactValue.number(Fraction(0)) for h in halves]
    if any(v is None or v.inexact for v in values):
        return None
    if len(values) == 1:
        return values  # type: ignore[return-value]
    a, b = values
    assert a is not None and b is not None
    return [a.plus(b), a.minus(b)]


def _top_level_split(s: str, separator: str) -> list[str] | None:
    """`s` split at `separator` outside brackets; None if the brackets do not balance."""
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif ch == separator and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts if depth == 0 and all(parts) else None


def _compare_sets(
    g: dict[tuple, ExactValue], p: dict[tuple, ExactValue]
) -> tuple[bool, str] | None:
    """Equal if the sets of exact forms are; different if an element of one is far from every
    element of the other."""
    if g.keys() == p.keys():
        return True, "equivalent"
    for one, other in ((g, p), (p, g)):
        for value in one.values():
            if all(_far_apart(value, x, rounded=False) for x in other.values()):
                return False, "not equivalent"
    return None
