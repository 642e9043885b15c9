"""Scoring stored RACES tasks fails closed: a malformed row scores 0 with the reason, never raises.

Rows are hand-built broken versions of real tasks (made by `make_task` on a small registry);
the intact tasks must still score exactly as before.
"""

from __future__ import annotations

import random

import pytest

from tirl.envs.core import Chain, Environments, atomic
from tirl.envs.operators import (
    MALFORMED,
    OperatorReward,
    OperatorTask,
    make_task,
    score,
    task_problem,
)
from tirl.envs.types import Int

REG = Environments()


@atomic("stored", Int(-1000, 1000), Int(-2000, 2000), "Double the input.", registry=REG)
def double(x):
    return 2 * x


@atomic("stored", Int(-1000, 1000), Int(-1003, 1003), "Add 3 to the input.", registry=REG)
def add_three(x):
    return x + 3


@atomic("stored", Int(-1000, 1000), Int(-1000, 1000), "Negate the input.", registry=REG)
def negate(x):
    return -x


def _task(operator: str) -> OperatorTask:
    t = Chain(2, (), ())
    for name in ("stored.double", "stored.add_three"):  # 2 -> 4 -> 7
        t = t.extend(REG.get(name))
    return make_task(operator, t, REG, random.Random(0))


_DROP = object()  # a change that removes the field


def _row(operator: str, changes: dict) -> dict:
    row = _task(operator).to_dict()
    for key, value in changes.items():
        if value is _DROP:
            del row[key]
        else:
            row[key] = value
    return row


PATH = ("stored.double", "stored.add_three")
# (name, operator, changes to a correct row, words the reason must contain)
BROKEN = [
    ("no steps, sequential", "sequential", {"envs": [], "xs": ["2"]}, "no steps"),
    ("no steps, parallel", "parallel", {"envs": [], "xs": ["2"]}, "no steps"),
    ("no steps, sort", "sort", {"envs": [], "xs": [], "candidates": []}, "no steps"),
    ("no steps, select", "select", {"envs": [], "xs": []}, "no steps"),
    ("too few states", "sequential", {"xs": ["2", "4"]}, "2 stored states for 2 steps"),
    ("no states at all", "sort", {"xs": []}, "0 stored states"),
    ("missing envs", "sequential", {"envs": _DROP}, "field 'envs' is missing"),
    ("missing xs", "parallel", {"xs": _DROP}, "field 'xs' is missing"),
    ("envs is a string", "sequential", {"envs": "stored.double"}, "'envs' is str"),
    (
        "xs holds numbers",
        "sequential",
        {"xs": [2, 4, 7]},
        "'xs' holds int values, not only strings",
    ),
    ("operator is a number", "sequential", {"operator": 3}, "'operator' is int"),
    ("unknown operator", "sequential", {"operator": "shuffle"}, "unknown operator 'shuffle'"),
    ("meta is a string", "sort", {"meta": "{}"}, "'meta' is str, not a mapping"),
    ("unknown environment", "sequential", {"envs": ["stored.double", "stored.nope"]}, "nope"),
    ("unknown candidate", "select", {"candidates": [*PATH, "x.y"]}, "unknown environment 'x.y'"),
    ("path not offered", "select", {"candidates": ["stored.double"]}, "do not include"),
    ("sort candidates off the path", "sort", {"candidates": ["stored.negate"] * 2}, "not the"),
    ("too many candidates", "select", {"candidates": [*PATH] * 14}, "28 candidates"),
    ("no candidates", "sort", {"candidates": []}, "has no candidates"),
    ("gold does not parse", "sequential", {"xs": ["2", "4", "seven"]}, "'seven' does not parse"),
    ("start does not parse", "sort", {"xs": ["two", "4", "7"]}, "stored state 0 'two'"),
]


@pytest.mark.parametrize(
    "operator, changes, words", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_a_malformed_stored_task_scores_zero_with_the_reason(operator, changes, words):
    reference = _task(operator).answer  # the response that scores 1 on the intact task
    task = OperatorTask.from_dict(_row(operator, changes))
    reward = score(task, reference, REG)
    assert reward.value == 0.0
    assert reward.reason.startswith("malformed task: ") and words in reward.reason


@pytest.mark.parametrize("row", [None, [], "a task", 42, {}], ids=repr)
def test_from_dict_never_raises_and_marks_what_is_not_a_task(row):
    task = OperatorTask.from_dict(row)
    assert task.meta[MALFORMED]
    reward = score(task, "<answer>1</answer>", REG)
    assert reward.value == 0.0 and reward.reason.startswith("malformed task: ")


def test_a_task_built_directly_with_no_steps_scores_zero_instead_of_dividing_by_zero():
    for operator in ("sequential", "parallel", "sort", "select"):
        task = OperatorTask(operator, "prompt", (), (), "<answer>\n</answer>")
        assert score(task, "<answer>\n</answer>", REG) == OperatorReward(
            0.0, "malformed task: the task has no steps"
        )
    assert "not dict" in score({"operator": "sort"}, "", REG).reason  # type: ignore[arg-type]


def test_a_response_that_is_not_text_scores_zero():
    assert score(_task("sequential"), None, REG).value == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize("operator", ["sequential", "parallel", "sort", "select"])
def test_intact_stored_tasks_score_exactly_as_before(operator):
    task = _task(operator)
    again = OperatorTask.from_dict(task.to_dict())
    assert again == task and MALFORMED not in again.meta
    assert task_problem(again, REG) is None
    assert score(again, task.answer, REG) == OperatorReward(1.0)
    wrong = score(again, "<answer>\nStep 1: 5\nBranch 1: 5\n</answer>", REG)
    assert wrong.value < 1.0 and not wrong.reason.startswith("malformed")


def test_partial_credit_is_unchanged_on_an_intact_task():
    task = OperatorTask.from_dict(_task("sequential").to_dict())  # 2 -> 4 -> 7
    assert score(task, "<answer>\nStep 1: 4\nStep 2: 8\n</answer>", REG) == OperatorReward(
        0.5, "Step 2: the value differs from the expected one"
    )
