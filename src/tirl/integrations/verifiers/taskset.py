"""Any tirl task source as a `verifiers` (v1) taskset, rewarded by the task's own scorer.

verifiers 0.4.0 describes work as a `Taskset` that yields `Task`s: an immutable `TaskData` row
(the prompt and whatever scoring needs) plus the task's behaviour, here one `@vf.reward`
(verifiers/v1/task.py, docs/v1/tasksets.md). `TirlTaskset` yields the tasks of one split of a
tirl task source (`tirl.tasks.make_source`: races, arithmetic, a dataset file, ...), in the
source's own order, so the same `source`, `split` and `seed` give the same tasks as tirl.

The prompt is the task's problem, saying how to write the answer: a problem whose scorer reads
a `\\boxed{}` (arithmetic, math) and does not say so ends with the sentence tirl's own system
prompts end with (`FINAL_ANSWER`); RACES and imported reasoning-gym problems state their
`<answer>` form themselves. A single-turn rollout has no system message, so without it the model
was never told ("73" and `<answer>73</answer>` both scored 0 on arithmetic).

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
from pydantic import Field, model_validator

from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.rewards.answer import prose_text
from tirl.tasks.base import SPLITS, Score
from tirl.tasks.base import Task as TirlTask
from tirl.tasks.prompts import DEFAULT_SYSTEM_PROMPTS
from tirl.tasks.registry import make_source

# The sentence tirl's system prompts end with, on the answer's form, in their own words.
_SYSTEM = DEFAULT_SYSTEM_PROMPTS["cir_fences"].format(stop="")
FINAL_ANSWER = _SYSTEM[_SYSTEM.index("Give the final answer") :]
# Scoring kinds (a task's meta["scoring"]) whose scorer reads a `\\boxed{}` the problem does not
# ask for; the others' problems state their form (RACES, reasoning-gym) or are not tirl's.
UNSTATED_FORM = ("integer", "math")


@functools.lru_cache(maxsize=32)
def _source(entry_json: str, seed: int):
    """One built source per (entry, seed) and process: a generated source (RACES) keeps its
    stream, so asking for task i again costs nothing."""
    return make_source(json.loads(entry_json), "taskset.source", seed)


def tirl_task(entry: dict[str, Any], seed: int, split: str, index: int) -> TirlTask:
    """The tirl task a row names."""
    return _source(json.dumps(entry, sort_keys=True), seed).item(split, index)


def task_prompt(task: TirlTask) -> str:
    """The prompt a row carries: the problem, with the answer's form when it does not say it."""
    if task.meta.get("scoring") in UNSTATED_FORM:
        return f"{task.problem.rstrip()}\n\n{FINAL_ANSWER}"
    return task.problem


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

    @model_validator(mode="after")
    def _source_builds(self) -> TirlTasksetConfig:
        """A bad source or split is a config error (verifiers' CLI prints it in its error box,
        tirl's one line inside), not a traceback when the run starts."""
        if self.split not in SPLITS:
            raise ValueError(
                f"taskset.split: must be one of {', '.join(SPLITS)}, got {self.split!r}"
            )
        _source(json.dumps(self.source, sort_keys=True), self.seed)  # ConfigError: a ValueError
        return self


class TirlTaskset(vf.Taskset[TirlTaskBehaviour, TirlTasksetConfig]):
    """The tasks of one split of a tirl task source (see the module doc)."""

    def __init__(self, config: TirlTasksetConfig) -> None:
        super().__init__(config)
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
                prompt=task_prompt(task),
                source=self.config.source,
                seed=self.config.seed,
                split=self.config.split,
                index=index,
                answer=task.answer,
            )
            yield TirlTaskBehaviour(data, self.config.task)
            index += 1
