"""The value types of RACES environments: what a mapper takes and returns.

RACES (`../shared/papers/003_*.txt`, §2.1–2.2) composes environment e_i with e_j when the output
type of e_i equals the input type of e_j. A type here is both the *kind* of a value (its `name`:
"int", "int_list", "graph", …, the node of the type graph) and the *constraints* an environment
puts on its input (ranges, sizes). Two environments chain when the kinds match; whether a
concrete intermediate value is a valid input is decided by `check` when the chain runs.

Every type knows how to
- `sample` a value at a difficulty level (1 = small … 3 = large) within its constraints,
- `render` a value as the one canonical text used in prompts and expected in answers,
- `parse` a model's answer strictly (one value, nothing else; `AnswerError` says why not),
- `near_misses`: plausible wrong values (off by one, reordered, dropped element) for tests.

Values are immutable Python objects (tuples, frozensets, `Fraction`, `date`, `Graph`), so they
hash: the search de-duplicates states and paths by value.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar


class AnswerError(ValueError):
    """A model's answer could not be read as a value of the expected type; the message says
    why. Verifiers fail closed on it: an unreadable answer scores 0."""


_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
_RATIONAL = re.compile(r"([+-]?(?:0|[1-9][0-9]*))(?:/([1-9][0-9]*))?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


_RENDER_NAMES = {"json": json, "Fraction": Fraction, "datetime": dt}


@functools.cache
def _renderer(expr: str):
    """`render_expr` as a function of `v` (compiled once; a call costs no dict and no eval)."""
    return eval(compile(f"lambda v: {expr}", "<render_expr>", "eval"), dict(_RENDER_NAMES))  # noqa: S307 - ours


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise AnswerError(f"expected {what} in JSON, could not parse it ({e.msg})") from None


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise AnswerError(f"{where} must be an integer, got {json.dumps(v)}")
    return v


_INT_TYPE = {int}


def _all_ints(values: Any) -> bool:
    """Whether every item is exactly an int (no bool): one C-level pass over the types, where a
    check per item in Python costs ~0.3 us each (scoring and the search check every state)."""
    return set(map(type, values)) <= _INT_TYPE


@functools.cache
def _charset(alphabet: str) -> frozenset[str]:
    """The characters of an alphabet, built once (checks run on every state of a search)."""
    return frozenset(alphabet)


def _ints(data: list[Any], where: str) -> tuple[int, ...]:
    """`tuple(_int(x, where) for x in data)`, the same error for the first bad item."""
    if _all_ints(data):
        return tuple(data)
    return tuple(_int(x, where) for x in data)


class Type:
    """Base class: a kind of value plus constraints. Subclasses are frozen dataclasses."""

    name: ClassVar[str]
    answer_format: ClassVar[str]  # how the prompt asks for an answer of this type

    def check(self, v: Any) -> str | None:
        """None if `v` is a valid value under these constraints, else the reason it is not."""
        raise NotImplementedError

    def sample(self, rng: random.Random, level: int) -> Any:
        raise NotImplementedError

    # `render` as one Python expression in `v` over the names `json`, `Fraction` and `datetime`:
    # a demonstration's code prints its values with it, so the interpreter shows each value
    # exactly as the answer must write it (`tirl.envs.demos`).
    render_expr: ClassVar[str]

    def render(self, v: Any) -> str:
        return _renderer(self.render_expr)(v)

    def parse(self, text: str) -> Any:
        raise NotImplementedError

    def equal(self, a: Any, b: Any) -> bool:
        return a == b

    def near_misses(self, v: Any, rng: random.Random) -> list[Any]:
        """Values close to `v` that are not `v` (for verifier tests); may be empty."""
        return []

    def is_valid(self, v: Any) -> bool:
        return self.check(v) is None


def _scaled(lo: int, hi: int, level: int, base: int) -> tuple[int, int]:
    """A sub-range of [lo, hi] that widens with the level: |values| up to base**level."""
    bound = base**level
    return max(lo, -bound), min(hi, bound)


@dataclass(frozen=True)
class Int(Type):
    lo: int = -(10**12)
    hi: int = 10**12
    name: ClassVar[str] = "int"
    answer_format: ClassVar[str] = "an integer, such as -42"

    def check(self, v):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"not an integer: {v!r}"
        if not self.lo <= v <= self.hi:
            return f"{v} is outside [{self.lo}, {self.hi}]"
        return None

    def sample(self, rng, level):
        lo, hi = _scaled(self.lo, self.hi, level, 30)
        return rng.randint(lo, hi) if lo <= hi else rng.randint(self.lo, self.hi)

    render_expr: ClassVar[str] = "str(v)"

    def parse(self, text):
        text = text.strip()
        if not _INT.fullmatch(text):
            raise AnswerError(f"expected an integer, got {text[:40]!r}")
        return int(text)

    def near_misses(self, v, rng):
        return [v + 1, v - 1, -v if v else 1]


@dataclass(frozen=True)
class Bool(Type):
    name: ClassVar[str] = "bool"
    answer_format: ClassVar[str] = "true or false"

    def check(self, v):
        return None if isinstance(v, bool) else f"not a boolean: {v!r}"

    def sample(self, rng, level):
        return rng.random() < 0.5

    render_expr: ClassVar[str] = '"true" if v else "false"'

    def parse(self, text):
        t = text.strip().lower()
        if t not in ("true", "false"):
            raise AnswerError(f"expected true or false, got {text[:40]!r}")
        return t == "true"

    def near_misses(self, v, rng):
        return [not v]


@dataclass(frozen=True)
class Rational(Type):
    max_abs: int = 10**9
    name: ClassVar[str] = "rational"
    answer_format: ClassVar[str] = "a fraction p/q in lowest terms (or an integer), such as -7/3"

    def check(self, v):
        if not isinstance(v, Fraction):
            return f"not a Fraction: {v!r}"
        if abs(v.numerator) > self.max_abs or v.denominator > self.max_abs:
            return f"{v} has a numerator or denominator above {self.max_abs}"
        return None

    def sample(self, rng, level):
        bound = 10**level
        return Fraction(rng.randint(-bound, bound), rng.randint(1, bound))

    render_expr: ClassVar[str] = "str(v)"

    def parse(self, text):
        m = _RATIONAL.fullmatch(text.strip())
        if not m:
            raise AnswerError(f"expected a fraction p/q, got {text[:40]!r}")
        return Fraction(int(m.group(1)), int(m.group(2) or 1))

    def near_misses(self, v, rng):
        return [v + 1, Fraction(v.numerator + 1, v.denominator), -v if v else Fraction(1, 2)]


@dataclass(frozen=True)
class IntList(Type):
    min_len: int = 0
    max_len: int = 64
    lo: int = -(10**9)
    hi: int = 10**9
    name: ClassVar[str] = "int_list"
    answer_format: ClassVar[str] = "a JSON list of integers, such as [3, -1, 4]"

    def check(self, v):
        if not isinstance(v, tuple):
            return f"not a tuple: {type(v).__name__}"
        if not self.min_len <= len(v) <= self.max_len:
            return f"length {len(v)} is outside [{self.min_len}, {self.max_len}]"
        if not v or (_all_ints(v) and self.lo <= min(v) and max(v) <= self.hi):
            return None
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int) or not self.lo <= x <= self.hi:
                return f"element {x!r} is not an integer in [{self.lo}, {self.hi}]"
        return None

    def sample(self, rng, level):
        n = rng.randint(max(self.min_len, 2), max(self.min_len, min(self.max_len, 3 + 3 * level)))
        lo, hi = _scaled(self.lo, self.hi, level, 10)
        return tuple(rng.randint(lo, hi) for _ in range(n))

    render_expr: ClassVar[str] = "json.dumps(list(v))"

    def parse(self, text):
        data = _json(text, "a list of integers")
        if not isinstance(data, list):
            raise AnswerError(f"expected a JSON list, got {type(data).__name__}")
        return _ints(data, "every element")

    def near_misses(self, v, rng):
        out = []
        if v:
            i = rng.randrange(len(v))
            out.append(v[:i] + (v[i] + 1,) + v[i + 1 :])
            out.append(v[:-1])
            if len(set(v)) > 1:
                out.append(tuple(reversed(v)) if tuple(reversed(v)) != v else v[1:] + v[:1])
        out.append(v + (0,))
        return out


@dataclass(frozen=True)
class Str(Type):
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"
    min_len: int = 0
    max_len: int = 200
    name: ClassVar[str] = "str"
    answer_format: ClassVar[str] = 'a JSON string in double quotes, such as "abc"'

    def check(self, v):
        if not isinstance(v, str):
            return f"not a string: {v!r}"
        if not self.min_len <= len(v) <= self.max_len:
            return f"length {len(v)} is outside [{self.min_len}, {self.max_len}]"
        bad = set(v) - _charset(self.alphabet)
        if bad:
            return f"characters {''.join(sorted(bad))!r} are not in the alphabet"
        return None

    def sample(self, rng, level):
        n = rng.randint(max(self.min_len, 3), max(self.min_len, min(self.max_len, 4 + 4 * level)))
        return "".join(rng.choice(self.alphabet) for _ in range(n))

    render_expr: ClassVar[str] = "json.dumps(v, ensure_ascii=False)"

    def parse(self, text):
        data = _json(text.strip(), "a string")
        if not isinstance(data, str):
            raise AnswerError(f"expected a JSON string, got {type(data).__name__}")
        return data

    def near_misses(self, v, rng):
        out = [v + "a", v[:-1]] if v else ["a"]
        if len(set(v)) > 1:
            out.append(v[::-1] if v[::-1] != v else v[1:] + v[:1])
        return out


@dataclass(frozen=True)
class StrList(Type):
    """A list of strings; `alphabet` (None: any character), `min_item` and `max_item` bound the
    items, so an environment can promise small, well-formed outputs to what follows it."""

    min_len: int = 0
    max_len: int = 32
    alphabet: str | None = None
    min_item: int = 0
    max_item: int = 200
    name: ClassVar[str] = "str_list"
    answer_format: ClassVar[str] = 'a JSON list of strings, such as ["ab", "c"]'

    def check(self, v):
        if not isinstance(v, tuple) or not all(isinstance(x, str) for x in v):
            return f"not a tuple of strings: {v!r}"
        if not self.min_len <= len(v) <= self.max_len:
            return f"length {len(v)} is outside [{self.min_len}, {self.max_len}]"
        for w in v:
            if not self.min_item <= len(w) <= self.max_item:
                return f"item {w!r} has a length outside [{self.min_item}, {self.max_item}]"
            if self.alphabet is not None and set(w) - _charset(self.alphabet):
                bad = "".join(sorted(set(w) - _charset(self.alphabet)))
                return f"item {w!r} has characters {bad!r} outside the alphabet"
        return None

    def sample(self, rng, level):
        n = rng.randint(max(self.min_len, 2), max(self.min_len, min(self.max_len, 2 + 2 * level)))
        letters = "abcdefghijklmnopqrstuvwxyz"
        return tuple(
            "".join(rng.choice(letters) for _ in range(rng.randint(1, 2 + level))) for _ in range(n)
        )

    render_expr: ClassVar[str] = "json.dumps(list(v), ensure_ascii=False)"

    def parse(self, text):
        data = _json(text, "a list of strings")
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise AnswerError("expected a JSON list of strings")
        return tuple(data)

    def near_misses(self, v, rng):
        out = [v + ("x",)]
        if v:
            out.append(v[:-1])
            if len(set(v)) > 1:
                out.append(tuple(reversed(v)) if tuple(reversed(v)) != v else v[1:] + v[:1])
        return out


@dataclass(frozen=True)
class Date(Type):
    lo: dt.date = dt.date(1900, 1, 1)
    hi: dt.date = dt.date(2199, 12, 31)
    name: ClassVar[str] = "date"
    answer_format: ClassVar[str] = "a date as YYYY-MM-DD, such as 2024-02-29"

    def check(self, v):
        if not isinstance(v, dt.date) or isinstance(v, dt.datetime):
            return f"not a date: {v!r}"
        if not self.lo <= v <= self.hi:
            return f"{v} is outside [{self.lo}, {self.hi}]"
        return None

    def sample(self, rng, level):
        span = min((self.hi - self.lo).days, 365 * 10**level)
        start = max(self.lo, dt.date(2000, 1, 1) - dt.timedelta(days=span // 2))
        return start + dt.timedelta(days=rng.randint(0, span))

    render_expr: ClassVar[str] = "v.isoformat()"

    def parse(self, text):
        t = text.strip()
        if not _DATE.fullmatch(t):
            raise AnswerError(f"expected a date YYYY-MM-DD, got {t[:40]!r}")
        try:
            return dt.date.fromisoformat(t)
        except ValueError as e:
            raise AnswerError(f"{t} is not a calendar date ({e})") from None

    def near_misses(self, v, rng):
        return [v + dt.timedelta(days=1), v - dt.timedelta(days=1), v + dt.timedelta(days=365)]


def _rows(data: Any, what: str) -> list[list[Any]]:
    if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
        raise AnswerError(f"expected {what} as a JSON list of lists")
    if data and len({len(r) for r in data}) != 1:
        raise AnswerError(f"{what} has rows of different lengths")
    return data


@dataclass(frozen=True)
class Matrix(Type):
    min_rows: int = 1
    max_rows: int = 8
    min_cols: int = 1
    max_cols: int = 8
    square: bool = False
    lo: int = -(10**12)
    hi: int = 10**12
    name: ClassVar[str] = "matrix"
    answer_format: ClassVar[str] = "a JSON list of rows, such as [[1, 2], [3, 4]]"

    def check(self, v):
        if not isinstance(v, tuple) or not v or not all(isinstance(r, tuple) for r in v):
            return "not a non-empty tuple of row tuples"
        if len({len(r) for r in v}) != 1:
            return "rows of different lengths"
        rows, cols = len(v), len(v[0])
        if not (self.min_rows <= rows <= self.max_rows and self.min_cols <= cols <= self.max_cols):
            return f"shape {rows}x{cols} is outside the allowed sizes"
        if self.square and rows != cols:
            return f"shape {rows}x{cols} is not square"
        for r in v:
            for x in r:
                if isinstance(x, bool) or not isinstance(x, int) or not self.lo <= x <= self.hi:
                    return f"entry {x!r} is not an integer in [{self.lo}, {self.hi}]"
        return None

    def sample(self, rng, level):
        rows = rng.randint(self.min_rows, max(self.min_rows, min(self.max_rows, 1 + level)))
        cols = (
            rows
            if self.square
            else rng.randint(self.min_cols, max(self.min_cols, min(self.max_cols, 1 + level)))
        )
        lo, hi = _scaled(self.lo, self.hi, level, 5)
        return tuple(tuple(rng.randint(lo, hi) for _ in range(cols)) for _ in range(rows))

    render_expr: ClassVar[str] = "json.dumps([list(r) for r in v])"

    def parse(self, text):
        data = _rows(_json(text, "a matrix"), "a matrix")
        if not data:
            raise AnswerError("expected a non-empty matrix")
        return tuple(_ints(r, "every entry") for r in data)

    def near_misses(self, v, rng):
        i, j = rng.randrange(len(v)), rng.randrange(len(v[0]))
        bumped = tuple(
            tuple(x + 1 if (a, b) == (i, j) else x for b, x in enumerate(r))
            for a, r in enumerate(v)
        )
        out = [bumped]
        if len(v) > 1:
            out.append(v[:-1])
        return out


@dataclass(frozen=True)
class Grid(Type):
    """A rectangle of cells drawn from `alphabet` ('.' empty, '#' filled by default)."""

    alphabet: str = ".#"
    min_size: int = 1
    max_size: int = 12
    name: ClassVar[str] = "grid"
    answer_format: ClassVar[str] = 'a JSON list of equal-length row strings, such as ["#.", ".#"]'

    def check(self, v):
        if not isinstance(v, tuple) or not v or not all(isinstance(r, str) for r in v):
            return "not a non-empty tuple of row strings"
        if len({len(r) for r in v}) != 1 or not v[0]:
            return "rows are empty or of different lengths"
        if not all(self.min_size <= n <= self.max_size for n in (len(v), len(v[0]))):
            return f"shape {len(v)}x{len(v[0])} is outside the allowed sizes"
        bad = set("".join(v)) - _charset(self.alphabet)
        if bad:
            return f"cells {''.join(sorted(bad))!r} are not in the alphabet {self.alphabet!r}"
        return None

    def sample(self, rng, level):
        hi = max(self.min_size, min(self.max_size, 2 + 2 * level))
        rows, cols = rng.randint(self.min_size, hi), rng.randint(self.min_size, hi)
        return tuple("".join(rng.choice(self.alphabet) for _ in range(cols)) for _ in range(rows))

    render_expr: ClassVar[str] = "json.dumps(list(v))"

    def parse(self, text):
        data = _json(text, "a grid")
        if not isinstance(data, list) or not data or not all(isinstance(r, str) for r in data):
            raise AnswerError("expected a grid as a non-empty JSON list of row strings")
        if len({len(r) for r in data}) != 1:
            raise AnswerError("the grid's rows have different lengths")
        return tuple(data)

    def near_misses(self, v, rng):
        i, j = rng.randrange(len(v)), rng.randrange(len(v[0]))
        other = next(c for c in self.alphabet + "?" if c != v[i][j])
        flipped = v[:i] + (v[i][:j] + other + v[i][j + 1 :],) + v[i + 1 :]
        return [flipped] + ([v[:-1]] if len(v) > 1 else [])


def graph_of(n: int, edges) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The canonical graph value: (n, sorted unique (u, v) pairs with u < v, no loops)."""
    return n, tuple(sorted({(min(u, v), max(u, v)) for u, v in edges if u != v}))


@dataclass(frozen=True)
class Graph(Type):
    """An undirected simple graph on nodes 0..n-1, as the plain value (n, edges) with edges a
    sorted tuple of (u, v), u < v (see `graph_of`): mappers need no class to build one."""

    min_nodes: int = 1
    max_nodes: int = 12
    name: ClassVar[str] = "graph"
    answer_format: ClassVar[str] = (
        'a JSON object {"nodes": N, "edges": [[u, v], ...]} with nodes 0..N-1'
    )

    def check(self, v):
        if not (isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], int)):
            return f"not a (nodes, edges) pair: {v!r}"
        n, edges = v
        if not self.min_nodes <= n <= self.max_nodes:
            return f"{n} nodes is outside [{self.min_nodes}, {self.max_nodes}]"
        if not isinstance(edges, tuple) or not all(
            isinstance(e, tuple) and len(e) == 2 and all(isinstance(u, int) for u in e)
            for e in edges
        ):
            return "edges are not a tuple of (u, v) pairs"
        if v != graph_of(n, edges) or any(not 0 <= u < n for e in edges for u in e):
            return "edges are not sorted, unique, loop-free pairs of valid nodes"
        return None

    def sample(self, rng, level):
        n = rng.randint(
            max(self.min_nodes, 2), max(self.min_nodes, min(self.max_nodes, 3 + 2 * level))
        )
        p = rng.uniform(0.2, 0.5)
        return graph_of(n, [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < p])

    render_expr: ClassVar[str] = 'json.dumps({"nodes": v[0], "edges": [list(e) for e in v[1]]})'

    def parse(self, text):
        data = _json(text, "a graph")
        if not isinstance(data, dict) or set(data) != {"nodes", "edges"}:
            raise AnswerError('expected a JSON object with exactly the keys "nodes" and "edges"')
        n = _int(data["nodes"], "nodes")
        edges = data["edges"]
        if not isinstance(edges, list) or not all(
            isinstance(e, list) and len(e) == 2 for e in edges
        ):
            raise AnswerError("edges must be a list of [u, v] pairs")
        pairs = [(_int(a, "a node"), _int(b, "a node")) for a, b in edges]
        if any(not 0 <= u < n for e in pairs for u in e):
            raise AnswerError(f"an edge names a node outside 0..{n - 1}")
        return graph_of(n, pairs)

    def near_misses(self, v, rng):
        n, edges = v
        out = [(n + 1, edges)]
        if edges:
            out.append((n, edges[:-1]))
        missing = [(a, b) for a in range(n) for b in range(a + 1, n) if (a, b) not in edges]
        if missing:
            out.append(graph_of(n, edges + (rng.choice(missing),)))
        return out


@dataclass(frozen=True)
class IntSet(Type):
    min_size: int = 0
    max_size: int = 64
    lo: int = -(10**9)
    hi: int = 10**9
    name: ClassVar[str] = "int_set"
    answer_format: ClassVar[str] = "a JSON list of distinct integers in any order, such as [2, 7]"

    def check(self, v):
        if not isinstance(v, frozenset):
            return f"not a frozenset: {type(v).__name__}"
        if not self.min_size <= len(v) <= self.max_size:
            return f"size {len(v)} is outside [{self.min_size}, {self.max_size}]"
        if v and not (_all_ints(v) and self.lo <= min(v) and max(v) <= self.hi):
            return f"an element is not an integer in [{self.lo}, {self.hi}]"
        return None

    def sample(self, rng, level):
        lo, hi = _scaled(self.lo, self.hi, level, 10)
        want = rng.randint(
            max(self.min_size, 2), max(self.min_size, min(self.max_size, 3 + 3 * level))
        )
        return frozenset(rng.randint(lo, hi) for _ in range(want))

    render_expr: ClassVar[str] = "json.dumps(sorted(v))"

    def parse(self, text):
        data = _json(text, "a set of integers")
        if not isinstance(data, list):
            raise AnswerError("expected a JSON list of integers")
        values = _ints(data, "every element")
        if len(set(values)) != len(values):
            raise AnswerError("a set lists each element once; this answer repeats one")
        return frozenset(values)

    def near_misses(self, v, rng):
        out = [v | {max(v, default=0) + 1}]
        if v:
            out.append(v - {rng.choice(sorted(v))})
        return out


@dataclass(frozen=True)
class Poly(Type):
    """A polynomial with integer coefficients, highest power first, no leading zeros
    ((0,) is the zero polynomial): (1, -3, 2) is x^2 - 3x + 2."""

    max_degree: int = 12
    max_coef: int = 10**9
    name: ClassVar[str] = "poly"
    answer_format: ClassVar[str] = (
        "a JSON list of integer coefficients from the highest power down, such as [1, -3, 2]"
        " for x^2 - 3x + 2"
    )

    def check(self, v):
        if (
            not isinstance(v, tuple)
            or not v
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in v)
        ):
            return "not a non-empty tuple of integer coefficients"
        if len(v) > 1 and v[0] == 0:
            return "has a leading zero coefficient"
        if len(v) - 1 > self.max_degree or any(abs(c) > self.max_coef for c in v):
            return f"degree above {self.max_degree} or a coefficient above {self.max_coef}"
        return None

    def sample(self, rng, level):
        degree = rng.randint(1, min(self.max_degree, 1 + level))
        bound = min(self.max_coef, 3 * level)
        coefs = [rng.choice([c for c in range(-bound, bound + 1) if c])]
        return tuple(coefs + [rng.randint(-bound, bound) for _ in range(degree)])

    render_expr: ClassVar[str] = "json.dumps(list(v))"

    def parse(self, text):
        data = _json(text, "a coefficient list")
        if not isinstance(data, list) or not data:
            raise AnswerError("expected a non-empty JSON list of coefficients")
        coefs = _ints(data, "every coefficient")
        if len(coefs) > 1 and coefs[0] == 0:
            raise AnswerError("the first (highest-power) coefficient must not be 0")
        return coefs

    def near_misses(self, v, rng):
        out = [v[:-1] + (v[-1] + 1,)]
        if len(v) > 1:
            out.append(v[1:] if v[1] != 0 else (v[0] + 1,) + v[1:])
        return out


@dataclass(frozen=True)
class Records(Type):
    """A table of (name, value) rows: names are lowercase words, values integers."""

    min_rows: int = 1
    max_rows: int = 20
    name: ClassVar[str] = "records"
    answer_format: ClassVar[str] = (
        'a JSON list of [name, value] rows, such as [["ann", 3], ["bo", 5]]'
    )

    def check(self, v):
        if not isinstance(v, tuple) or not self.min_rows <= len(v) <= self.max_rows:
            return f"not a tuple of {self.min_rows}..{self.max_rows} rows"
        for row in v:
            if not (isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], str)):
                return f"row {row!r} is not a (name, value) pair"
            if isinstance(row[1], bool) or not isinstance(row[1], int):
                return f"row {row!r} has a value that is not an integer"
        return None

    def sample(self, rng, level):
        names = ["ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo", "kim", "lee"]
        n = rng.randint(
            max(self.min_rows, 2), max(self.min_rows, min(self.max_rows, 2 + 2 * level))
        )
        return tuple((rng.choice(names), rng.randint(0, 10 * level)) for _ in range(n))

    render_expr: ClassVar[str] = "json.dumps([list(r) for r in v])"

    def parse(self, text):
        data = _json(text, "a table")
        if not isinstance(data, list):
            raise AnswerError("expected a JSON list of [name, value] rows")
        rows = []
        for row in data:
            if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)):
                raise AnswerError(f"row {json.dumps(row)} is not a [name, value] pair")
            rows.append((row[0], _int(row[1], "a value")))
        return tuple(rows)

    def near_misses(self, v, rng):
        out = [v + (("zed", 0),)]
        if v:
            out.append(v[:-1])
            out.append(v[:-1] + ((v[-1][0], v[-1][1] + 1),))
        return out


TYPES: dict[str, type[Type]] = {
    t.name: t
    for t in (
        Int,
        Bool,
        Rational,
        IntList,
        Str,
        StrList,
        Date,
        Matrix,
        Grid,
        Graph,
        IntSet,
        Poly,
        Records,
    )
}
