"""A pass-rate curriculum over the RL task stream (`rl.curriculum`, issue 32 item 1).

Why: GRPO's advantage is zero in a group whose members all fail (or all pass), so buckets of
tasks the policy never solves (RACES's SEQ-3/4/5 for a small model) train on nothing however
long the run; adaptive batches (`rl.adaptive_batch`) drop such groups but never look for live
ones. The curriculum looks for them: it draws tasks from the buckets whose recent group pass
rate lies inside a target band, the rates that give group-relative signal.

What it does. It wraps any positional task stream `stream(p)` (the pipeline's: the
`data.train` mixture past SFT's items), so it works with every task source and keeps tirl's
rule that the trainer asks tasks by position (`RLTrainer.task_at(i)`):

- A task's bucket is the tuple of its `meta` values for `key` (`source` is `Task.source`),
  named by joining them with ":" (`sequential:3`). Buckets are found by reading the stream:
  `lookahead` items at the start, and more whenever a bucket's queue runs dry.
- Each bucket keeps the pass rates (share of correct members) of its last `window` finished
  groups; its rate is their mean, and it counts once it has `min_groups` of them.
- Trainer position i gets a bucket drawn from `bucket_weights` (below) with the uniform number
  `unit_draw(seed, i)`, and that bucket's oldest unused stream position; a bucket with none
  queued scans up to `lookahead` more items (queueing what it passes, at most `lookahead` per
  bucket; what overflows is skipped for good), and if the scan finds none the oldest queued
  item of any bucket is taken. Each stream item is used at most once.
- With `order_by` (a numeric key field, higher = harder) buckets are opened level by level:
  the easiest level first, the next once `widen_share` of the hardest open level's buckets
  are above the band (`should_widen`). The frontier never moves back.

Deterministic and resumable: the draw for position i depends only on the seed, i and the
state (positions assigned, queues, rates, frontier), which is plain data (`state_dict`) and
goes into the RL checkpoint; the rates change only through `observe`, which the trainer calls
for every finished group in task order, on every rank alike. So a resumed run draws exactly
the stream the uninterrupted one would have.

Not covered: "neighbours of unseen environments" (a bucket per environment set would be one
per composite); rates are per bucket, with no sharing between neighbouring buckets. Under
verl the curriculum runs in a dataset class (`tirl.integrations.verl.curriculum`) for verl's
synchronous trainer only, without adaptive batches or partial rollouts (docs/verl.md).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tirl.config import ConfigError
from tirl.tasks.base import Task

Stream = Callable[[int], Task]  # the p-th task of the underlying stream
WHERE = "rl.curriculum"


@dataclass(frozen=True)
class BucketView:
    """What `bucket_weights` needs of one bucket: its name, difficulty level (None without
    `order_by`), mean recent pass rate (None until it has `min_groups` groups)."""

    name: str
    level: float | None
    rate: float | None


def unit_draw(seed: int, position: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, position): the draw of trainer position
    `position`, independent of when or on which rank it is made."""
    digest = hashlib.blake2b(f"curriculum:{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def bucket_rate(rates: Sequence[float], min_groups: int) -> float | None:
    """Mean of a bucket's recent group pass rates, or None with fewer than `min_groups`."""
    return sum(rates) / len(rates) if rates and len(rates) >= min_groups else None


def open_buckets(buckets: Sequence[BucketView], frontier: float | None) -> list[BucketView]:
    """The buckets at or below the frontier level (all of them without levels)."""
    if frontier is None:
        return list(buckets)
    return [b for b in buckets if b.level is None or b.level <= frontier]


def next_level(buckets: Sequence[BucketView], frontier: float | None) -> float | None:
    """The lowest known level above `frontier`, or None when there is none."""
    if frontier is None:
        return None
    above = [b.level for b in buckets if b.level is not None and b.level > frontier]
    return min(above) if above else None


def bucket_weights(
    buckets: Sequence[BucketView],
    frontier: float | None,
    band: tuple[float, float],
    explore: float,
) -> dict[str, float]:
    """Sampling probabilities by bucket name (summing to 1). Of the open buckets, those whose
    rate is inside `band` (inclusive) share 1 - `explore` equally; the rest of the open
    buckets (untried, above or below the band) and the buckets of the next level share
    `explore`. When either group is empty the other takes everything."""
    low, high = band
    opened = open_buckets(buckets, frontier)
    live = [b.name for b in opened if b.rate is not None and low <= b.rate <= high]
    probe_level = next_level(buckets, frontier)
    probes = [b.name for b in opened if b.name not in live]
    probes += [b.name for b in buckets if probe_level is not None and b.level == probe_level]
    if not live:
        return {name: 1 / len(probes) for name in probes}
    if not probes or explore == 0:
        return {name: 1 / len(live) for name in live}
    weights = {name: (1 - explore) / len(live) for name in live}
    weights.update({name: explore / len(probes) for name in probes})
    return weights


def should_widen(
    buckets: Sequence[BucketView], frontier: float | None, high: float, widen_share: float
) -> bool:
    """Whether to open the next level: one exists and at least `widen_share` of the buckets
    of the hardest open level (the frontier's) have a rate above `high` (saturated: their
    groups are mostly all correct). Easier levels, saturated long ago, do not count: they
    would open every level at once."""
    if next_level(buckets, frontier) is None:
        return False
    hardest = [b for b in buckets if b.level == frontier]
    saturated = [b for b in hardest if b.rate is not None and b.rate > high]
    return bool(saturated) and len(saturated) >= widen_share * len(hardest)


def pick(weights: Mapping[str, float], u: float) -> str:
    """The bucket whose slice of [0, 1) holds `u`, slices in name order."""
    names = sorted(weights)
    total = 0.0
    for name in names:
        total += weights[name]
        if u < total:
            return name
    return names[-1]  # rounding: u just below 1


def check_bucket_fields(cfg, task: Task) -> None:
    """ConfigError naming `rl.curriculum.key` unless `task` (the stream's first) has every key
    field in its meta (or it is `source`)."""
    fields = {"source", *task.meta}
    for name in cfg.key:
        if name not in fields:
            raise ConfigError(
                f"{WHERE}.key: {name!r} is not a field of the tasks' meta (task {task.id}"
                f" has: {', '.join(sorted(fields))})",
                f"{WHERE}.key",
            )


class Curriculum:
    """The curriculum over `stream` (module docstring), for settings `cfg`
    (`tirl.run.phases.CurriculumConfig`). `task_at(i)` is trainer position i's task;
    `assign(n)` fixes the draws of positions below n; `observe(i, pass_rate)` feeds back a
    finished group; `step_metrics()` gives the record's `curriculum/...` keys."""

    def __init__(self, stream: Stream, cfg, seed: int = 0) -> None:
        self.stream = stream
        self.cfg = cfg
        self.seed = seed
        self.assigned: list[tuple[int, str]] = []  # trainer position -> (stream position, bucket)
        self.scanned = 0  # stream positions read so far
        self.queues: dict[str, list[int]] = {}  # bucket -> unused stream positions, oldest first
        self.levels: dict[str, float | None] = {}
        self.rates: dict[str, list[float]] = {}  # bucket -> last `window` group pass rates
        self.groups: Counter[str] = Counter()  # groups observed per bucket, all time
        self.drawn: Counter[str] = Counter()  # tasks drawn per bucket since the last record
        self.frontier: float | None = None
        self.check_fields(stream(0))
        self.scan(cfg.lookahead)

    # ------------------------------------------------------------------ buckets
    def check_fields(self, task: Task) -> None:
        check_bucket_fields(self.cfg, task)

    def bucket_of(self, task: Task) -> tuple[str, float | None]:
        """(name, level) of `task`'s bucket."""
        values = []
        for name in self.cfg.key:
            value = task.source if name == "source" else task.meta.get(name)
            values.append(str(value).replace("/", "_"))
        level = None
        if self.cfg.order_by is not None:
            value = task.meta.get(self.cfg.order_by)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(
                    f"{WHERE}.order_by: {self.cfg.order_by!r} must be a number in every task's"
                    f" meta, task {task.id} has {value!r}",
                    f"{WHERE}.order_by",
                )
            level = float(value)
        return ":".join(values), level

    def scan(self, n: int, want: str | None = None) -> bool:
        """Read up to `n` more stream items into their buckets' queues; stop early (True) once
        one of bucket `want` is queued."""
        for _ in range(n):
            position = self.scanned
            self.scanned += 1
            name, level = self.bucket_of(self.stream(position))
            if name not in self.levels:
                self.levels[name] = level
                self.queues[name] = []
                self.rates[name] = []
                if self.frontier is None or (level is not None and level < self.frontier):
                    self.frontier = level  # the easiest level found so far opens first
            queue = self.queues[name]
            if len(queue) < self.cfg.lookahead:
                queue.append(position)
            if name == want and queue:
                return True
        return False

    def views(self) -> list[BucketView]:
        return [
            BucketView(name, self.levels[name], bucket_rate(self.rates[name], self.cfg.min_groups))
            for name in sorted(self.levels)
        ]

    # ------------------------------------------------------------------ the stream
    def assign(self, n: int) -> None:
        """Draw the buckets and stream items of trainer positions up to `n` (exclusive)."""
        band = (self.cfg.band[0], self.cfg.band[1])
        while len(self.assigned) < n:
            i = len(self.assigned)
            name = pick(bucket_weights(self.views(), self.frontier, band, self.cfg.explore),
                        unit_draw(self.seed, i))  # fmt: skip
            if not self.queues[name] and not self.scan(self.cfg.lookahead, want=name):
                # none within the lookahead: the oldest item queued anywhere
                name = min((q[0], b) for b, q in self.queues.items() if q)[1]
            self.assigned.append((self.queues[name].pop(0), name))
            self.drawn[name] += 1

    def stream_position(self, i: int) -> int:
        """Trainer position i's stream position (drawn now if it was not yet)."""
        self.assign(i + 1)
        return self.assigned[i][0]

    def task_at(self, i: int) -> Task:
        """Trainer position i's task (drawn now if it was not yet)."""
        return self.stream(self.stream_position(i))

    def observe(self, i: int, pass_rate: float) -> None:
        """Feed back the pass rate (share of correct members) of position i's finished group;
        may open the next level."""
        name = self.assigned[i][1]
        rates = self.rates[name]
        rates.append(float(pass_rate))
        del rates[: max(0, len(rates) - self.cfg.window)]
        self.groups[name] += 1
        views = self.views()
        if should_widen(views, self.frontier, self.cfg.band[1], self.cfg.widen_share):
            self.frontier = next_level(views, self.frontier)

    # ------------------------------------------------------------------ logging and state
    def step_metrics(self) -> dict[str, float]:
        """The record's `curriculum/...` keys: per bucket its rate (once it counts) and its
        share of the tasks drawn since the last record; the open level, the buckets open and
        in band. Resets the draw counts."""
        views = self.views()
        total = sum(self.drawn.values())
        low, high = self.cfg.band
        metrics: dict[str, float] = {}
        for b in views:
            if b.rate is not None:
                metrics[f"curriculum/{b.name}/pass_rate"] = b.rate
            metrics[f"curriculum/{b.name}/share"] = self.drawn[b.name] / total if total else 0.0
        opened = open_buckets(views, self.frontier)
        metrics["curriculum/buckets_open"] = len(opened)
        metrics["curriculum/buckets_in_band"] = sum(
            b.rate is not None and low <= b.rate <= high for b in opened
        )
        if self.frontier is not None:
            metrics["curriculum/frontier"] = self.frontier
        self.drawn.clear()
        return metrics

    def state_dict(self) -> dict:
        """The whole state as plain data (for the RL checkpoint)."""
        return {
            "assigned": [list(a) for a in self.assigned],
            "scanned": self.scanned,
            "queues": {k: list(v) for k, v in self.queues.items()},
            "levels": dict(self.levels),
            "rates": {k: list(v) for k, v in self.rates.items()},
            "groups": dict(self.groups),
            "drawn": dict(self.drawn),
            "frontier": self.frontier,
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.assigned = [(int(p), str(b)) for p, b in state["assigned"]]
        self.scanned = int(state["scanned"])
        self.queues = {k: list(v) for k, v in state["queues"].items()}
        self.levels = dict(state["levels"])
        self.rates = {k: list(v) for k, v in state["rates"].items()}
        self.groups = Counter(state["groups"])
        self.drawn = Counter(state["drawn"])
        self.frontier = state["frontier"]
