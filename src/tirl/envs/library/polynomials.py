"""RACES atomic environments: polynomials with integer coefficients.

A polynomial is a tuple of integer coefficients from the highest power down with no leading
zero, (0,) being the zero polynomial (see `tirl.envs.types.Poly`): (1, -3, 2) is x^2 - 3x + 2.
Every mapper that can cancel its top terms (adding, negating odd powers, reversing) strips the
leading zeros it creates, so each output is again a valid polynomial.

Same-type algebra (derivative, products, composition, shifts, remainders) sits next to
evaluations and measurements (-> int), coefficient and value lists (-> int_list), root sets
(-> int_set) and a test (-> bool); `from_roots` goes the other way, from an int_list to a
polynomial. Input constraints bound degree and coefficients so that every result stays exact,
fast and short: e.g. squaring takes degree at most 6 and coefficients at most 1000.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Int, IntList, IntSet, Poly

ANY = Poly(max_coef=10**6)  # degree <= 12
SMALL = Poly(max_degree=6, max_coef=1000)
ROOTS = Poly(max_coef=10**4)  # integer_roots tries every divisor of the lowest coefficient


def _with_integer_roots(rng: random.Random, level: int):
    """Products of a few linear factors (x - r), times a constant and sometimes x^2 + c, so that
    integer roots exist and repeat; sometimes a plain random polynomial. Redrawn until the
    coefficients fit the input type."""
    while True:
        if rng.random() < 0.2:
            return ROOTS.sample(rng, level)
        coefs = [rng.choice([1, -1, 2, -3])]
        factors = [
            (1, -rng.randint(-2 - level, 2 + level)) for _ in range(rng.randint(1, 1 + level))
        ]
        if rng.random() < 0.3:
            factors.append((1, 0, rng.randint(1, 5)))  # x^2 + c, no real roots
        for f in factors:
            out = [0] * (len(coefs) + len(f) - 1)
            for i, a in enumerate(coefs):
                for j, b in enumerate(f):
                    out[i + j] += a * b
            coefs = out
        if ROOTS.check(tuple(coefs)) is None:
            return tuple(coefs)


def _times_power_of_x(rng: random.Random, level: int):
    """Random polynomials multiplied by x^k for k = 0..3 (trailing zero coefficients)."""
    return ANY.sample(rng, level) + (0,) * rng.randint(0, 3)


def _with_common_factor(rng: random.Random, level: int):
    """Random polynomials multiplied by a common factor, often negative."""
    return tuple(c * rng.choice([1, 2, 3, 6, -1, -2, -5]) for c in ANY.sample(rng, level))


def _degree_two_up(rng: random.Random, level: int):
    """Random polynomials of degree 2 to 1 + 3 * level."""
    p = ANY.sample(rng, level)
    return p + tuple(rng.randint(-3 * level, 3 * level) for _ in range(rng.randint(1, 2 * level)))


def _monic_or_not(rng: random.Random, level: int):
    p = ANY.sample(rng, level)
    return (rng.choice([1, 1, -1]),) + p[1:] if rng.random() < 0.5 else p


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Differentiate the input polynomial; the derivative of a constant is the zero polynomial [0].",
)
def derivative(p):
    d = len(p) - 1
    if d == 0:
        return (0,)
    return tuple(c * (d - i) for i, c in enumerate(p[:-1]))


@atomic("polynomials", ANY, Int(), "Evaluate the input polynomial at x = 2.")
def evaluate_at_two(p):
    v = 0
    for c in p:
        v = 2 * v + c
    return v


@atomic("polynomials", ANY, Int(), "Evaluate the input polynomial at x = -1.")
def evaluate_at_minus_one(p):
    v = 0
    for c in p:
        v = -v + c
    return v


@atomic(
    "polynomials",
    Poly(max_degree=11, max_coef=10**6),
    Poly(),
    "Multiply the input polynomial by (x + 1).",
)
def times_x_plus_one(p):
    if p == (0,):
        return (0,)
    return tuple(a + b for a, b in zip(p + (0,), (0,) + p))


@atomic("polynomials", SMALL, Poly(), "Square the input polynomial (multiply it by itself).")
def square(p):
    out = [0] * (2 * len(p) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(p):
            out[i + j] += a * b
    return tuple(out)


@atomic("polynomials", ANY, Poly(), "Add x^2 to the input polynomial.")
def add_x_squared(p):
    coefs = [0] * max(0, 3 - len(p)) + list(p)
    coefs[-3] += 1
    while len(coefs) > 1 and coefs[0] == 0:
        coefs.pop(0)
    return tuple(coefs)


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Give the degree of the input polynomial (its highest power with a nonzero coefficient); "
    "constants, including the zero polynomial, have degree 0.",
)
def degree(p):
    return len(p) - 1


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Give the sum of the coefficients of the input polynomial.",
)
def coefficient_sum(p):
    return sum(p)


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Give the leading coefficient of the input polynomial (the coefficient of its highest power; "
    "0 for the zero polynomial).",
)
def leading_coefficient(p):
    return p[0]


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Give the constant term of the input polynomial (its value at x = 0).",
)
def constant_term(p):
    return p[-1]


@atomic(
    "polynomials",
    Poly(max_degree=8, max_coef=1000),
    Poly(),
    "Substitute x + 1 for x in the input polynomial p: give p(x + 1), expanded.",
)
def shift_by_one(p):
    out = [0]
    for c in p:  # Horner: out = out * (x + 1) + c
        out = [a + b for a, b in zip(out + [0], [0] + out)]
        out[-1] += c
    while len(out) > 1 and out[0] == 0:
        out.pop(0)
    return tuple(out)


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Give the content of the input polynomial: the greatest common divisor of the absolute values "
    "of its coefficients (0 for the zero polynomial).",
    sampler=_with_common_factor,
)
def content(p):
    from math import gcd

    g = 0
    for c in p:
        g = gcd(g, c)
    return g


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Give the primitive part of the input polynomial: divide every coefficient by the greatest "
    "common divisor of their absolute values, then negate all of them if the leading coefficient "
    "is negative (the zero polynomial stays [0]).",
    sampler=_with_common_factor,
)
def primitive_part(p):
    from math import gcd

    g = 0
    for c in p:
        g = gcd(g, c)
    if g == 0:
        return (0,)
    if p[0] < 0:
        g = -g
    return tuple(c // g for c in p)


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Reverse the order of the coefficients of the input polynomial, then drop the leading zeros "
    "this creates when the constant term is 0 (the zero polynomial stays [0]).",
)
def reverse_coefficients(p):
    out = list(p[::-1])
    while len(out) > 1 and out[0] == 0:
        out.pop(0)
    return tuple(out)


@atomic(
    "polynomials",
    ROOTS,
    IntSet(),
    "Give the set of distinct integer roots of the input polynomial (integers x with p(x) = 0); "
    "the zero polynomial counts as having none.",
    sampler=_with_integer_roots,
)
def integer_roots(p):
    if p == (0,):
        return frozenset()
    coefs = list(p)
    roots = set()
    while coefs[-1] == 0:  # x divides p: 0 is a root
        roots.add(0)
        coefs.pop()
    c = abs(coefs[-1])
    for d in range(1, c + 1):
        if c % d == 0:
            for x in (d, -d):
                v = 0
                for a in coefs:
                    v = v * x + a
                if v == 0:
                    roots.add(x)
    return frozenset(roots)


@atomic(
    "polynomials",
    ANY,
    IntList(),
    "List the coefficients of the input polynomial from the constant term up to the highest "
    "power (lowest power first).",
)
def coefficients_lowest_first(p):
    return tuple(p[::-1])


@atomic(
    "polynomials",
    IntList(max_len=6, lo=-9, hi=9),
    Poly(),
    "Give the monic polynomial whose roots are exactly the integers of the input list, counted "
    "with repetition: the product of (x - r) over the list (the empty product is [1]).",
)
def from_roots(roots):
    out = [1]
    for r in roots:
        out = [a - r * b for a, b in zip(out + [0], [0] + out)]
    return tuple(out)


@atomic(
    "polynomials", ANY, Poly(), "Negate the input polynomial: flip the sign of every coefficient."
)
def negate(p):
    return tuple(-c for c in p)


@atomic(
    "polynomials",
    Poly(max_degree=11, max_coef=10**6),
    Poly(),
    "Multiply the input polynomial by x (the zero polynomial stays [0]).",
)
def times_x(p):
    return (0,) if p == (0,) else p + (0,)


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Divide the input polynomial by (x - 1) and give the quotient, dropping the remainder (a "
    "constant's quotient is [0]).",
)
def quotient_by_x_minus_one(p):
    if len(p) == 1:
        return (0,)
    out, acc = [], 0
    for c in p[:-1]:  # synthetic division by x - 1
        acc = acc + c
        out.append(acc)
    return tuple(out)


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Give the remainder of the input polynomial modulo x^2 + 1 (replace x^2 by -1 repeatedly); "
    "it has degree at most 1.",
    sampler=_degree_two_up,
)
def remainder_mod_x_squared_plus_one(p):
    a = b = 0  # remainder a*x + b
    for k, c in enumerate(p[::-1]):  # x^k = (-1)^(k//2) * x^(k % 2)
        sign = -1 if (k // 2) % 2 else 1
        if k % 2:
            a += sign * c
        else:
            b += sign * c
    return (a, b) if a else (b,)


@atomic(
    "polynomials",
    Poly(max_degree=6, max_coef=10**6),
    Poly(),
    "Substitute x^2 for x in the input polynomial p: give p(x^2).",
)
def substitute_x_squared(p):
    out = []
    for c in p:
        out += [c, 0]
    return tuple(out[:-1])


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Substitute -x for x in the input polynomial p: give p(-x) (the signs of the odd-power "
    "coefficients flip).",
)
def substitute_minus_x(p):
    d = len(p) - 1
    return tuple(-c if (d - i) % 2 else c for i, c in enumerate(p))


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Keep only the even-power terms of the input polynomial (x^0, x^2, x^4, ...), dropping the "
    "odd-power ones; drop any leading zeros this leaves (the result may be [0]).",
)
def even_part(p):
    d = len(p) - 1
    out = [0 if (d - i) % 2 else c for i, c in enumerate(p)]
    while len(out) > 1 and out[0] == 0:
        out.pop(0)
    return tuple(out)


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Count the sign changes in the coefficient sequence of the input polynomial, read from the "
    "highest power down with zero coefficients skipped.",
)
def sign_changes(p):
    signs = [c > 0 for c in p if c]
    return sum(1 for a, b in zip(signs, signs[1:]) if a != b)


@atomic(
    "polynomials",
    ANY,
    Int(),
    "Count the nonzero coefficients (terms) of the input polynomial.",
)
def term_count(p):
    return sum(1 for c in p if c)


@atomic(
    "polynomials",
    ANY,
    Bool(),
    "Decide whether the input polynomial is monic: its leading coefficient is exactly 1.",
    sampler=_monic_or_not,
)
def is_monic(p):
    return p[0] == 1


@atomic(
    "polynomials",
    SMALL,
    IntList(),
    "List the values of the input polynomial at x = 0, 1, 2, 3 and 4, in that order.",
)
def values_at_zero_to_four(p):
    out = []
    for x in range(5):
        v = 0
        for c in p:
            v = v * x + c
        out.append(v)
    return tuple(out)


@atomic(
    "polynomials",
    ANY,
    Poly(),
    "Divide the input polynomial by the highest power of x that divides it: drop its trailing "
    "zero coefficients (the zero polynomial stays [0]).",
    sampler=_times_power_of_x,
)
def strip_factors_of_x(p):
    if p == (0,):
        return (0,)
    out = list(p)
    while out[-1] == 0:
        out.pop()
    return tuple(out)
