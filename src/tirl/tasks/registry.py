"""Task sources by name, and weighted mixtures of them.

A source is registered with its parameters as a dataclass (`@register_source("name")`, from
`tirl.tasks.registration`, on a class whose fields are its config keys); it is built here with
`tirl.config.from_dict`, so a misspelt key or a value out of range is a one-line `ConfigError`
naming `data.train[0].key`. A config entry is a mapping: `{source: NAME, weight: W, <the
source's keys>}`. This module imports the built-in sources (`tirl.tasks.sources`), so the
`SOURCES` it re-exports holds them; they import only `tirl.tasks.registration`, never this
module.

`Mixture` interleaves sources by weight, deterministically: position i of a split goes to the
source whose smooth weighted round-robin turn it is (every source gets its share of every
window, exactly), and that source's own next index. So a stream restarted at position i
continues with exactly the tasks an uninterrupted run would have seen, and the two splits never
share an item because each source keeps its splits apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import tirl.tasks.sources  # noqa: F401  (registers the built-in sources)
from tirl.config import ConfigError, from_dict
from tirl.tasks.base import SPLITS, Task, TaskSource
from tirl.tasks.registration import SOURCES, register_source

__all__ = [
    "EVAL_ENTRY_KEYS",
    "SOURCES",
    "Mixture",
    "entry_weight",
    "eval_set_tasks",
    "make_source",
    "register_source",
    "source_names",
]


def source_names() -> list[str]:
    return list(SOURCES)


def make_source(entry: Mapping[str, Any], where: str = "source", seed: int = 0) -> TaskSource:
    """The source an entry names, with its parameters checked (ConfigError naming `where`).
    `weight` is the mixture's business and is ignored here; `seed` fills a source's `seed`
    field when the entry does not set one."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping with a 'source' key, got {entry!r}", where)
    name = entry.get("source")
    if name not in SOURCES:
        raise ConfigError(
            f"{where}.source: unknown task source {name!r}; registered: {', '.join(sorted(SOURCES))}",
            f"{where}.source",
        )
    cls = SOURCES[name]
    params = {k: v for k, v in entry.items() if k not in ("source", "weight")}
    if "seed" in {f.name for f in dataclasses.fields(cls)} and "seed" not in params:
        params["seed"] = seed
    try:
        return from_dict(cls, params, where)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # the source's own check of its parameters
        raise ConfigError(f"{where}: {e}", where) from None


def entry_weight(entry: Mapping[str, Any], where: str) -> float:
    """The `weight` of a mixture entry (default 1); ConfigError unless a finite number > 0."""
    weight = entry.get("weight", 1.0) if isinstance(entry, Mapping) else 1.0
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ConfigError(
            f"{where}.weight: must be a number > 0, got {weight!r}", f"{where}.weight"
        )
    if weight == float("inf"):
        raise ConfigError(f"{where}.weight: must be finite, got {weight!r}", f"{where}.weight")
    return float(weight)


class Mixture:
    """Weighted, deterministic interleaving of sources (see the module doc). `item(split, i)`
    is the i-th task of the mixture's `split`."""

    def __init__(self, sources: Sequence[TaskSource], weights: Sequence[float]) -> None:
        if not sources or len(sources) != len(weights):
            raise ValueError("a mixture needs one weight per source, and at least one source")
        if any(not w > 0 for w in weights):
            raise ValueError(f"mixture weights must be > 0, got {list(weights)}")
        self.sources = list(sources)
        self.weights = [w / sum(weights) for w in weights]
        self._turns: list[tuple[int, int]] = []  # position -> (source, that source's index)
        self._credit = [0.0] * len(sources)
        self._counts = [0] * len(sources)

    @classmethod
    def from_entries(cls, entries: Sequence[Mapping[str, Any]], where: str, seed: int = 0):
        if not entries:
            raise ConfigError(f"{where}: name at least one task source", where)
        sources = [make_source(e, f"{where}[{i}]", seed) for i, e in enumerate(entries)]
        weights = [entry_weight(e, f"{where}[{i}]") for i, e in enumerate(entries)]
        return cls(sources, weights)

    def turn(self, position: int) -> tuple[int, int]:
        """(source number, index within that source) of the mixture's `position`."""
        while len(self._turns) <= position:  # smooth weighted round-robin
            for s, w in enumerate(self.weights):
                self._credit[s] += w
            best = max(range(len(self.sources)), key=lambda s: self._credit[s])
            self._credit[best] -= 1.0
            self._turns.append((best, self._counts[best]))
            self._counts[best] += 1
        return self._turns[position]

    def item(self, split: str, position: int) -> Task:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        source, index = self.turn(position)
        return self.sources[source].item(split, index)

    def items(self, split: str, n: int, start: int = 0) -> list[Task]:
        return [self.item(split, i) for i in range(start, start + n)]

    def source_of(self, position: int) -> TaskSource:
        return self.sources[self.turn(position)[0]]


# Keys of an evaluation-set entry (`data.eval`) that are the evaluation's own; the rest name a
# task source.
EVAL_ENTRY_KEYS = ("name", "items")


def eval_set_tasks(
    entries: Sequence[Mapping[str, Any]], mixture: Mixture, seed: int = 0
) -> dict[str, list[Task]]:
    """The tasks of every evaluation set (`data.eval` entries), by name: the `test` split of
    the entry's own source, or without one the held-out `test` split of the train `mixture`;
    at most `items` each (default 200), each item once (a finite source cycles)."""
    sets = {}
    for i, entry in enumerate(entries):
        params = {k: v for k, v in entry.items() if k not in EVAL_ENTRY_KEYS}
        items = int(entry.get("items", 200))
        if params:
            source = make_source(params, f"data.eval[{i}]", seed)
            size = source.size("test")
            count = items if size is None else min(items, size)
            tasks = [source.item("test", j) for j in range(count)]
        else:
            tasks = mixture.items("test", items)
        sets[entry["name"]] = list({t.id: t for t in tasks}.values())
    return sets
