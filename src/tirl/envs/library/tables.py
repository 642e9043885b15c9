"""RACES atomic environments: tables (records: rows of (name, value)).

Same-type environments sort, filter, group, rename and re-score rows; cross-type ones pull out
a column (int_list, str_list, int_set), summarize the table (int, bool, rational) or name one of
its rows (str).

Input limits: a table has 1 to 20 rows. The `Records` type bounds neither the values nor the
names, so outputs are declared with generous bounds (|value| at most 10**9, names of lowercase
letters where the output is a str); the search drops any step whose result falls outside them.
Most environments sample tables whose names repeat, so grouping and tie-breaking rules matter.
"""

from __future__ import annotations

import random

from tirl.envs.core import atomic
from tirl.envs.types import Bool, Int, IntList, IntSet, Rational, Records, Str, StrList

TABLE = Records(min_rows=1, max_rows=20)
MAYBE_EMPTY = Records(min_rows=0, max_rows=20)
TOTAL = Int(lo=-(10**11), hi=10**11)  # 20 rows of |value| up to 10**9, with room to spare
VALUE = Int(lo=-(10**10), hi=10**10)
NAMES = ("ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo", "kim", "lee")


def _repeating_names(rng: random.Random, level: int) -> tuple[tuple[str, int], ...]:
    """2..4+3*level rows whose names come from a pool of 3+level names, so names repeat and
    values tie."""
    pool = NAMES[: 3 + level]
    n = rng.randint(2, 4 + 3 * level)
    return tuple((rng.choice(pool), rng.randint(0, 10 * level)) for _ in range(n))


def _with_negatives(rng: random.Random, level: int) -> tuple[tuple[str, int], ...]:
    rows = _repeating_names(rng, level)
    return tuple((name, value - 5 * level) for name, value in rows)


# ---- reorder ---------------------------------------------------------------------------------


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Sort the rows of the input table by value in increasing order; rows with equal values go"
    " in alphabetical order of name.",
    sampler=_repeating_names,
)
def sort_by_value_then_name(rows):
    return tuple(sorted(rows, key=lambda r: (r[1], r[0])))


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Sort the rows of the input table alphabetically by name; rows with the same name go in"
    " decreasing order of value.",
    sampler=_repeating_names,
)
def sort_by_name_then_value_desc(rows):
    return tuple(sorted(rows, key=lambda r: (r[0], -r[1])))


@atomic("tables", TABLE, TABLE, "Reverse the order of the rows of the input table.")
def reverse_rows(rows):
    return tuple(rows[::-1])


# ---- filter ----------------------------------------------------------------------------------


@atomic(
    "tables",
    TABLE,
    MAYBE_EMPTY,
    "Keep only the rows of the input table whose value is greater than 5, in their original order.",
)
def keep_values_above_5(rows):
    return tuple(r for r in rows if r[1] > 5)


@atomic(
    "tables",
    TABLE,
    MAYBE_EMPTY,
    "Keep only the rows of the input table whose value is even (0 counts as even), in their"
    " original order.",
)
def keep_even_values(rows):
    return tuple(r for r in rows if r[1] % 2 == 0)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Keep only the first row for each name in the input table: drop every row whose name"
    " already appeared in an earlier row, keeping the original order.",
    sampler=_repeating_names,
)
def first_row_per_name(rows):
    seen = set()
    out = []
    for name, value in rows:
        if name not in seen:
            seen.add(name)
            out.append((name, value))
    return tuple(out)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Keep only the row of the input table with the largest value (if several rows share the"
    " largest value, the first of them), as a table of one row.",
)
def max_row(rows):
    best = rows[0]
    for r in rows[1:]:
        if r[1] > best[1]:
            best = r
    return (best,)


# ---- group by name ---------------------------------------------------------------------------


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Merge the rows of the input table that share a name into one row whose value is the sum"
    " of their values; list one row per name, in alphabetical order of name.",
    sampler=_repeating_names,
)
def sum_by_name(rows):
    totals = {}
    for name, value in rows:
        totals[name] = totals.get(name, 0) + value
    return tuple(sorted(totals.items()))


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Merge the rows of the input table that share a name into one row whose value is the"
    " largest of their values; list one row per name, in alphabetical order of name.",
    sampler=_repeating_names,
)
def max_by_name(rows):
    best = {}
    for name, value in rows:
        best[name] = max(best.get(name, value), value)
    return tuple(sorted(best.items()))


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Replace the input table by one row per distinct name whose value is the number of rows"
    " with that name, listed in alphabetical order of name.",
    sampler=_repeating_names,
)
def count_by_name(rows):
    counts = {}
    for name, _ in rows:
        counts[name] = counts.get(name, 0) + 1
    return tuple(sorted(counts.items()))


# ---- change values or names ------------------------------------------------------------------


@atomic("tables", TABLE, TABLE, "Add 3 to the value of every row of the input table.")
def add_3(rows):
    return tuple((name, value + 3) for name, value in rows)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Subtract the smallest value in the input table from the value of every row (names and row"
    " order stay the same).",
    sampler=_with_negatives,
)
def subtract_min(rows):
    low = min(value for _, value in rows)
    return tuple((name, value - low) for name, value in rows)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Replace each row's value by the running total: the sum of the values of that row and all"
    " rows above it (names and row order stay the same).",
)
def running_totals(rows):
    out = []
    total = 0
    for name, value in rows:
        total += value
        out.append((name, total))
    return tuple(out)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Replace each row's value by its dense rank: the largest value in the table has rank 1,"
    " the next smaller distinct value rank 2, and so on, equal values sharing a rank (names and"
    " row order stay the same).",
    sampler=_repeating_names,
)
def dense_rank(rows):
    distinct = sorted({value for _, value in rows}, reverse=True)
    rank = {value: i + 1 for i, value in enumerate(distinct)}
    return tuple((name, rank[value]) for name, value in rows)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Replace each row's value by its remainder modulo 5, taken in 0..4 (so -1 becomes 4);"
    " names and row order stay the same.",
    sampler=_with_negatives,
)
def values_mod_5(rows):
    return tuple((name, value % 5) for name, value in rows)


@atomic(
    "tables",
    TABLE,
    TABLE,
    "Rename every row of the input table to the first letter of its name (an empty name stays"
    " empty); values and row order stay the same.",
)
def name_initials(rows):
    return tuple((name[:1], value) for name, value in rows)


@atomic("tables", TABLE, TABLE, "Multiply the value of every row of the input table by 2.")
def double_values(rows):
    return tuple((name, 2 * value) for name, value in rows)


# ---- pull out a column -----------------------------------------------------------------------


@atomic(
    "tables",
    TABLE,
    IntList(min_len=1, max_len=20),
    "List the values of the input table's rows, in row order.",
)
def values(rows):
    return tuple(value for _, value in rows)


@atomic(
    "tables",
    TABLE,
    StrList(min_len=1, max_len=20),
    "List the names of the input table's rows, in row order (a repeated name appears each time).",
)
def names(rows):
    return tuple(name for name, _ in rows)


@atomic(
    "tables",
    TABLE,
    StrList(min_len=1, max_len=20),
    "List the distinct names in the input table once each, in alphabetical order.",
    sampler=_repeating_names,
)
def distinct_names_sorted(rows):
    return tuple(sorted({name for name, _ in rows}))


@atomic(
    "tables",
    TABLE,
    StrList(min_len=1, max_len=3),
    "List the names of the 3 rows of the input table with the largest values, largest value"
    " first; rows with equal values go in alphabetical order of name, a name is listed once per"
    " row, and a table with fewer than 3 rows gives all its names.",
    sampler=_repeating_names,
)
def top_3_names(rows):
    ranked = sorted(rows, key=lambda r: (-r[1], r[0]))
    return tuple(name for name, _ in ranked[:3])


@atomic(
    "tables",
    TABLE,
    IntSet(min_size=1, max_size=20),
    "Give the set of the distinct values that occur in the input table.",
    sampler=_repeating_names,
)
def value_set(rows):
    return frozenset(value for _, value in rows)


# ---- summaries -------------------------------------------------------------------------------


@atomic("tables", TABLE, TOTAL, "Give the sum of the values of all rows of the input table.")
def total_value(rows):
    return sum(value for _, value in rows)


@atomic("tables", TABLE, VALUE, "Give the largest value in the input table.")
def max_value(rows):
    return max(value for _, value in rows)


@atomic(
    "tables",
    TABLE,
    TOTAL,
    "Give the largest value in the input table minus the smallest value.",
)
def value_range(rows):
    return max(v for _, v in rows) - min(v for _, v in rows)


@atomic(
    "tables",
    TABLE,
    Int(lo=1, hi=20),
    "Count the distinct names in the input table.",
    sampler=_repeating_names,
)
def count_distinct_names(rows):
    return len({name for name, _ in rows})


@atomic(
    "tables",
    TABLE,
    Int(lo=0, hi=19),
    "Count the rows of the input table whose value is strictly greater than the mean (average)"
    " of all the values.",
)
def count_above_mean(rows):
    n = len(rows)
    total = sum(value for _, value in rows)
    return sum(1 for _, value in rows if value * n > total)


@atomic(
    "tables",
    TABLE,
    Rational(max_abs=10**11),
    "Give the mean (average) of the values of the input table as a fraction in lowest terms.",
)
def mean_value(rows):
    from fractions import Fraction

    return Fraction(sum(value for _, value in rows), len(rows))


@atomic(
    "tables",
    TABLE,
    Bool(),
    "Does some name occur in more than one row of the input table?",
)
def has_repeated_name(rows):
    return len({name for name, _ in rows}) < len(rows)


@atomic(
    "tables",
    TABLE,
    Str(max_len=200),
    "Give the name of the row of the input table with the smallest value (if several rows share"
    " the smallest value, the first of them).",
)
def min_value_name(rows):
    best = rows[0]
    for r in rows[1:]:
        if r[1] < best[1]:
            best = r
    return best[0]


@atomic(
    "tables",
    TABLE,
    Str(max_len=200),
    "Join the names of the input table's rows, in row order, into one string without separators.",
)
def concatenate_names(rows):
    return "".join(name for name, _ in rows)
