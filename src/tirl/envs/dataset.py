"""Datasets of composite RACES tasks: an operator mixture over searched trajectories.

`build_tasks` runs the search (`tirl.envs.search`) for one split and turns each composite it
yields into a task of an operator drawn from the mixture (`tirl.envs.operators`). Each item is
kept only in the split its content hashes to (`tirl.envs.seeding.split_of` over the path and
x_0), so train and test never share an item, whatever the seeds. `write_tasks` stores them as
JSONL or Parquet (one row per task; `OperatorTask.from_dict` reads a row back).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tirl.envs.core import Environments
from tirl.envs.operators import OPERATORS, OperatorTask, make_task
from tirl.envs.search import SearchConfig, sized_searches
from tirl.envs.seeding import SPLITS, choice, split_of

DEFAULT_MIXTURE = {"sequential": 0.4, "parallel": 0.2, "sort": 0.2, "select": 0.2}


@dataclass(frozen=True)
class BuildConfig:
    n: int = 1000
    seed: int = 0
    split: str = "train"
    mixture: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIXTURE))
    min_size: int = 2
    max_size: int = 5
    level: int = 1
    inputs_per_composite: int = 1

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not 1 <= self.min_size <= self.max_size <= MAX_SIZE:
            raise ValueError(
                f"sizes must satisfy 1 <= min <= max <= {MAX_SIZE},"
                f" got {self.min_size}-{self.max_size}"
            )
        unknown = set(self.mixture) - set(OPERATORS)
        if unknown:
            raise ValueError(
                f"unknown operator {sorted(unknown)[0]!r} in the mixture;"
                f" expected some of {', '.join(OPERATORS)}"
            )
        if any(w < 0 for w in self.mixture.values()) or sum(self.mixture.values()) <= 0:
            raise ValueError("mixture weights must be non-negative and not all zero")


def parse_mixture(text: str) -> dict[str, float]:
    """'sequential=0.5,sort=0.5' -> {'sequential': 0.5, 'sort': 0.5} (ValueError if malformed)."""
    mixture = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        if not sep:
            raise ValueError(f"mixture entry {part!r} is not operator=weight")
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(f"mixture weight {weight!r} of {name!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"mixture weight of {name!r} must be a finite number >= 0, got {weight!r}"
            )
        mixture[name.strip()] = value
    return mixture


# RACES studies sizes 2-6; the search's cost grows with the size (about 0.7 s per 20 tasks and
# step here), and so do the prompts, so longer chains are refused rather than left to crawl.
MAX_SIZE = 12


def parse_sizes(text: str) -> tuple[int, int]:
    """'2-5' -> (2, 5); '3' -> (3, 3); sizes in 1..MAX_SIZE."""
    lo, _, hi = text.partition("-")
    try:
        sizes = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"sizes must look like 2-5, got {text!r}") from None
    if not 1 <= sizes[0] <= sizes[1] <= MAX_SIZE:
        raise ValueError(f"sizes must satisfy 1 <= min <= max <= {MAX_SIZE}, got {text!r}")
    return sizes


_quoted = json.encoder.encode_basestring_ascii  # a str as `json.dumps` writes it


def _content(names: tuple[str, ...], x0: str) -> str:
    """`json.dumps([names, x0])`, what decides a composite's split, written directly (the split
    of every composite is hashed: `json.dumps` costs ~2 us of it)."""
    return "[[" + ", ".join(map(_quoted, names)) + "], " + _quoted(x0) + "]"


def build_tasks(
    registry: Environments, config: BuildConfig, counts: Counter[str] | None = None
) -> Iterator[OperatorTask]:
    """Up to config.n tasks (fewer only if the search runs out of composites). Each task's size
    is drawn uniformly from [min_size, max_size] and its operator from the mixture. One search
    per size (min_size = max_size = s) keeps sizes independent: a search only checks and yields
    composites of its own size; the searches share one walk of the search tree
    (`tirl.envs.search.sized_searches`), so the levels below a size are run once for all, and
    the walk drops the states all of them have passed. `counts`, if given,
    gets the searches' counts (`search`) and "other_split": composites dropped because their
    content hashes to the other split."""
    rng = random.Random(f"races-build/{config.seed}/{config.split}")
    operators = list(config.mixture)
    # `rng.choices(operators, weights)[0]`, the same draw without its per-call setup
    cumulative = list(itertools.accumulate(config.mixture[o] for o in operators))
    total, last = cumulative[-1] + 0.0, len(operators) - 1
    searches = sized_searches(
        registry,
        config.seed,
        SearchConfig(level=config.level, inputs_per_composite=config.inputs_per_composite),
        config.split,
        range(config.min_size, config.max_size + 1),
        counts,
    )
    made = 0
    sizes = sorted(searches)
    while made < config.n and sizes:
        size = choice(rng, sizes)
        traj = next(searches[size], None)
        if traj is None:  # this size is exhausted; the others go on
            sizes.remove(size)
            continue
        if split_of("races", _content(traj.names(), traj.rendered()[0])) != config.split:
            if counts is not None:
                counts["other_split"] += 1
            continue
        operator = operators[bisect.bisect(cumulative, rng.random() * total, 0, last)]
        task = make_task(operator, traj, registry, rng)
        # the new task's own (empty) meta dict, filled in place: `replace` costs ~5 us a task
        task.meta.update(split=config.split, size=traj.size, seed=config.seed)
        yield task
        made += 1


def write_tasks(tasks: Iterable[OperatorTask], path: str | Path) -> int:
    """Write tasks as JSONL, or as Parquet when the path ends in .parquet; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [t.to_dict() for t in tasks]
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise RuntimeError("writing Parquet needs pyarrow: pip install pyarrow") from None
        for row in rows:
            row["meta"] = json.dumps(row["meta"])
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with path.open("w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


def read_tasks(path: str | Path) -> list[OperatorTask]:
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        for row in rows:
            row["meta"] = json.loads(row["meta"])
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [OperatorTask.from_dict(r) for r in rows]
