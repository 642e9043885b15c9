"""RACES atomic environments: lists (transforms and summaries of an int_list).

Same-type environments reorder, filter and rescale a list; cross-type ones summarize it (int,
bool, rational) or re-read it as another kind (int_set, matrix, poly, str, str_list, records,
graph), so list chains can hand over to every other domain.

Input limits: lists have at most 30 elements of absolute value at most 10**6 unless an
environment needs tighter ones (products, polynomial roots, reshaping into a matrix, graphs);
output types are declared with the bounds those limits imply, so the search drops any step whose
result would fall outside them. Samplers are the input type's own unless an environment needs
repeats, runs, sorted lists or palindromes to be interesting.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import (
    Bool,
    Graph,
    Int,
    IntList,
    IntSet,
    Matrix,
    Poly,
    Rational,
    Records,
    Str,
    StrList,
)

BIG = 10**6
LIST = IntList(min_len=0, max_len=30, lo=-BIG, hi=BIG)
NONEMPTY = IntList(min_len=1, max_len=30, lo=-BIG, hi=BIG)


def _with_repeats(rng: random.Random, level: int) -> tuple[int, ...]:
    """A list drawn from a small pool of values, so values repeat."""
    n = rng.randint(3, 4 + 3 * level)
    pool = [rng.randint(-5 * level, 5 * level) for _ in range(max(2, n // 2))]
    return tuple(rng.choice(pool) for _ in range(n))


def _with_runs(rng: random.Random, level: int) -> tuple[int, ...]:
    """A list made of runs of equal values (neighbouring runs may share a value)."""
    out: list[int] = []
    target = rng.randint(3, 4 + 4 * level)
    while len(out) < target:
        out += [rng.randint(-2 * level, 2 * level)] * rng.randint(1, 3)
    return tuple(out[:target])


def _sorted_or_not(rng: random.Random, level: int) -> tuple[int, ...]:
    xs = NONEMPTY.sample(rng, level)
    return tuple(sorted(xs)) if rng.random() < 0.5 else xs


def _palindrome_or_not(rng: random.Random, level: int) -> tuple[int, ...]:
    half = tuple(rng.randint(-3 * level, 3 * level) for _ in range(rng.randint(1, 2 + 2 * level)))
    middle = (rng.randint(-3, 3),) if rng.random() < 0.5 else ()
    pal = half + middle + half[::-1]
    if rng.random() < 0.5:
        return pal
    i = rng.randrange(len(pal))
    return pal[:i] + (pal[i] + 1,) + pal[i + 1 :]


def _small_values(rng: random.Random, level: int) -> tuple[int, ...]:
    """At most 12 values from 0..3+level: the equal-value graph has edges."""
    return tuple(rng.randint(0, 3 + level) for _ in range(rng.randint(2, 4 + 2 * level)))


# ---- reorderings ---------------------------------------------------------------------------


@atomic("lists", LIST, LIST, "Reverse the order of the elements of the input list.")
def reverse(xs):
    return tuple(xs[::-1])


@atomic("lists", LIST, LIST, "Sort the input list in increasing order (keep repeated values).")
def sort_ascending(xs):
    return tuple(sorted(xs))


@atomic("lists", LIST, LIST, "Sort the input list in decreasing order (keep repeated values).")
def sort_descending(xs):
    return tuple(sorted(xs, reverse=True))


@atomic(
    "lists",
    LIST,
    LIST,
    "Rotate the input list 2 places to the left: its first two elements move, in their order,"
    " to the end (a list of fewer than 3 elements is unchanged).",
)
def rotate_left_2(xs):
    return tuple(xs[2:] + xs[:2])


@atomic("lists", NONEMPTY, NONEMPTY, "Move the last element of the input list to the front.")
def rotate_right_1(xs):
    return tuple(xs[-1:] + xs[:-1])


@atomic(
    "lists",
    LIST,
    LIST,
    "Split the input list into a first half of floor(n/2) elements and a second half holding"
    " the rest (n is the length), reverse each half on its own, and join them, first half first.",
)
def reverse_each_half(xs):
    h = len(xs) // 2
    return tuple(xs[:h][::-1] + xs[h:][::-1])


@atomic(
    "lists",
    LIST,
    LIST,
    "Split the input list into a first half of ceil(n/2) elements and a second half holding the"
    " rest (n is the length), then interleave them: first element of the first half, first of"
    " the second half, second of the first half, second of the second half, and so on.",
)
def interleave_halves(xs):
    h = (len(xs) + 1) // 2
    first, second = xs[:h], xs[h:]
    out = []
    for i in range(h):
        out.append(first[i])
        if i < len(second):
            out.append(second[i])
    return tuple(out)


@atomic(
    "lists",
    LIST,
    LIST,
    "Swap the elements at positions 0 and 1, at positions 2 and 3, and so on; if the length is"
    " odd, the last element stays where it is.",
)
def swap_adjacent_pairs(xs):
    out = list(xs)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return tuple(out)


@atomic(
    "lists",
    LIST,
    LIST,
    "Sort the input list by absolute value, smallest first; when a negative and a positive"
    " number have the same absolute value, put the negative one first.",
)
def sort_by_absolute_value(xs):
    return tuple(sorted(xs, key=lambda x: (abs(x), x)))


# ---- filters -------------------------------------------------------------------------------


@atomic(
    "lists",
    LIST,
    LIST,
    "Remove repeated values from the input list: keep only the first occurrence of each value,"
    " in the original order.",
    sampler=_with_repeats,
)
def dedupe_stable(xs):
    seen = set()
    out = []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return tuple(out)


@atomic(
    "lists",
    LIST,
    LIST,
    "Keep only the even elements of the input list (zero and negative even numbers count as"
    " even), in their original order.",
)
def keep_evens(xs):
    return tuple(x for x in xs if x % 2 == 0)


@atomic(
    "lists",
    LIST,
    LIST,
    "Remove every negative element from the input list; keep zeros and positive elements in"
    " their original order.",
)
def drop_negatives(xs):
    return tuple(x for x in xs if x >= 0)


@atomic(
    "lists",
    LIST,
    IntList(max_len=30, lo=0, hi=29),
    "List the 0-based positions of the negative elements of the input list, in increasing order.",
)
def negative_positions(xs):
    return tuple(i for i, x in enumerate(xs) if x < 0)


# ---- element-wise and running transforms -----------------------------------------------------


@atomic(
    "lists",
    LIST,
    IntList(max_len=30, lo=-3 * BIG, hi=3 * BIG),
    "Multiply every element of the input list by 3.",
)
def multiply_by_3(xs):
    return tuple(3 * x for x in xs)


@atomic(
    "lists",
    LIST,
    IntList(max_len=30, lo=0, hi=9),
    "Replace every element of the input list by its remainder modulo 10, taken in 0..9"
    " (so -13 becomes 7).",
)
def remainders_mod_10(xs):
    return tuple(x % 10 for x in xs)


@atomic(
    "lists",
    LIST,
    IntList(max_len=30, lo=-30 * BIG, hi=30 * BIG),
    "Replace each element of the input list by the sum of all elements from the start up to and"
    " including it (running sums).",
)
def running_sums(xs):
    out = []
    total = 0
    for x in xs:
        total += x
        out.append(total)
    return tuple(out)


@atomic(
    "lists",
    LIST,
    LIST,
    "Replace each element of the input list by the largest element from the start up to and"
    " including it (running maximum).",
)
def running_maximum(xs):
    out = []
    for x in xs:
        out.append(x if not out or x > out[-1] else out[-1])
    return tuple(out)


@atomic(
    "lists",
    IntList(min_len=2, max_len=30, lo=-BIG, hi=BIG),
    IntList(max_len=29, lo=-2 * BIG, hi=2 * BIG),
    "List the differences of neighbouring elements of the input list: for each position i"
    " except the last, the element at i+1 minus the element at i.",
)
def pairwise_differences(xs):
    return tuple(b - a for a, b in zip(xs, xs[1:]))


@atomic(
    "lists",
    LIST,
    IntList(max_len=10, lo=-3 * BIG, hi=3 * BIG),
    "Cut the input list into consecutive chunks of 3 elements (the last chunk may be shorter)"
    " and list the sum of each chunk, in order.",
)
def chunk_sums_of_3(xs):
    return tuple(sum(xs[i : i + 3]) for i in range(0, len(xs), 3))


@atomic(
    "lists",
    LIST,
    IntList(max_len=30, lo=1, hi=30),
    "Split the input list into maximal runs of neighbouring equal elements and list the length"
    " of each run, in order.",
    sampler=_with_runs,
)
def run_lengths(xs):
    out = []
    for i, x in enumerate(xs):
        if i > 0 and xs[i - 1] == x:
            out[-1] += 1
        else:
            out.append(1)
    return tuple(out)


# ---- summaries -------------------------------------------------------------------------------


@atomic("lists", LIST, Int(lo=-30 * BIG, hi=30 * BIG), "Give the sum of the input list's elements.")
def total(xs):
    return sum(xs)


@atomic(
    "lists",
    LIST,
    Int(lo=-30 * BIG, hi=30 * BIG),
    "Give the alternating sum of the input list: the element at position 0, minus the one at"
    " position 1, plus the one at position 2, and so on (0 for an empty list).",
)
def alternating_sum(xs):
    return sum(x if i % 2 == 0 else -x for i, x in enumerate(xs))


@atomic(
    "lists",
    NONEMPTY,
    Int(lo=0, hi=999),
    "Multiply all elements of the input list together and give the remainder of the product"
    " modulo 1000, as a number from 0 to 999 (a product of -7 gives 993).",
)
def product_mod_1000(xs):
    p = 1
    for x in xs:
        p = p * x % 1000
    return p


@atomic("lists", NONEMPTY, Int(lo=-BIG, hi=BIG), "Give the smallest element of the input list.")
def minimum(xs):
    return min(xs)


@atomic("lists", NONEMPTY, Int(lo=-BIG, hi=BIG), "Give the largest element of the input list.")
def maximum(xs):
    return max(xs)


@atomic(
    "lists",
    NONEMPTY,
    Int(lo=0, hi=2 * BIG),
    "Give the largest element of the input list minus its smallest element.",
)
def value_range(xs):
    return max(xs) - min(xs)


@atomic(
    "lists",
    NONEMPTY,
    Int(lo=0, hi=29),
    "Give the 0-based position of the largest element of the input list; if the largest value"
    " occurs several times, give its first position.",
)
def argmax_index(xs):
    return xs.index(max(xs))


@atomic(
    "lists",
    LIST,
    Int(lo=0, hi=30),
    "Count how many different values occur in the input list.",
    sampler=_with_repeats,
)
def count_distinct(xs):
    return len(set(xs))


@atomic(
    "lists",
    NONEMPTY,
    Rational(max_abs=BIG),
    "Give the median of the input list: sort it; for odd length take the middle element, for"
    " even length the mean of the two middle elements (as a fraction in lowest terms).",
)
def median(xs):
    from fractions import Fraction

    s = sorted(xs)
    n = len(s)
    if n % 2:
        return Fraction(s[n // 2])
    return Fraction(s[n // 2 - 1] + s[n // 2], 2)


@atomic(
    "lists",
    NONEMPTY,
    Int(lo=-BIG, hi=BIG),
    "Give the value that occurs most often in the input list; if several values are tied for"
    " most occurrences, give the smallest of them.",
    sampler=_with_repeats,
)
def mode(xs):
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v))


@atomic(
    "lists",
    NONEMPTY,
    Int(lo=1, hi=30),
    "Give the length of the longest stretch of neighbouring elements of the input list that is"
    " strictly increasing (a single element counts as a stretch of length 1).",
)
def longest_increasing_run(xs):
    best = run = 1
    for a, b in zip(xs, xs[1:]):
        run = run + 1 if b > a else 1
        best = max(best, run)
    return best


@atomic(
    "lists",
    LIST,
    Int(lo=0, hi=435),
    "Count the pairs of positions i < j in the input list whose elements are out of order,"
    " that is, the element at i is greater than the element at j.",
)
def count_inversions(xs):
    return sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] > xs[j])


@atomic(
    "lists",
    NONEMPTY,
    Bool(),
    "Is the input list in non-decreasing order (each element at least the one before it)?",
    sampler=_sorted_or_not,
)
def is_sorted(xs):
    return all(a <= b for a, b in zip(xs, xs[1:]))


@atomic(
    "lists",
    NONEMPTY,
    Bool(),
    "Does the input list read the same forwards and backwards?",
    sampler=_palindrome_or_not,
)
def is_palindrome(xs):
    return tuple(xs) == tuple(xs[::-1])


# ---- re-read as another kind ---------------------------------------------------------------


@atomic(
    "lists",
    LIST,
    IntSet(max_size=30, lo=-BIG, hi=BIG),
    "Give the set of values that occur in the input list.",
    sampler=_with_repeats,
)
def to_set(xs):
    return frozenset(xs)


@atomic(
    "lists",
    IntList(min_len=2, max_len=16, lo=-BIG, hi=BIG),
    Matrix(min_rows=2, max_rows=2, min_cols=1, max_cols=8, lo=-BIG, hi=BIG),
    "Arrange the input list as a matrix with 2 rows: if its length is odd, first append a 0;"
    " the first half of the elements, in order, is row 1 and the second half is row 2.",
)
def reshape_two_rows(xs):
    ys = tuple(xs) + ((0,) if len(xs) % 2 else ())
    h = len(ys) // 2
    return (ys[:h], ys[h:])


@atomic(
    "lists",
    IntList(min_len=1, max_len=13, lo=-BIG, hi=BIG),
    Poly(max_degree=12, max_coef=BIG),
    "Read the input list as polynomial coefficients from the constant term upward (the element"
    " at position i is the coefficient of x^i) and give that polynomial.",
)
def coefficients_to_poly(xs):
    coefs = list(xs[::-1])
    while len(coefs) > 1 and coefs[0] == 0:
        coefs.pop(0)
    return tuple(coefs)


@atomic(
    "lists",
    IntList(min_len=1, max_len=6, lo=-9, hi=9),
    Poly(max_degree=6, max_coef=BIG),
    "Give the monic polynomial whose roots are the elements of the input list, repeated values"
    " counted as repeated roots: the product of (x - r) over the elements r.",
)
def roots_to_poly(xs):
    coefs = [1]
    for r in xs:
        coefs = [a - r * b for a, b in zip(coefs + [0], [0] + coefs)]
    return tuple(coefs)


@atomic(
    "lists",
    NONEMPTY,
    Str(min_len=1, max_len=30),
    "Turn each element x of the input list into the letter at position x mod 26 of the"
    " alphabet (a is 0, b is 1, ..., z is 25; the remainder is taken in 0..25, so -1 gives z)"
    " and join the letters into one string.",
)
def to_letters(xs):
    return "".join(chr(ord("a") + x % 26) for x in xs)


@atomic(
    "lists",
    IntList(min_len=1, max_len=20, lo=-BIG, hi=BIG),
    StrList(min_len=1, max_len=20),
    "Spell each element of the input list as a word: write the absolute value in decimal and"
    " replace each digit d by the letter at position d of the alphabet (0 is a, 1 is b, ...,"
    " 9 is j), so -305 becomes daf.",
)
def digits_to_letters(xs):
    return tuple("".join(chr(ord("a") + int(d)) for d in str(abs(x))) for x in xs)


@atomic(
    "lists",
    IntList(min_len=1, max_len=20, lo=-BIG, hi=BIG),
    Records(min_rows=1, max_rows=20),
    "Make a table with one row per element of the input list, in order: the row's name is"
    ' "even" or "odd" according to the element\'s parity, and its value is the element.',
)
def to_parity_table(xs):
    return tuple(("odd" if x % 2 else "even", x) for x in xs)


@atomic(
    "lists",
    IntList(min_len=1, max_len=12, lo=-BIG, hi=BIG),
    Graph(min_nodes=1, max_nodes=12),
    "Build a graph with one node per position of the input list (nodes 0 to n-1 for a list of"
    " length n), joining positions i and j by an edge when their elements are equal.",
    sampler=_small_values,
)
def equal_value_graph(xs):
    n = len(xs)
    edges = tuple((i, j) for i in range(n) for j in range(i + 1, n) if xs[i] == xs[j])
    return (n, edges)
