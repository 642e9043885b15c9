"""Answers written the way code prints them, rewritten into the LaTeX the judge reads.

In code-integrated reasoning the model often copies the interpreter's output into its answer:
sympy's and Python's notation (`x**2`, `3*sqrt(3)`, `pi`, `oo`, `Rational(1, 3)`, `exp(2)`,
`[3, 1]`) and repeating decimals written by hand (`0.\\overline{3}`, `0.(3)`, `0.1\\dot{6}`).
`from_code_notation` rewrites them; it is applied to both answers before any comparison
(`tirl.rewards._judge._prepare`). Each rule only fires on text no LaTeX answer means otherwise,
so it cannot change what a LaTeX answer says:

- `a**b` (never LaTeX) -> `a^{b}`, the exponent an atom, a signed atom or a bracketed group;
- the words `pi` and `oo` as sympy prints them (not after a backslash or inside a longer
  word) -> `\\pi`, `\\infty`; `E` -> `e` only in a product written with `*` (`3*E`):
  alone, `E` may be a point or an option's letter;
- `Rational(p, q)` -> `\\frac{p}{q}`; `exp(x)` (not `\\exp`) -> `e^{x}`;
- a Python list: one element -> the element; three or more -> a tuple; two only when they
  cannot be a closed interval's endpoints (numbers in decreasing order), since `[1, 2]` is an
  interval in LaTeX;
- a whole answer that is a repeating decimal -> its exact fraction.

Not covered: matrices as sympy prints them (`Matrix([[1, 2], [3, 4]])`), complex numbers in
sympy's `I`, `zoo`, `nan`, Python's `True`/`False`.
"""

from __future__ import annotations

import re
from fractions import Fraction

# An exponent after `**`: a signed number or name, or a bracketed group (matched by `_group`).
_ATOM = r"[+-]?(?:\d+(?:\.\d+)?|[A-Za-z_]\w*)"
_POWER = re.compile(r"\*\*\s*")
_WORDS = {"pi": r"\pi", "oo": r"\infty", "E": "e"}
_WORD = re.compile(r"(?<![\\A-Za-z_])(pi|oo)(?![A-Za-z_(])")
_CODE_WORD = re.compile(r"(?<![\\A-Za-z_])(pi|oo|E)(?![A-Za-z_(])")
_RATIONAL = re.compile(r"Rational\(\s*([+-]?\d+)\s*,\s*([+-]?\d+)\s*\)")
_EXP = re.compile(r"(?<![\\A-Za-z_])exp\(")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
# `0.(3)`, `1.2(34)`, `0.\overline{3}`, `0.8\overline{3}`, `0.\dot{3}`, `0.1\dot{6}`
_REPEATING = re.compile(r"([+-]?)(\d*)\.(\d*)(?:\((\d+)\)|\\overline\{(\d+)\}|\\dot\{?(\d)\}?)")


def from_code_notation(s: str) -> str:
    """`s` with code notation rewritten into LaTeX (module doc); unchanged otherwise."""
    if (exact := repeating_decimal(s)) is not None:
        return exact
    if "**" in s:
        s = _powers(s)
    if "Rational(" in s:
        s = _RATIONAL.sub(lambda m: f"\\frac{{{m[1]}}}{{{m[2]}}}", s)
    if "exp(" in s:
        s = _calls(s, _EXP, lambda inner: f"e^{{{inner}}}")
    s = (_CODE_WORD if "*" in s else _WORD).sub(lambda m: _WORDS[m[1]], s)
    return _python_list(s)


def repeating_decimal(s: str) -> str | None:
    """`\\frac{p}{q}` of a whole answer written as a repeating decimal, else None."""
    m = _REPEATING.fullmatch(s.replace(" ", ""))
    if m is None:
        return None
    sign, whole, fixed = m[1], m[2] or "0", m[3]
    period = m[4] or m[5] or m[6]
    value = int(whole) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    if sign == "-":
        value = -value
    if value.denominator == 1:
        return str(value.numerator)
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _group_end(s: str, start: int) -> int | None:
    """The index just past the bracket group opening at `start`, or None if unclosed."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for i in range(start, len(s)):
        if s[i] in pairs:
            stack.append(pairs[s[i]])
        elif stack and s[i] == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
    return None


def _powers(s: str) -> str:
    out, pos = [], 0
    while (m := _POWER.search(s, pos)) is not None:
        out.append(s[pos : m.start()])
        rest = m.end()
        if rest < len(s) and s[rest] in "([{":
            end = _group_end(s, rest)
            if end is None:
                return s  # unbalanced: leave it to the parser as it is
            exponent = s[rest:end]
        elif (atom := re.match(_ATOM, s[rest:])) is not None:
            end, exponent = rest + atom.end(), atom[0]
        else:
            return s
        out.append(f"^{{{exponent}}}")
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _calls(s: str, name: re.Pattern[str], render) -> str:
    """`s` with each call `name(inner)` replaced by `render(inner)` (balanced brackets)."""
    out, pos = [], 0
    while (m := name.search(s, pos)) is not None:
        end = _group_end(s, m.end() - 1)
        if end is None:
            return s
        out.append(s[pos : m.start()] + render(s[m.end() : end - 1]))
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _python_list(s: str) -> str:
    t = s.strip()
    if not (t.startswith("[") and t.endswith("]")) or _group_end(t, 0) != len(t):
        return s
    items = _split_top(t[1:-1])
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        a, b = items
        if not (_NUMBER.fullmatch(a) and _NUMBER.fullmatch(b) and float(a) > float(b)):
            return s  # may be the closed interval [a, b]
    return "(" + ", ".join(items) + ")"


def _split_top(s: str) -> list[str]:
    """`s` split at its top-level commas, each part stripped."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    parts.append(s[start:].strip())
    return parts
