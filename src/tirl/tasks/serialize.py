"""A task as plain JSON and back, for a process that did not build it (verl's agent loop reads
tasks from parquet rows; `tirl.integrations.verl`).

A task's scorer is a closure. What it closes over is named by `meta["scoring"]`, and that is all
a serialized task needs besides its text:

- "integer" (arithmetic): the last `\\boxed{}` must be the integer `answer`;
- "math" (datasets, benchmarks): the math verifier decides against `answer`;
- "races": the operator reward of the stored RACES task, `meta["races_task"]`.
- "reasoning_gym": the dataset's own `score_answer` on the stored `meta["entry"]` (the dataset
  rebuilt from `meta["dataset"]` and `meta["config"]`; needs reasoning-gym installed).

`task_to_dict` writes id, split, problem, answer, source and meta (JSON-safe values only);
`task_from_dict` rebuilds the same task with its scorer. A task of another scoring kind cannot
be written, and a dict that is not a serialized task cannot be read: both say why in one line.

The kinds are a registry (`SCORINGS`): a plugin whose tasks carry a scoring kind of its own
registers how to rebuild its scorer, `@SCORINGS.register("kind")` on a function
`(answer, meta, task_id) -> scorer` (ValueError for a meta it cannot read).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tirl.envs.operators import MALFORMED, OperatorTask
from tirl.registry import Registry
from tirl.tasks.base import SPLITS, Task
from tirl.tasks.sources.arithmetic import score_integer
from tirl.tasks.sources.dataset import score_math
from tirl.tasks.sources.races import score_operator

FIELDS = ("id", "split", "problem", "answer", "source", "meta")

# scoring kind -> (answer, meta, task_id) -> the task's scorer
ScorerMaker = Callable[[str, dict, str], Callable[[str], Any]]
SCORINGS: Registry[ScorerMaker] = Registry("scoring kind", entry_type=Callable)


@SCORINGS.register("integer")
def _integer(answer: str, meta: dict, task_id: str) -> Callable[[str], Any]:
    try:
        gold = int(answer)
    except ValueError:
        raise ValueError(f"task {task_id}: integer answer {answer!r} is not an integer") from None
    return lambda text: score_integer(gold, text)


@SCORINGS.register("math")
def _math(answer: str, meta: dict, task_id: str) -> Callable[[str], Any]:
    return lambda text: score_math(answer, text)


@SCORINGS.register("reasoning_gym")
def _reasoning_gym(answer: str, meta: dict, task_id: str) -> Callable[[str], Any]:
    from tirl.tasks.sources.reasoning_gym import meta_scorer  # needs reasoning-gym

    return meta_scorer(meta)


@SCORINGS.register("races")
def _races(answer: str, meta: dict, task_id: str) -> Callable[[str], Any]:
    stored = OperatorTask.from_dict(meta.get("races_task"))
    if MALFORMED in stored.meta:
        raise ValueError(f"task {task_id}: bad races_task ({stored.meta[MALFORMED]})")
    return lambda text: score_operator(stored, text)


def task_to_dict(task: Task) -> dict[str, Any]:
    """`task` as a JSON-safe dict (ValueError if its scoring kind is not one of SCORINGS or its
    meta does not survive JSON)."""
    scoring = task.meta.get("scoring")
    if not _known(scoring):
        raise ValueError(
            f"task {task.id}: scoring {scoring!r} cannot be serialized; expected one of"
            f" {', '.join(sorted(SCORINGS))}"
        )
    data = {name: getattr(task, name) for name in FIELDS}
    try:
        return json.loads(json.dumps(data))
    except (TypeError, ValueError) as e:
        raise ValueError(f"task {task.id}: its meta is not JSON-safe ({e})") from None


def _known(scoring: Any) -> bool:
    return isinstance(scoring, str) and scoring in SCORINGS


def task_from_dict(data: Any) -> Task:
    """The task `task_to_dict` wrote, scorer included (ValueError naming what is wrong)."""
    if not isinstance(data, dict):
        raise ValueError(f"a serialized task is a dict, not {type(data).__name__}")
    missing = [name for name in FIELDS if name not in data]
    if missing:
        raise ValueError(f"serialized task lacks {', '.join(missing)}")
    meta = data["meta"]
    task_id = data["id"]
    if not isinstance(meta, dict) or not _known(meta.get("scoring")):
        scoring = meta.get("scoring") if isinstance(meta, dict) else None
        raise ValueError(f"task {task_id}: unknown scoring {scoring!r}")
    if data["split"] not in SPLITS:
        raise ValueError(f"task {task_id}: unknown split {data['split']!r}")
    answer = str(data["answer"])
    scorer = SCORINGS[meta["scoring"]](answer, meta, task_id)
    return Task(
        id=task_id,
        split=data["split"],
        problem=str(data["problem"]),
        answer=answer,
        scorer=scorer,
        source=str(data["source"]),
        meta=meta,
    )
