"""Seeds derived from a hash, so that no two (environment, config, split, seed, index) share one.

Invariant 5 of docs/architecture.md: every generated item comes from a hash of where it
belongs. Train and test are kept apart twice over: their seeds are derived from different
strings, and each item is assigned to exactly one split by a hash of its own content
(`split_of`), so even two different seeds that happen to draw the same numbers cannot put one
item in both splits.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

SPLITS = ("train", "test")
TEST_SHARE_DENOMINATOR = 8  # one item in 8 of the whole item space belongs to the test split
T = TypeVar("T")


def _digest(*parts: object) -> int:
    if all(type(p) is str or type(p) is int for p in parts):
        blob = "[" + ", ".join(map(_json_atom, parts)) + "]"
    else:
        blob = json.dumps(parts, sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "big")


# Strings and integers (the parts `split_of` and `item_rng` hash) as `json.dumps` writes them:
# written directly, since `json.dumps` with `sort_keys` or `default` builds a new encoder per
# call (~3 us), and a build hashes every composite and seeds every root
_quoted = json.encoder.encode_basestring_ascii  # (ensure_ascii, as `json.dumps`)


def _json_atom(part: str | int) -> str:
    return _quoted(part) if type(part) is str else int.__repr__(part)


def item_rng(env: str, config_key: str, split: str, seed: int, index: int) -> random.Random:
    """A private random generator for one item."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return random.Random(_digest(env, config_key, split, seed, index))


def split_of(env: str, content: str) -> str:
    """The one split an item belongs to, decided by its content alone."""
    return "test" if _digest(env, content) % TEST_SHARE_DENOMINATOR == 0 else "train"


def unit_hash(env: str, content: str) -> float:
    """A number in [0, 1) decided by (env, content) alone: holds out any share of a space."""
    return _digest(env, content) / 2**64


# The search and the operators draw a full random order of a list again and again (every
# frontier state orders all its candidates). `random.Random.sample(xs, len(xs))` and
# `random.Random.shuffle` spend most of their time in a Python-level `_randbelow` call per
# element; the two functions below make the very same draws inline (one `getrandbits(k)` per
# try, retried while the value is >= the bound, exactly as CPython's
# `_randbelow_with_getrandbits`), so they return the same order and leave the generator in the
# same state, about three times faster (`choice` likewise, for `build_tasks`'s draw of a size
# per task). Other generators (subclasses that draw differently) go through the library
# functions. `tests/test_envs_races.py` checks them against the library.

_BOUNDS: dict[int, tuple[tuple[int, int], ...]] = {}  # n -> ((m, m.bit_length()) for m = n..1)


def _bounds(n: int) -> tuple[tuple[int, int], ...]:
    found = _BOUNDS.get(n)
    if found is None:
        found = _BOUNDS[n] = tuple((m, m.bit_length()) for m in range(n, 0, -1))
    return found


def _plain(rng: random.Random) -> bool:
    return type(rng) is random.Random


def permutation(rng: random.Random, items: Sequence[T]) -> list[T]:
    """`rng.sample(items, len(items))`: all of `items` in a random order, with the same draws."""
    if not _plain(rng):
        return rng.sample(items, len(items))
    pool = list(items)
    out: list[T] = []
    append = out.append
    bits = rng.getrandbits
    # sample() uses its pool method whenever k == n (the set method is only for k << n)
    for m, k in _bounds(len(pool)):
        r = bits(k)
        while r >= m:
            r = bits(k)
        append(pool[r])
        pool[r] = pool[m - 1]
    return out


def choice(rng: random.Random, items: Sequence[T]) -> T:
    """`rng.choice(items)` (non-empty `items`), with the same draw."""
    if not _plain(rng):
        return rng.choice(items)
    n = len(items)
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return items[r]


def shuffle(rng: random.Random, items: list[Any]) -> None:
    """`rng.shuffle(items)`, in place, with the same draws."""
    if not _plain(rng):
        rng.shuffle(items)
        return
    bits = rng.getrandbits
    for m, k in _bounds(len(items))[:-1]:  # i = n-1 .. 1 draws below i + 1 = m
        r = bits(k)
        while r >= m:
            r = bits(k)
        items[m - 1], items[r] = items[r], items[m - 1]


def advance(rng: random.Random, n: int) -> None:
    """Make the draws of `permutation(rng, <n items>)` without building the order: the generator
    ends in the same state, for about half the cost."""
    if not _plain(rng):
        rng.sample(range(n), n)
        return
    bits = rng.getrandbits
    for m, k in _bounds(n):
        if bits(k) >= m:
            while bits(k) >= m:
                pass


class Drawing:
    """The order `permutation(rng, items)` gives, drawn one item at a time as it is iterated;
    `finish()` makes the draws still due, so that `rng` ends where `permutation` leaves it.
    For a consumer that needs only the first few items of a long random order."""

    __slots__ = ("_rng", "_pool", "_bounds", "_i", "_done")

    def __init__(self, rng: random.Random, items: Sequence[Any]) -> None:
        self._rng = rng
        self._i = 0
        if _plain(rng):
            self._pool = list(items)
            self._bounds = _bounds(len(self._pool))
            self._done = False
        else:  # drawn at once by the library
            self._pool = rng.sample(items, len(items))
            self._bounds = ()
            self._done = True

    def __iter__(self) -> Drawing:
        return self

    def __next__(self) -> Any:
        if self._done:
            if self._i < len(self._pool):
                self._i += 1
                return self._pool[self._i - 1]
            raise StopIteration
        i = self._i
        if i >= len(self._bounds):
            raise StopIteration
        m, k = self._bounds[i]
        bits = self._rng.getrandbits
        r = bits(k)
        while r >= m:
            r = bits(k)
        pool = self._pool
        item = pool[r]
        pool[r] = pool[m - 1]
        self._i = i + 1
        return item

    def finish(self) -> None:
        if self._done:
            return
        bits = self._rng.getrandbits
        for m, k in self._bounds[self._i :]:
            if bits(k) >= m:
                while bits(k) >= m:
                    pass
        self._i = len(self._bounds)
        self._done = True
        self._pool = []


# The search orders each state's candidates by a key of the state's own, derived from its path:
# a root's key from where it is (seed, split, round, position), a child's from its parent's key
# and the environment that made it. blake2b over 8 bytes plus a name costs well under a
# microsecond, and so does drawing an order from a hash of the key (`hashed_order`), against
# ~7 us to seed a `random.Random` (its Mersenne Twister state is 2.5 KB): a search orders one
# state per ~2 tasks, and a state uses ~7 items of its order.


def path_key(*parts: object) -> bytes:
    """The key of a root: 8 bytes from a hash of `parts` (JSON-encodable)."""
    return hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()


def child_key(key: bytes, name: str) -> bytes:
    """The key of the state that environment `name` made from the state keyed `key`."""
    return hashlib.blake2b(key + name.encode(), digest_size=8).digest()


def _hash_bits(key: bytes, block: int) -> int:
    return int.from_bytes(hashlib.blake2b(key + block.to_bytes(4, "big")).digest(), "big")


def hashed_order(key: bytes, items: Sequence[T]) -> Iterator[T]:
    """All of `items` in a random order fixed by `key`, drawn one item at a time as iterated
    (a Fisher-Yates shuffle as in `permutation`, its k-bit draws taken from blake2b(key, block)
    512 bits at a time, a draw >= the bound drawn again, so every order is equally likely)."""
    pool = list(items)
    block, bits, left = 0, _hash_bits(key, 0), 512
    for m, k in _bounds(len(pool)):
        mask = (1 << k) - 1
        while True:
            if left < k:
                block += 1
                bits, left = _hash_bits(key, block), 512
            r = bits & mask
            bits >>= k
            left -= k
            if r < m:
                break
        yield pool[r]
        pool[r] = pool[m - 1]
