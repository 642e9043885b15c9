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
"""

from __future__ import annotations

import json
from typing import Any

from tirl.envs.operators import MALFORMED, OperatorTask
from tirl.tasks.base import SPLITS, Task
from tirl.tasks.sources.arithmetic import score_integer
from tirl.tasks.sources.dataset import score_math
from tirl.tasks.sources.races import score_operator

FIELDS = ("id", "split", "problem", "answer", "source", "meta")
SCORINGS = ("integer", "math", "races", "reasoning_gym")


def task_to_dict(task: Task) -> dict[str, Any]:
    """`task` as a JSON-safe dict (ValueError if its scoring kind is not one of SCORINGS or its
    meta does not survive JSON)."""
    scoring = task.meta.get("scoring")
    if scoring not in SCORINGS:
        raise ValueError(
            f"task {task.id}: scoring {scoring!r} cannot be serialized; expected one of"
            f" {', '.join(SCORINGS)}"
        )
    data = {name: getattr(task, name) for name in FIELDS}
    try:
        return json.loads(json.dumps(data))
    except (TypeError, ValueError) as e:
        raise ValueError(f"task {task.id}: its meta is not JSON-safe ({e})") from None


def task_from_dict(data: Any) -> Task:
    """The task `task_to_dict` wrote, scorer included (ValueError naming what is wrong)."""
    if not isinstance(data, dict):
        raise ValueError(f"a serialized task is a dict, not {type(data).__name__}")
    missing = [name for name in FIELDS if name not in data]
    if missing:
        raise ValueError(f"serialized task lacks {', '.join(missing)}")
    meta = data["meta"]
    task_id = data["id"]
    if not isinstance(meta, dict) or meta.get("scoring") not in SCORINGS:
        scoring = meta.get("scoring") if isinstance(meta, dict) else None
        raise ValueError(f"task {task_id}: unknown scoring {scoring!r}")
    if data["split"] not in SPLITS:
        raise ValueError(f"task {task_id}: unknown split {data['split']!r}")
    answer = str(data["answer"])
    scoring = meta["scoring"]
    if scoring == "integer":
        try:
            gold = int(answer)
        except ValueError:
            raise ValueError(
                f"task {task_id}: integer answer {answer!r} is not an integer"
            ) from None
        scorer = lambda text: score_integer(gold, text)  # noqa: E731
    elif scoring == "math":
        scorer = lambda text: score_math(answer, text)  # noqa: E731
    elif scoring == "reasoning_gym":
        from tirl.tasks.sources.reasoning_gym import meta_scorer  # needs reasoning-gym

        scorer = meta_scorer(meta)
    else:
        stored = OperatorTask.from_dict(meta.get("races_task"))
        if MALFORMED in stored.meta:
            raise ValueError(f"task {task_id}: bad races_task ({stored.meta[MALFORMED]})")
        scorer = lambda text: score_operator(stored, text)  # noqa: E731
    return Task(
        id=task_id,
        split=data["split"],
        problem=str(data["problem"]),
        answer=answer,
        scorer=scorer,
        source=str(data["source"]),
        meta=meta,
    )
