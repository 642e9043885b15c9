"""RACES machinery on a small hand-made registry: composition, search quality control, and each
operator's reward on hand-computed cases (RACES §2.2–2.4)."""

from __future__ import annotations

import random

import pytest

from tirl.envs.core import Chain, Composite, EnvironmentError_, Registry, atomic
from tirl.envs.operators import (
    OperatorReward,
    OperatorTask,
    make_task,
    reward_parallel,
    reward_select,
    reward_sequential,
    reward_sort,
    score,
)
from tirl.envs.search import SearchConfig, search, take
from tirl.envs.types import Int, IntList

REG = Registry()
SMALL = Int(-1000, 1000)


@atomic("toy", SMALL, Int(-2000, 2000), "Double the input.", registry=REG)
def double(x):
    return 2 * x


@atomic("toy", SMALL, Int(-1003, 1003), "Add 3 to the input.", registry=REG)
def add_three(x):
    return x + 3


@atomic("toy", Int(-1000, 1000), Int(0, 10**6), "Square the input.", registry=REG)
def square(x):
    return x * x


@atomic("toy", SMALL, Int(-1000, 1000), "Negate the input.", registry=REG)
def negate(x):
    return -x


@atomic("toy", SMALL, Int(0, 0), "Replace the input by 0.", registry=REG)
def zero(x):
    return 0


@atomic(
    "toy",
    Int(0, 10**6),
    IntList(min_len=1, max_len=7, lo=0, hi=9),
    "List the digits.",
    registry=REG,
)
def digits(x):
    return tuple(int(c) for c in str(x))


@atomic("toy", IntList(min_len=1, max_len=7, lo=0, hi=9), Int(0, 63), "Sum the list.", registry=REG)
def total(xs):
    return sum(xs)


def traj(x0, *names):
    t = Chain(x0, (), ())
    for n in names:
        t = t.extend(REG.get(f"toy.{n}"))
    return t


def answer(label, values):
    return (
        "<answer>\n"
        + "\n".join(f"{label} {i}: {v}" for i, v in enumerate(values, 1))
        + "\n</answer>"
    )


# ---------------------------------------------------------------------------------------------
# Registry and composition


def test_duplicate_and_unknown_names_are_errors():
    with pytest.raises(EnvironmentError_, match="'toy.double' is registered twice"):

        @atomic("toy", SMALL, SMALL, "Double it again.", registry=REG)
        def double(x):  # noqa: F811
            return 2 * x

    with pytest.raises(KeyError, match="did you mean toy.double"):
        REG.get("toy.doubel")


def test_composition_refuses_mismatched_types_naming_both_environments():
    with pytest.raises(
        EnvironmentError_, match="toy.digits -> toy.square: toy.digits returns int_list"
    ):
        Composite((REG.get("toy.double"), REG.get("toy.digits"), REG.get("toy.square")))
    with pytest.raises(EnvironmentError_, match="toy.digits takes int"):
        Composite((REG.get("toy.digits"), REG.get("toy.digits")))


def test_a_composite_is_again_an_environment_with_the_end_to_end_signature():
    c = Composite((REG.get("toy.square"), REG.get("toy.digits"), REG.get("toy.total")))
    assert c.signature == ("int", "int")
    t = c.run(12)  # 144 -> (1, 4, 4) -> 9
    assert (t.x0, t.ys, t.final) == (12, (144, (1, 4, 4), 9), 9)
    assert c.then(REG.get("toy.double")).apply(12) == 18


# ---------------------------------------------------------------------------------------------
# Search and quality control


def test_search_is_deterministic_and_every_path_passes_quality_control():
    config = SearchConfig(min_size=2, max_size=4, frontier_cap=3)
    first = take(search(REG, seed=7, config=config), 40)
    again = take(search(REG, seed=7, config=config), 40)
    assert [t.names() for t in first] == [t.names() for t in again]
    assert len({t.names() for t in first}) == len(first)  # each composite once
    for t in first:
        assert 2 <= t.size <= 4
        states = [t.x0, *t.ys]
        for i, e in enumerate(t.envs):
            assert e.apply(states[i]) == states[i + 1]  # every step really ran
            assert states[i + 1] != states[i]  # no step leaves the state unchanged
            if i >= 1:
                assert states[i + 1] != states[i - 1]  # no step undoes the one before
        assert "toy.zero" not in t.names()[:-1] or t.names()[-1] != "toy.zero"


def test_constant_paths_and_undo_pairs_are_filtered():
    config = SearchConfig(min_size=2, max_size=3, frontier_cap=10)
    paths = {t.names() for t in take(search(REG, seed=1, config=config), 500)}
    assert paths  # the toy space is small but not empty
    assert not any(p[-1] == "toy.zero" for p in paths)  # ends in a constant
    assert not any(
        ("toy.negate", "toy.negate") == p[i : i + 2] for p in paths for i in range(len(p))
    )


def test_a_composite_is_yielded_up_to_inputs_per_composite_times_from_distinct_inputs():
    once = take(search(REG, seed=3, config=SearchConfig(min_size=1, max_size=2)), 10_000)
    config = SearchConfig(min_size=1, max_size=2, inputs_per_composite=3)
    thrice = take(search(REG, seed=3, config=config), 10_000)
    counts = {}
    for t in thrice:
        counts.setdefault(t.names(), set()).add(t.x0)
    assert set(counts) == {t.names() for t in once}  # the same composites...
    assert all(len(x0s) <= 3 for x0s in counts.values())  # ...at most thrice, never one x_0 twice
    assert len(thrice) == sum(len(x0s) for x0s in counts.values()) > 2 * len(once)
    with pytest.raises(ValueError, match="inputs_per_composite"):
        SearchConfig(inputs_per_composite=0)


def test_search_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="min_size <= max_size"):
        SearchConfig(min_size=4, max_size=2)


# ---------------------------------------------------------------------------------------------
# Operators: rewards on hand-computed cases


def test_sequential_reward_is_the_longest_correct_prefix_over_t():
    task = make_task("sequential", traj(2, "double", "add_three", "square"), REG, random.Random(0))
    assert task.xs == ("2", "4", "7", "49")
    assert reward_sequential(task, answer("Step", [4, 7, 49]), REG).value == 1.0
    r = reward_sequential(task, answer("Step", [4, 7, 50]), REG)
    assert r.value == pytest.approx(2 / 3) and "Step 3" in r.reason
    # a later correct step does not count after a wrong one: K = 1
    assert reward_sequential(task, answer("Step", [4, 8, 49]), REG).value == pytest.approx(1 / 3)
    assert reward_sequential(task, answer("Step", [5, 7, 49]), REG).value == 0.0
    assert reward_sequential(task, "Step 1: 4", REG).reason.startswith("no <answer>")
    assert reward_sequential(task, answer("Step", [4, "7 or 8", 49]), REG).value == pytest.approx(
        1 / 3
    )
    repeated = "<answer>\nStep 1: 4\nStep 1: 4\nStep 2: 7\nStep 3: 49\n</answer>"
    assert reward_sequential(task, repeated, REG) == OperatorReward(
        0.0, "Step 1 is given more than once"
    )
    assert score(task, task.answer, REG).value == 1.0


def test_parallel_reward_is_the_mean_of_the_branch_verifiers():
    task = make_task("parallel", traj(2, "double", "add_three", "square"), REG, random.Random(0))
    assert "Input: 4" in task.prompt and "Input: 7" in task.prompt  # each branch its own input
    assert reward_parallel(task, answer("Branch", [4, 7, 49]), REG).value == 1.0
    assert reward_parallel(task, answer("Branch", [4, 8, 49]), REG).value == pytest.approx(2 / 3)
    assert reward_parallel(task, answer("Branch", [5, 8, 49]), REG).value == pytest.approx(1 / 3)
    missing = "<answer>\nBranch 3: 49\n</answer>"
    assert reward_parallel(task, missing, REG).value == pytest.approx(1 / 3)


def _letters_for(task: OperatorTask, names: list[str]) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return (
        "<answer>"
        + ", ".join(letters[task.candidates.index(f"toy.{n}")] for n in names)
        + "</answer>"
    )


def test_sort_reward_is_one_iff_the_order_maps_the_start_to_the_target():
    task = make_task("sort", traj(2, "double", "add_three"), REG, random.Random(0))
    assert task.xs[0] == "2" and task.xs[-1] == "7"
    assert reward_sort(task, _letters_for(task, ["double", "add_three"]), REG).value == 1.0
    wrong = reward_sort(task, _letters_for(task, ["add_three", "double"]), REG)  # (2+3)*2 = 10
    assert wrong.value == 0.0 and "do not reach" in wrong.reason
    assert reward_sort(task, _letters_for(task, ["double"]), REG).reason.startswith("use all 2")
    assert reward_sort(task, "<answer>A, Z</answer>", REG).reason.startswith("'Z' is not one")
    assert (
        reward_sort(task, "<answer>A, A</answer>", REG).reason == "a letter is used more than once"
    )
    assert score(task, task.answer, REG).value == 1.0


def test_sort_credits_any_order_that_reaches_the_target():
    task = make_task("sort", traj(5, "double", "negate"), REG, random.Random(3))  # -10 either way
    assert reward_sort(task, _letters_for(task, ["negate", "double"]), REG).value == 1.0
    assert reward_sort(task, _letters_for(task, ["double", "negate"]), REG).value == 1.0


def test_sort_scores_zero_for_an_order_that_cannot_run():
    task = make_task("sort", traj(12, "square", "digits", "total"), REG, random.Random(0))
    r = reward_sort(task, _letters_for(task, ["digits", "square", "total"]), REG)
    assert r.value == 0.0 and "cannot be executed" in r.reason


def test_select_has_executable_distractors_and_credits_any_chain_to_the_target():
    t = traj(2, "double", "add_three")  # 2 -> 4 -> 7
    task = make_task("select", t, REG, random.Random(0))
    distractors = set(task.candidates) - set(t.names())
    assert distractors  # B_pi is not empty
    for name in distractors:  # and each distractor runs on some state of the path
        e = REG.get(name)
        assert any(e.input.check(s) is None for s in (2, 4))
    assert reward_select(task, _letters_for(task, ["double", "add_three"]), REG).value == 1.0
    assert reward_select(task, _letters_for(task, ["add_three", "double"]), REG).value == 0.0
    assert reward_select(task, "<answer></answer>", REG).value == 0.0
    assert score(task, task.answer, REG).value == 1.0


def test_tasks_round_trip_through_dicts():
    task = make_task("select", traj(2, "double", "add_three"), REG, random.Random(0))
    again = OperatorTask.from_dict(task.to_dict())
    assert again == task
    assert score(again, task.answer, REG).value == 1.0


# ---------------------------------------------------------------------------------------------
# Malformed definitions are refused by `check`, naming the environment and the fault


def _helper(x):
    return x + 1


def _malformed_registry() -> Registry:
    reg = Registry()

    @atomic("bad", SMALL, SMALL, "Divide the input by zero.", registry=reg)
    def raises(x):
        return x // 0

    @atomic("bad", SMALL, SMALL, "Add one.", equal=lambda a, b: False, registry=reg)
    def rejects_gold(x):
        return x + 1

    @atomic("bad", SMALL, IntList(), "Add one.", registry=reg)
    def wrong_output_type(x):
        return [x + 1]  # a list, not the tuple an int_list is

    @atomic("bad", SMALL, SMALL, "Add one.", registry=reg)
    def not_self_contained(x):
        return _helper(x)

    @atomic(
        "bad",
        SMALL,
        SMALL,
        "Add one.",
        sampler=lambda rng, level: random.randint(0, 9),
        registry=reg,
    )
    def unseeded_sampler(x):
        return x + 1

    return reg


def test_check_names_the_environment_and_the_fault():
    from tirl.envs.check import check_registry

    faults = check_registry(_malformed_registry())
    joined = {name: " | ".join(f) for name, f in faults.items()}
    assert "bad.raises: the mapper raised ZeroDivisionError" in joined["bad.raises"]
    assert (
        "bad.rejects_gold: the verifier rejects its own gold answer" in joined["bad.rejects_gold"]
    )
    assert (
        "bad.wrong_output_type: the mapper returned an invalid int_list"
        in joined["bad.wrong_output_type"]
    )
    assert (
        "bad.not_self_contained: its code rendering raised NameError"
        in joined["bad.not_self_contained"]
    )
    assert (
        "bad.unseeded_sampler: the sampler gives different inputs" in joined["bad.unseeded_sampler"]
    )


def test_check_passes_a_well_formed_environment():
    from tirl.envs.check import check_environment

    assert check_environment(REG.get("toy.square")) == []
    assert check_environment(REG.get("toy.digits")) == []


def test_slow_and_oversized_steps_are_dropped():
    from tirl.envs.search import try_step

    reg = Registry()

    @atomic("slow", SMALL, SMALL, "Wait, then add one.", registry=reg)
    def sleepy(x):
        import time

        time.sleep(5)
        return x + 1

    @atomic(
        "slow", SMALL, IntList(max_len=10**4, lo=0, hi=0), "List that many zeros.", registry=reg
    )
    def zeros(x):
        return (0,) * (abs(x) + 200)

    from tirl.envs.search import step_timer

    config = SearchConfig(step_timeout_s=0.05, max_render_chars=300)
    start = Chain(7, (), ())
    with step_timer():
        assert try_step(start, reg.get("slow.sleepy"), config) is None  # interrupted, dropped
    assert try_step(start, reg.get("slow.zeros"), config) is None  # too long to state
    assert try_step(start, REG.get("toy.double"), config).final == 14
