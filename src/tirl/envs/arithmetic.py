"""Seeded arithmetic tasks that are easy with code and hard without it.

Three kinds, each with an integer gold answer:

- ``product``: ``Compute 483 * 917.`` (two numbers of `digits` digits)
- ``mod``:     ``Compute 4821 * 3777 mod 997.`` (a product reduced modulo a 3-digit number)
- ``chain``:   ``Compute 483 * 917 + 650 - 128.`` (a product followed by two more operations)

A small model cannot multiply multi-digit numbers in its head, but it can learn to copy the
expression into a ```python block and copy the interpreter's answer into ``\\boxed{}``.
Items are derived from hashed seeds and assigned to train or test by their content
(`tirl.envs.seeding`), so the two splits never share an item.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from tirl.envs.seeding import item_rng, split_of

ENV_NAME = "arithmetic"
KINDS = ("product", "mod", "chain")
MAX_DRAWS_PER_ITEM = 1000  # rejection sampling for the split; the expected number is 8/7 or 8


@dataclass(frozen=True)
class ArithmeticItem:
    """One verifiable problem: what the model is asked, the gold answer, and the expression
    that computes it (used to synthesize code-integrated demonstrations)."""

    question: str
    answer: str
    expression: str
    kind: str
    split: str
    index: int
    meta: dict = field(default_factory=dict, compare=False)


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _draw(rng: random.Random, kind: str, digits: int) -> tuple[str, str, int]:
    """(question, python expression, answer) for one item of `kind`."""
    a, b = _number(rng, digits), _number(rng, digits)
    if kind == "product":
        return f"Compute {a} * {b}.", f"{a} * {b}", a * b
    if kind == "mod":
        m = rng.randint(101, 997)
        return f"Compute {a} * {b} mod {m}.", f"{a} * {b} % {m}", a * b % m
    if kind == "chain":
        c, d = _number(rng, digits), _number(rng, digits)
        return f"Compute {a} * {b} + {c} - {d}.", f"{a} * {b} + {c} - {d}", a * b + c - d
    raise ValueError(f"unknown arithmetic kind {kind!r}; expected one of {KINDS}")


@dataclass(frozen=True)
class ArithmeticEnv:
    """A task family: `kinds` drawn uniformly, numbers of `digits` digits."""

    kinds: tuple[str, ...] = KINDS
    digits: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(
                f"arithmetic kinds must be a non-empty subset of {KINDS}, got {self.kinds}"
            )
        if not 1 <= self.digits <= 9:
            raise ValueError(f"arithmetic digits must be in 1..9, got {self.digits}")

    @property
    def config_key(self) -> str:
        return f"kinds={','.join(self.kinds)};digits={self.digits}"

    def item(self, split: str, index: int) -> ArithmeticItem:
        rng = item_rng(ENV_NAME, self.config_key, split, self.seed, index)
        for _ in range(MAX_DRAWS_PER_ITEM):
            kind = rng.choice(self.kinds)
            question, expression, answer = _draw(rng, kind, self.digits)
            if split_of(ENV_NAME, question) == split:
                return ArithmeticItem(question, str(answer), expression, kind, split, index)
        raise RuntimeError(f"could not draw a {split} item after {MAX_DRAWS_PER_ITEM} tries")

    def items(self, split: str, n: int, start: int = 0) -> list[ArithmeticItem]:
        return [self.item(split, i) for i in range(start, start + n)]

    def stream(self, split: str, start: int = 0) -> Iterator[ArithmeticItem]:
        index = start
        while True:
            yield self.item(split, index)
            index += 1
