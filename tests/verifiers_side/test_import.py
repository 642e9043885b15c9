"""verifiers environments as tirl tasks: the `verifiers` task source, loaded by id through
verifiers' own loader, scored by the environment's own rewards."""

from __future__ import annotations

import pytest

from tirl.config import ConfigError
from tirl.tasks import make_source


def source(**entry):
    return make_source({"source": "verifiers", **entry}, "data.train[0]", seed=0)


def test_a_verifiers_taskset_is_split_and_scored_by_its_own_reward():
    tasks = source(env="vf-addition-test", args={"num_tasks": 40})
    train, test = tasks.size("train"), tasks.size("test")
    assert train + test == 40 and train > 0 and test > 0
    problems = {tasks.item("train", i).problem for i in range(train)}
    assert not problems & {tasks.item("test", i).problem for i in range(test)}
    task = tasks.item("test", 0)
    n = int(task.problem.split()[2])
    assert task.problem == f"What is {n} + {n}?" and task.answer == str(2 * n)
    right, wrong = task.score(f"It is {2 * n}"), task.score(f"It is {2 * n + 1}")
    assert (right.reward, right.correct, right.reason) == (1.0, True, "exact_match=1")
    assert (wrong.reward, wrong.correct) == (0.0, False)
    assert tasks.item("test", test).problem == task.problem  # a finite source cycles


def test_tirl_races_round_trip_through_verifiers_keeps_tirls_reward():
    """tirl -> verifiers (the tirl-verifiers taskset) -> tirl (this source): same rewards."""
    entry = {"source": "races", "mixture": {"sequential": 1.0}, "max_size": 3}
    tasks = source(env="tirl-verifiers", args={"source": entry, "num_tasks": 30, "split": "train"})
    direct = make_source(entry, "x", seed=0)
    by_problem = {direct.item("train", i).problem: direct.item("train", i) for i in range(30)}
    task = tasks.item("train", 0)
    mine = by_problem[task.problem]
    lines = mine.answer.splitlines()
    lines[-2] = lines[-2].split(": ")[0] + ": 123456789"  # the last step wrong
    for reply in (mine.answer, "\n".join(lines), "nothing"):
        assert task.score(reply).reward == mine.score(reply).reward
    assert task.score(mine.answer).correct and 0 < task.score("\n".join(lines)).reward < 1


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"env": "no-such-env"}, "unknown verifiers environment 'no-such-env'"),
        ({"env": "vf-addition-test", "args": {"num_taskz": 3}}, "args: verifiers environment"),
        ({"env": ""}, "env: name a verifiers environment"),
        ({"env": "vf-runtime-reward-test"}, "reward 'wrote_file' needs a runtime"),
    ],
)
def test_bad_input_is_one_line_naming_the_key(entry, says):
    with pytest.raises(ConfigError) as e:
        source(**entry)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("data.train[0]")
