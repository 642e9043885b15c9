"""Exact values of simple LaTeX answers, for the verifier's fast path: no sympy, no timeout.

Most math answers are small expressions: integers, `\\frac`, square roots of rationals, `\\pi`, a
variable or two, joined by + - `\\cdot` `\\times` / and integer powers. `exact_value` reads that
subset into a canonical form, a sum of monomials `c * pi^k * sqrt(r) * x^a * y^b ...` with a
rational `c` and a squarefree `r`, so two answers with the same form are equal, and two constants
with different forms are different numbers (pi is transcendental, and the square roots of distinct
squarefree integers are linearly independent over the rationals).

It reads LaTeX the way latex2sympy does, which is not always the way LaTeX does, and refuses
(returns None) wherever the two might differ or sympy might not settle the comparison exactly as
this form does. Each refusal below names the reading that forced it:

- `2^23` is 2^23 to latex2sympy (LaTeX: 2^2 * 3), `\\frac123` is 1/23, `\\sqrt23` unclear;
- a number followed by a number is a mixed number (`2 3` is 5), and so is a number, `(2)` or
  `{2}` followed by `(` or `\\frac` (`2(3)` is 5, `1\\frac{4}{5}` is 9/5); a letter or `\\pi`
  followed by `(` may be a function (`k(2)`, `\\pi(2)`) or a product (`x(1+x)`): implicit
  multiplication by `(`, `{` or `\\frac` is refused;
- letters that mean something else: `e` (Euler's number), `i` (read as a symbol or as the
  imaginary unit depending on context), the unit letters `c d g h l m o s t` (math-verify drops a
  trailing `2s`-style unit), capitals (lower-cased by latex2sympy), two letters in a row;
- division by a sum (`\\frac{1}{1+\\sqrt{2}}`), roots of anything but a rational, non-integer
  exponents, division by zero;
- and, to keep the work small (it runs in the caller's process, without a timeout): answers
  longer than 200 characters, numbers with more than about 20,000 digits, radicands above 10^8,
  powers of sums above the 4th, and products of more than 256 pairs of terms.

Scope: the caller (`_judge._fast_verdict`) decides what a form means for a verdict; this module
only computes forms. Decimals are read exactly but marked inexact: sympy reads them as Floats.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

# A monomial: (power of pi, squarefree radicand or 1, ((variable, power), ...) sorted by name).
Monomial = tuple[int, int, tuple[tuple[str, int], ...]]
Form = dict[Monomial, Fraction]  # monomial -> nonzero rational coefficient

_ONE: Monomial = (0, 1, ())
_VARIABLES = frozenset("abfjknpqruvwxyz")  # see the module docstring for the letters left out
_MAX_DIGITS = 20_000  # a coefficient longer than this is left to sympy
_MAX_RADICAND = 10**8  # trial division up to 10^4 to find its square factors
_MAX_TERMS = 64
_MAX_PRODUCTS = 256  # monomial products in one multiplication
_MAX_CHARS = 200  # longer answers are left to sympy: the work here stays under a millisecond or so
# A number is `12`, `1.5` or `.5`; `2.` is not one (latex2sympy cannot parse `2.x`).
_TOKEN = re.compile(r"\s*(\d+\.\d+|\.\d+|\d+|\\[A-Za-z]+|[A-Za-z]|[-+*/^(){}])\s*")


class _Refused(Exception):
    """The answer is outside the subset this module reads exactly."""


@dataclass(frozen=True)
class ExactValue:
    """An answer's canonical form; `inexact` if it contains a decimal (a Float to sympy).

    `peak` is the largest coefficient met while computing it (in absolute value): sympy
    compares expressions numerically to 15 digits, so a difference far below the numbers an
    answer passes through may vanish there (`-(-10^{23}+n)-3` and `-(-10^{23}+n)-4`).
    """

    form: tuple[tuple[Monomial, Fraction], ...]  # sorted, for equality and hashing
    inexact: bool
    peak: Fraction = Fraction(0)

    @classmethod
    def number(cls, value: Fraction, inexact: bool = False) -> ExactValue:
        return cls((((_ONE, value),) if value else ()), inexact, abs(value))

    @property
    def has_variables(self) -> bool:
        return any(monomial[2] for monomial, _ in self.form)

    @property
    def rational(self) -> Fraction | None:
        """The value if it is a rational number (no pi, root or variable), else None."""
        if not self.form:
            return Fraction(0)
        if len(self.form) == 1 and self.form[0][0] == _ONE:
            return self.form[0][1]
        return None

    def to_float(self) -> float | None:
        """The value as a float, or None if it has variables or does not fit a float."""
        if self.has_variables:
            return None
        try:
            return math.fsum(float(c) * math.pi**k * math.sqrt(r) for (k, r, _), c in self.form)
        except OverflowError:
            return None

    def size(self) -> float:
        """The sum of |numeric coefficient| over the variable parts (the absolute value for a
        constant): pi and roots included, as a float (inf if beyond)."""
        groups: dict[tuple[tuple[str, int], ...], list[float]] = {}
        try:
            for (k, r, variables), c in self.form:
                groups.setdefault(variables, []).append(float(c) * math.pi**k * math.sqrt(r))
        except OverflowError:
            return math.inf
        return math.fsum(abs(math.fsum(terms)) for terms in groups.values())

    def plus(self, other: ExactValue) -> ExactValue:
        form = _add(dict(self.form), dict(other.form))
        peak = max(self.peak, other.peak)
        return ExactValue(tuple(sorted(form.items())), self.inexact or other.inexact, peak)

    def minus(self, other: ExactValue) -> ExactValue:
        form = _add(dict(self.form), dict(other.form), -1)
        peak = max(self.peak, other.peak)
        return ExactValue(tuple(sorted(form.items())), self.inexact or other.inexact, peak)


def exact_value(s: str) -> ExactValue | None:
    """The canonical form of the LaTeX answer `s`, or None where this module cannot be sure."""
    if len(s) > _MAX_CHARS:
        return None
    tokens, pos = [], 0
    while pos < len(s):
        if (m := _TOKEN.match(s, pos)) is None:
            return None  # a character outside the subset
        tokens.append(m[1])
        pos = m.end()
    if not tokens:
        return None
    parser = _Parser(tokens)
    try:
        form = parser.expression()
        if parser.pos != len(parser.tokens):
            return None
    except (_Refused, ZeroDivisionError, OverflowError, ValueError, RecursionError):
        return None
    return ExactValue(tuple(sorted(form.items())), parser.inexact, parser.peak)


# ---------------------------------------------------------------- arithmetic on forms


def _add(a: Form, b: Form, sign: int = 1) -> Form:
    out = dict(a)
    for monomial, c in b.items():
        total = out.get(monomial, 0) + sign * c
        if total:
            out[monomial] = total
        else:
            out.pop(monomial, None)
    return out


def _times_monomial(a: Monomial, b: Monomial) -> tuple[Fraction, Monomial]:
    (pa, ra, va), (pb, rb, vb) = a, b
    g = math.gcd(ra, rb)  # sqrt(ra) * sqrt(rb) = g * sqrt(ra/g * rb/g), both squarefree
    powers = dict(va)
    for name, k in vb:
        powers[name] = powers.get(name, 0) + k
    variables = tuple(sorted((n, k) for n, k in powers.items() if k))
    return Fraction(g), (pa + pb, (ra // g) * (rb // g), variables)


def _mul(a: Form, b: Form) -> Form:
    if len(a) * len(b) > _MAX_PRODUCTS:
        raise _Refused("too many terms")
    out: Form = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            factor, monomial = _times_monomial(ma, mb)
            out = _add(out, {monomial: _checked(ca * cb * factor)})
    if len(out) > _MAX_TERMS:
        raise _Refused("too many terms")
    return out


def _inverse(a: Form) -> Form:
    if len(a) != 1:
        raise _Refused("division by a sum or by zero")
    (((pi, root, variables), c),) = a.items()
    return {(-pi, root, tuple((n, -k) for n, k in variables)): 1 / (c * root)}


def _power(a: Form, n: int) -> Form:
    if n < 0:
        return _power(_inverse(a), -n)
    if n == 0:
        if not a:
            raise _Refused("0^0")
        return {_ONE: Fraction(1)}
    if len(a) == 1:  # a monomial: the coefficient's size bounds the work
        (((pi, root, variables), c),) = a.items()
        digits = max(len(str(c.numerator)), len(str(c.denominator)), len(str(root)))
        if digits * n > _MAX_DIGITS:
            raise _Refused("too large")
        half, odd = divmod(n, 2)
        return {
            (pi * n, root if odd else 1, tuple((v, k * n) for v, k in variables)): c**n
            * Fraction(root) ** half
        }
    if n > 4:
        raise _Refused("a high power of a sum")
    out = a
    for _ in range(n - 1):
        out = _mul(out, a)
    return out


def _sqrt(a: Form) -> Form:
    """sqrt of a nonnegative rational, as (s/q) * sqrt(m) with m squarefree."""
    if not a:
        return {}
    if len(a) != 1 or _ONE not in a or a[_ONE] < 0:
        raise _Refused("root of something other than a nonnegative rational")
    c = a[_ONE]
    n = c.numerator * c.denominator  # sqrt(p/q) = sqrt(p*q) / q
    if n > _MAX_RADICAND:
        raise _Refused("radicand too large to factor")
    square, free = 1, 1
    p = 2
    while p * p <= n:
        while n % (p * p) == 0:
            n //= p * p
            square *= p
        if n % p == 0:
            n //= p
            free *= p
        p += 1
    free *= n
    return {(0, free, ()): Fraction(square, c.denominator)}


def _checked(c: Fraction) -> Fraction:
    if max(c.numerator.bit_length(), c.denominator.bit_length()) > _MAX_DIGITS * 3.33:
        raise _Refused("too large")
    return c


def _constant(c: Fraction) -> Form:
    return {_ONE: c} if c else {}


# ---------------------------------------------------------------- the parser


class _Parser:
    """Recursive descent over the tokens, with latex2sympy's precedences.

    expression := [+-] term ([+-] term)*
    term       := product ((\\cdot | \\times | * | /) product)*
    product    := power power*         (implicit multiplication binds tighter than /:
                                        latex2sympy reads `1/2x` as 1/(2x))
    power      := atom [^ exponent]
    atom       := number | variable | \\pi | \\sqrt arg | \\frac arg arg | (expr) | {expr}
    """

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.inexact = False
        self.depth = 0
        self.peak = Fraction(0)  # the largest coefficient met so far (absolute)

    def seen(self, form: Form) -> Form:
        if form:
            self.peak = max(self.peak, max(abs(c) for c in form.values()))
        return form

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Refused(f"expected {expected!r}")
        self.pos += 1
        return token

    def expression(self) -> Form:
        self.depth += 1
        if self.depth > 20:
            raise _Refused("nested too deeply")
        sign = -1 if self.peek() == "-" else 1
        if self.peek() in ("+", "-"):
            self.take()
        out = _mul(_constant(Fraction(sign)), self.term())
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            out = _add(out, self.term(), sign)
        self.depth -= 1
        return self.seen(out)

    def term(self) -> Form:
        out = self.product()
        while self.peek() in ("\\cdot", "\\times", "*", "/"):
            if self.take() == "/":
                out = _mul(out, _inverse(self.product()))
            else:
                out = _mul(out, self.product())
        return self.seen(out)

    def product(self) -> Form:
        out = self.power()
        while (token := self.peek()) is not None and token not in _STOPS:
            if token[0].isdigit() or token[0] == ".":
                raise _Refused("a number after a factor")  # `x2`, `2 3`
            if token in ("(", "{", "\\frac"):
                # `2(3)`, `(2)(3)` and `{2}(3)` are 5, `1\frac{4}{5}` is 9/5, `k(2)` and
                # `\pi(2)` are functions applied to 2, `x(1+x)` is a product: not guessed.
                raise _Refused("implicit multiplication by a bracket or a fraction")
            out = _mul(out, self.power())
        return self.seen(out)

    def power(self) -> Form:
        base = self.atom()
        if self.peek() != "^":
            return base
        self.take()
        if self.peek() == "{":
            exponent = self.braced()
        else:
            token = self.take()
            if not (token.isdigit() and len(token) == 1):
                raise _Refused("an unbraced exponent other than one digit")  # `2^23`
            exponent = _constant(Fraction(int(token)))
        if exponent and (len(exponent) != 1 or _ONE not in exponent):
            raise _Refused("a non-constant exponent")
        value = exponent.get(_ONE, Fraction(0))
        if value.denominator != 1:
            raise _Refused("a fractional exponent")
        return self.seen(_power(base, int(value)))

    def atom(self) -> Form:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            if "." in token:
                self.inexact = True
            return self.seen(_constant(Fraction(token)))
        if len(token) == 1 and token.isalpha():
            if token not in _VARIABLES:
                raise _Refused(f"the letter {token!r}")
            if self.peek() is not None and self.peek().isalpha() and len(self.peek()) == 1:
                raise _Refused("two letters in a row")
            return {(0, 1, ((token, 1),)): Fraction(1)}
        if token == "\\pi":
            return {(1, 1, ()): Fraction(1)}
        if token == "\\sqrt":
            if self.peek() == "[":
                raise _Refused("an n-th root")
            return self.seen(_sqrt(self.argument(single=True)))
        if token == "\\frac":
            if self.peek() is not None and self.peek().isdigit() and len(self.peek()) == 2:
                digits = self.take()  # `\frac12`: latex2sympy reads two digits as 1/2
                return self.seen(_constant(Fraction(int(digits[0]), int(digits[1]))))
            numerator = self.argument(single=True)
            return self.seen(_mul(numerator, _inverse(self.argument(single=True))))
        if token == "(":
            inner = self.expression()
            self.take(")")
            return inner
        if token == "{":
            self.pos -= 1
            return self.braced()
        raise _Refused(f"the token {token!r}")

    def braced(self) -> Form:
        self.take("{")
        inner = self.expression()
        self.take("}")
        return inner

    def argument(self, single: bool) -> Form:
        """A command's argument: `{expr}` or one digit (`\\sqrt2`, `\\frac34`)."""
        if self.peek() == "{":
            return self.braced()
        token = self.take()
        if not (token.isdigit() and len(token) == 1):
            raise _Refused("an unbraced argument other than one digit")  # `\sqrt23`
        return _constant(Fraction(int(token)))


_STOPS = frozenset({"+", "-", "\\cdot", "\\times", "*", "/", ")", "}", "^"})
