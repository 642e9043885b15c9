"""RACES atomic environments: sets (operations on and summaries of an int_set).

Same-type environments combine the input with a fixed set named in the instruction, add or
drop elements, or map every element; cross-type ones summarize the set (int, bool, rational) or
re-read it as another kind (int_list, str, poly, graph).

Input limits: sets have at most 30 elements of absolute value at most 10**6, tighter where an
environment needs it (subset sums, pairwise sums, squares, bitmasks, letters, polynomial roots,
graphs). Most environments use a sampler that draws elements from a small window around 0..20,
so that the fixed sets the instructions name actually meet the input.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Graph, Int, IntList, IntSet, Poly, Rational, Str

BIG = 10**6
SET = IntSet(min_size=0, max_size=30, lo=-BIG, hi=BIG)
NONEMPTY = IntSet(min_size=1, max_size=30, lo=-BIG, hi=BIG)


def _draw(rng: random.Random, size: int, lo: int, hi: int) -> frozenset[int]:
    """`size` distinct integers from [lo, hi] (which must hold at least `size`)."""
    return frozenset(rng.sample(range(lo, hi + 1), size))


def _near_fixed(rng: random.Random, level: int) -> frozenset[int]:
    """1..3+3*level elements from about -3*level..20+3*level, where the fixed sets live."""
    return _draw(rng, rng.randint(1, 3 + 3 * level), -3 * level, 20 + 3 * level)


def _near_squares(rng: random.Random, level: int) -> frozenset[int]:
    """3..3+3*level elements from -2..17, so that they often include a square."""
    return _draw(rng, rng.randint(3, 3 + 3 * level), -2, 17)


def _maybe_pair_to_10(rng: random.Random, level: int) -> frozenset[int]:
    """A set near 0..20 that, half the time, holds some a and 10 - a with a != 5."""
    s = _near_fixed(rng, level)
    if rng.random() < 0.5:
        a = rng.choice([a for a in range(-3 * level, 11 + 3 * level) if a != 5])
        s = s - {max(s)} | {a, 10 - a} if len(s) > 1 else s | {a, 10 - a}
    return s


def _at_least_two(rng: random.Random, level: int) -> frozenset[int]:
    return _draw(rng, rng.randint(2, 3 + 3 * level), -5 * level, 20 + 5 * level)


def _digits_or_not(rng: random.Random, level: int) -> frozenset[int]:
    """Half the time a subset of 0..9, otherwise a set that usually reaches outside it."""
    if rng.random() < 0.5:
        return _draw(rng, rng.randint(1, 2 + 2 * level), 0, 9)
    return _draw(rng, rng.randint(1, 2 + 2 * level), -2, 11 + 3 * level)


def _small_few(rng: random.Random, level: int) -> frozenset[int]:
    """At most 8 elements of absolute value at most 10**level (pairwise and subset sums)."""
    bound = 10**level
    return _draw(rng, rng.randint(1, min(8, 2 + 2 * level)), -bound, bound)


def _positive_small(rng: random.Random, level: int) -> frozenset[int]:
    """At most 12 elements from 1..12*level, so that divisibility is common."""
    return _draw(rng, rng.randint(1, min(12, 3 + 3 * level)), 1, 12 * level)


# ---- combine with a fixed set ----------------------------------------------------------------


@atomic(
    "sets",
    SET,
    IntSet(max_size=36, lo=-BIG, hi=BIG),
    "Take the union of the input set with the fixed set {2, 3, 5, 7, 11, 13}.",
    sampler=_near_fixed,
)
def union_small_primes(s):
    return frozenset(s) | {2, 3, 5, 7, 11, 13}


@atomic(
    "sets",
    SET,
    IntSet(max_size=11, lo=0, hi=20),
    "Take the intersection of the input set with the fixed set of even numbers"
    " {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20}.",
    sampler=_near_fixed,
)
def intersect_small_evens(s):
    return frozenset(s) & {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20}


@atomic(
    "sets",
    SET,
    SET,
    "Remove from the input set every element of the fixed set {0, 1, 4, 9, 16, 25}.",
    sampler=_near_squares,
)
def remove_squares(s):
    return frozenset(s) - {0, 1, 4, 9, 16, 25}


@atomic(
    "sets",
    SET,
    IntSet(max_size=35, lo=-BIG, hi=BIG),
    "Take the symmetric difference of the input set with the fixed set {0, 5, 10, 15, 20}:"
    " remove those five numbers that are in the input set and add those that are not.",
    sampler=_near_fixed,
)
def toggle_multiples_of_5(s):
    return frozenset(s) ^ {0, 5, 10, 15, 20}


@atomic(
    "sets",
    SET,
    IntSet(max_size=31, lo=-BIG, hi=BIG),
    "Add the number 7 to the input set (if 7 is already there, the set stays the same).",
    sampler=_near_fixed,
)
def insert_7(s):
    return frozenset(s) | {7}


@atomic(
    "sets",
    IntSet(min_size=0, max_size=21, lo=-BIG, hi=BIG),
    IntSet(max_size=21, lo=0, hi=20),
    "Give the set of the numbers from 0 to 20 (inclusive) that are not in the input set.",
    sampler=_near_fixed,
)
def complement_in_0_to_20(s):
    return frozenset(range(21)) - frozenset(s)


# ---- drop or keep elements -------------------------------------------------------------------


@atomic("sets", NONEMPTY, SET, "Remove the smallest element from the input set.")
def drop_smallest(s):
    return frozenset(s) - {min(s)}


@atomic("sets", NONEMPTY, SET, "Remove the largest element from the input set.")
def drop_largest(s):
    return frozenset(s) - {max(s)}


@atomic(
    "sets",
    SET,
    SET,
    "Keep only the even elements of the input set (zero and negative even numbers count as even).",
)
def keep_even(s):
    return frozenset(x for x in s if x % 2 == 0)


@atomic(
    "sets",
    NONEMPTY,
    SET,
    "Keep only the elements of the input set that are strictly greater than the mean (average)"
    " of all its elements.",
)
def above_mean(s):
    n, total = len(s), sum(s)
    return frozenset(x for x in s if x * n > total)


# ---- map every element -----------------------------------------------------------------------


@atomic(
    "sets",
    SET,
    IntSet(max_size=7, lo=0, hi=6),
    "Replace every element x of the input set by its remainder modulo 7, taken in 0..6"
    " (so -1 becomes 6); equal remainders merge into one element.",
)
def remainders_mod_7(s):
    return frozenset(x % 7 for x in s)


@atomic(
    "sets",
    SET,
    IntSet(max_size=30, lo=-BIG + 3, hi=BIG + 3),
    "Add 3 to every element of the input set.",
)
def shift_up_3(s):
    return frozenset(x + 3 for x in s)


@atomic("sets", SET, SET, "Replace every element x of the input set by -x.")
def negate(s):
    return frozenset(-x for x in s)


@atomic(
    "sets",
    IntSet(max_size=30, lo=-(10**4), hi=10**4),
    IntSet(max_size=30, lo=0, hi=10**8),
    "Replace every element of the input set by its square; equal squares (of x and -x) merge"
    " into one element.",
)
def squares(s):
    return frozenset(x * x for x in s)


@atomic(
    "sets",
    IntSet(max_size=8, lo=-BIG, hi=BIG),
    IntSet(max_size=28, lo=-2 * BIG, hi=2 * BIG),
    "Give the set of all sums x + y of two different elements x and y of the input set"
    " (the empty set if it has fewer than two elements).",
    sampler=_small_few,
)
def pairwise_sums(s):
    xs = sorted(s)
    return frozenset(a + b for i, a in enumerate(xs) for b in xs[i + 1 :])


# ---- summaries -------------------------------------------------------------------------------


@atomic("sets", SET, Int(lo=0, hi=30), "Give the number of elements of the input set.")
def size(s):
    return len(s)


@atomic("sets", NONEMPTY, Int(lo=-BIG, hi=BIG), "Give the smallest element of the input set.")
def smallest(s):
    return min(s)


@atomic("sets", NONEMPTY, Int(lo=-BIG, hi=BIG), "Give the largest element of the input set.")
def largest(s):
    return max(s)


@atomic(
    "sets",
    SET,
    Int(lo=-30 * BIG, hi=30 * BIG),
    "Give the sum of the elements of the input set (0 for the empty set).",
)
def total(s):
    return sum(s)


@atomic(
    "sets",
    NONEMPTY,
    Int(lo=0, hi=2 * BIG),
    "Give the largest element of the input set minus its smallest element.",
)
def spread(s):
    return max(s) - min(s)


@atomic(
    "sets",
    NONEMPTY,
    Rational(max_abs=30 * BIG),
    "Give the mean (average) of the elements of the input set as a fraction in lowest terms.",
)
def mean(s):
    from fractions import Fraction

    return Fraction(sum(s), len(s))


@atomic(
    "sets",
    SET,
    Int(lo=1, hi=2**30),
    "Give the number of subsets of the input set, the empty set and the whole set included.",
)
def powerset_size(s):
    return 2 ** len(s)


@atomic(
    "sets",
    IntSet(max_size=10, lo=-1000, hi=1000),
    Int(lo=1, hi=1024),
    "Count the different totals that subsets of the input set can have, where the empty subset"
    " has total 0 (two subsets with the same total count once).",
    sampler=_small_few,
)
def subset_sum_count(s):
    sums = {0}
    for x in s:
        sums |= {t + x for t in sums}
    return len(sums)


@atomic(
    "sets",
    SET,
    Int(lo=0, hi=11),
    "Count the elements of the input set that lie between 0 and 10, inclusive.",
    sampler=_near_fixed,
)
def count_in_0_to_10(s):
    return sum(1 for x in s if 0 <= x <= 10)


@atomic(
    "sets",
    IntSet(max_size=31, lo=0, hi=30),
    Int(lo=0, hi=2**31 - 1),
    "Read the input set as the positions of the 1-bits of a binary number: give the sum of"
    " 2^x over the elements x.",
    sampler=lambda rng, level: _draw(rng, rng.randint(1, 3 + 2 * level), 0, 5 + 8 * level),
)
def bitmask(s):
    return sum(2**x for x in s)


# ---- yes/no questions ------------------------------------------------------------------------


@atomic(
    "sets",
    SET,
    Bool(),
    "Is every element of the input set one of the digits 0 to 9?",
    sampler=_digits_or_not,
)
def within_digits(s):
    return all(0 <= x <= 9 for x in s)


@atomic(
    "sets",
    SET,
    Bool(),
    "Do two different elements of the input set add up to exactly 10?",
    sampler=_maybe_pair_to_10,
)
def has_pair_summing_to_10(s):
    return any(10 - x in s and 10 - x != x for x in s)


@atomic(
    "sets",
    SET,
    Bool(),
    "Does the input set contain two consecutive integers (some x together with x + 1)?",
    sampler=_near_fixed,
)
def has_consecutive_pair(s):
    return any(x + 1 in s for x in s)


# ---- re-read as another kind ---------------------------------------------------------------


@atomic(
    "sets",
    SET,
    IntList(max_len=30, lo=-BIG, hi=BIG),
    "List the elements of the input set in increasing order.",
)
def sorted_increasing(s):
    return tuple(sorted(s))


@atomic(
    "sets",
    SET,
    IntList(max_len=30, lo=-BIG, hi=BIG),
    "List the elements of the input set in decreasing order.",
)
def sorted_decreasing(s):
    return tuple(sorted(s, reverse=True))


@atomic(
    "sets",
    IntSet(min_size=2, max_size=30, lo=-BIG, hi=BIG),
    IntList(min_len=1, max_len=29, lo=1, hi=2 * BIG),
    "Sort the elements of the input set in increasing order and list the differences between"
    " neighbouring ones (each element minus the one before it).",
    sampler=_at_least_two,
)
def gaps(s):
    xs = sorted(s)
    return tuple(b - a for a, b in zip(xs, xs[1:]))


@atomic(
    "sets",
    IntSet(max_size=26, lo=0, hi=25),
    Str(max_len=26),
    "Write the letters whose positions in the alphabet are the elements of the input set"
    " (a is 0, b is 1, ..., z is 25), in alphabetical order, as one string.",
    sampler=lambda rng, level: _draw(rng, rng.randint(1, 3 + 3 * level), 0, 25),
)
def letters(s):
    return "".join(chr(ord("a") + x) for x in sorted(s))


@atomic(
    "sets",
    IntSet(min_size=1, max_size=6, lo=-9, hi=9),
    Poly(max_degree=6, max_coef=10**6),
    "Give the monic polynomial whose roots are exactly the elements of the input set: the"
    " product of (x - r) over the elements r.",
    sampler=lambda rng, level: _draw(rng, rng.randint(1, min(6, 1 + level * 2)), -9, 9),
)
def roots_to_poly(s):
    coefs = [1]
    for r in sorted(s):
        coefs = [a - r * b for a, b in zip(coefs + [0], [0] + coefs)]
    return tuple(coefs)


@atomic(
    "sets",
    IntSet(min_size=1, max_size=12, lo=1, hi=BIG),
    Graph(min_nodes=1, max_nodes=12),
    "Number the elements of the input set 0, 1, 2, ... in increasing order of value, and build"
    " a graph on those numbers that joins two of them when one element divides the other.",
    sampler=_positive_small,
)
def divisibility_graph(s):
    xs = sorted(s)
    n = len(xs)
    return (n, tuple((i, j) for i in range(n) for j in range(i + 1, n) if xs[j] % xs[i] == 0))
