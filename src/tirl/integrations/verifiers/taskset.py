"""Any tirl task source as a `verifiers` (v1) taskset, rewarded by the task's own scorer.

verifiers 0.4.0 describes work as a `Taskset` that yields `Task`s: an immutable `TaskData` row
(the prompt and whatever scoring needs) plus the task's behaviour, here one `@vf.reward`
(verifiers/v1/task.py, docs/v1/tasksets.md). `TirlTaskset` yields the tasks of one split of a
tirl task source (`tirl.tasks.make_source`: races, arithmetic, a dataset file, ...), in the
source's own order, so the same `source`, `split` and `seed` give the same tasks as tirl.

The reward is exactly tirl's: the model's prose (its assistant messages, without the inside of
its ```python blocks, as `tirl.rewards.answer.prose_text` reads a trajectory; tool output is in
other messages and never read) goes to the tirl task's scorer, and `tirl_reward` is the
scorer's reward in [0, 1] (RACES's partial credit included); `tirl_correct` is a metric.

A row carries only what rebuilds its task (`source`, `seed`, `split`, `index`), not the scorer:
verifiers ships task data over the wire to its env server and rebuilds the task there from the
data (`Task(data, config)`), so the reward looks the tirl task up again, from a per-process
cache of sources.

Not covered: a source's SFT demonstrations (verifiers has no such notion), and the `weight` of
a mixture entry (one taskset is one source; verifiers' env groups mix tasksets).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.rewards.answer import prose_text
from tirl.tasks.base import SPLITS, Score
from tirl.tasks.base import Task as TirlTask
from tirl.tasks.registry import make_source


@functools.lru_cache(maxsize=32)
def _source(entry_json: str, seed: int):
    """One built source per (entry, seed) and process: a generated source (RACES) keeps its
    stream, so asking for task i again costs nothing."""
    return make_source(json.loads(entry_json), "taskset.source", seed)


def tirl_task(entry: dict[str, Any], seed: int, split: str, index: int) -> TirlTask:
    """The tirl task a row names."""
    return _source(json.dumps(entry, sort_keys=True), seed).item(split, index)


def prose_of(replies: list[str]) -> str:
    """What tirl's scorer reads of a conversation: the model's replies, joined, without the
    inside of its code blocks (`tirl.rewards.answer.prose_text`, the one definition)."""
    text = "\n".join(replies)
    return prose_text(Trajectory(segments=[Segment(SegmentKind.MODEL, [], text)]))


def score_replies(data: TirlData, replies: list[str]) -> Score:
    """tirl's score of the model's `replies` to the task `data` names."""
    return tirl_task(data.source, data.seed, data.split, data.index).score(prose_of(replies))


class TirlData(vf.TaskData):
    """One row: the tirl task's prompt and reference answer, and where it comes from."""

    source: dict[str, Any]
    """The task-source entry (`{"source": "races", ...}`), as in a tirl config's data.train."""
    seed: int = 0
    split: str = "test"
    index: int = 0
    answer: str = ""
    """The reference answer (shown in traces; the scorer decides)."""


def _replies(trace: vf.Trace) -> list[str]:
    return [m.content or "" for m in trace.assistant_messages if isinstance(m.content, str)]


class TirlTaskBehaviour(vf.Task[TirlData]):
    """A tirl task inside verifiers: its one reward is the tirl scorer's."""

    @property
    def key(self) -> str:
        return self.data.id or self.hash  # the tirl task id is stable across runs

    @vf.reward
    async def tirl_reward(self, trace: vf.Trace) -> float:
        return float(score_replies(self.data, _replies(trace)).reward)

    @vf.metric
    async def tirl_correct(self, trace: vf.Trace) -> float:
        return float(score_replies(self.data, _replies(trace)).correct)


class TirlTasksetConfig(vf.TasksetConfig):
    """Which tirl tasks: `--env.taskset.source '{"source": "races"}'`, `split`, `seed`."""

    source: dict[str, Any] = Field(default_factory=lambda: {"source": "arithmetic"})
    """A tirl task-source entry, e.g. {"source": "races", "mixture": {"sort": 1}}."""
    split: str = "test"
    """The source's split: train or test (they never share an item)."""
    seed: int = 0
    """Seeds a generated source (RACES's search) unless the entry sets its own seed."""
    num_tasks: int | None = None
    """At most this many tasks; None: the whole split, or an endless stream for a generator
    (a run then bounds it with -n, as for any infinite verifiers taskset)."""


class TirlTaskset(vf.Taskset[TirlTaskBehaviour, TirlTasksetConfig]):
    """The tasks of one split of a tirl task source (see the module doc)."""

    def __init__(self, config: TirlTasksetConfig) -> None:
        super().__init__(config)
        if config.split not in SPLITS:
            raise ValueError(
                f"taskset.split: must be one of {', '.join(SPLITS)}, got {config.split!r}"
            )
        self.source = _source(json.dumps(config.source, sort_keys=True), config.seed)
        size = self.source.size(config.split)
        # An unbounded generator without a cap is an infinite taskset (docs/v1/tasksets.md).
        self.INFINITE = size is None and config.num_tasks is None
        self.count = (
            min(x for x in (size, config.num_tasks) if x is not None) if not self.INFINITE else None
        )

    def load(self) -> Iterator[TirlTaskBehaviour]:
        index = 0
        while self.count is None or index < self.count:
            task = self.source.item(self.config.split, index)
            data = TirlData(
                id=task.id,
                name=task.id,
                prompt=task.problem,
                source=self.config.source,
                seed=self.config.seed,
                split=self.config.split,
                index=index,
                answer=task.answer,
            )
            yield TirlTaskBehaviour(data, self.config.task)
            index += 1
