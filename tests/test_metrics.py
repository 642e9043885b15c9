"""avg@k, pass@k, maj@k, bootstrap intervals, CIR Table 4 code statistics, token efficiency and
per-category breakdowns, on hand-computed cases."""

import math
import random

import pytest

from tirl.eval.metrics import (
    UNCATEGORIZED,
    avg_at_k,
    avg_at_k_ci,
    bootstrap_ci,
    by_category,
    code_block_stats,
    greedy_accuracy,
    maj_at_k,
    majority_answer,
    mean_pass_at_k,
    pass_at_k,
    token_efficiency,
)
from tirl.files import json_text
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.rewards.toolstats import tool_stats


def test_pass_at_k_known_values():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c/n
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(4, 2, 3) == 1.0  # n - c < k: every 3-subset has a correct one
    assert pass_at_k(5, 5, 1) == 1.0


def test_pass_at_k_matches_binomial_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_rejects_bad_arguments():
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_avg_at_k_weighs_items_equally():
    # item 1: 1/2, item 2: 3/4 -> (0.5 + 0.75) / 2
    assert avg_at_k([[True, False], [True, True, True, False]]) == 0.625


def test_mean_pass_at_k():
    # pass@2: item 1 (n=5, c=2) 0.7, item 2 (n=5, c=0) 0
    correct = [[True, True, False, False, False], [False] * 5]
    assert mean_pass_at_k(correct, 2) == pytest.approx(0.35)


def test_maj_at_k_tie_goes_to_earliest_first_occurrence():
    answers = [["7", "3", "3", "7"]]
    assert majority_answer(answers[0]) == "7"
    assert maj_at_k(answers, ["7"], 4) == 1.0
    assert maj_at_k(answers, ["3"], 4) == 0.0
    assert maj_at_k(answers, ["3"], 3) == 1.0  # first 3: "3" twice


def test_maj_at_k_ignores_none_and_all_none_is_wrong():
    answers = [[None, None, "5", "6"], [None, None], ["1", "2"]]
    # item 1, k=2: all None -> wrong; item 3, k=2: tie "1" vs "2" -> "1"
    assert maj_at_k(answers, ["5", "x", "1"], 2) == pytest.approx(1 / 3)
    # item 1, k=4: "5" and "6" tie -> "5"
    assert maj_at_k([answers[0]], ["5"], 4) == 1.0


def test_maj_at_k_needs_k_answers_per_item():
    with pytest.raises(ValueError):
        maj_at_k([["1"]], ["1"], 2)


# ---------------------------------------------------------------- one hand-computed data set


def test_avg_pass_maj_at_k_on_one_hand_computed_set():
    correct = [
        [True, False, True, False],  # A: c=2 of n=4
        [False, False, False, False],  # B: c=0
        [True, True, True, False],  # C: c=3
    ]
    # avg@4 = (2/4 + 0/4 + 3/4) / 3 = 1.25 / 3
    assert avg_at_k(correct) == pytest.approx(1.25 / 3)
    # pass@2: A = 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; B = 0; C: n-c = 1 < k = 2, so 1.
    # mean = (5/6 + 0 + 1) / 3 = 11/18
    assert mean_pass_at_k(correct, 2) == pytest.approx(11 / 18)
    # pass@1 is avg@k
    assert mean_pass_at_k(correct, 1) == pytest.approx(avg_at_k(correct))
    answers = [
        ["5", "3", "5", "3"],  # tie 2-2: "5" occurs first -> "5" (gold 5, right)
        ["1", "2", "2", None],  # "2" twice -> "2" (gold 7, wrong)
        [None, None, "9", "9"],  # "9" -> right
    ]
    gold = ["5", "7", "9"]
    assert maj_at_k(answers, gold, 4) == pytest.approx(2 / 3)
    # k=1: A "5" right, B "1" wrong, C None (no vote) wrong -> 1/3
    assert maj_at_k(answers, gold, 1) == pytest.approx(1 / 3)


def test_pass_at_k_equals_binomial_formula_on_random_cases():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 64)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_greedy_accuracy():
    assert greedy_accuracy([True, False, True, True]) == 0.75  # 3 of 4
    assert greedy_accuracy([True, False]) == avg_at_k([[True], [False]])
    with pytest.raises(ValueError):
        greedy_accuracy([])


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_ci_two_items_by_hand():
    # Resampling 2 items from scores [0, 1] gives mean 0, 0.5, 1 with probability 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% quantiles of many resampled means are 0 and 1.
    assert bootstrap_ci([0.0, 1.0], n_resamples=4000, seed=1) == (0.0, 1.0)
    # Constant scores: every resample has the same mean.
    assert bootstrap_ci([1.0] * 7, seed=1) == (1.0, 1.0)


def test_avg_at_k_ci_contains_the_point_estimate_and_is_deterministic():
    rng = random.Random(0)
    correct = [[rng.random() < p for _ in range(16)] for p in [rng.random() for _ in range(60)]]
    point = avg_at_k(correct)
    low, high = avg_at_k_ci(correct, seed=7)
    assert low < point < high
    assert high - low < 0.3
    assert avg_at_k_ci(correct, seed=7) == (low, high)  # same seed, same interval
    assert avg_at_k_ci(correct, seed=8) != (low, high)
    narrow = avg_at_k_ci(correct, seed=7, confidence=0.5)
    assert low <= narrow[0] <= point <= narrow[1] <= high


def test_bootstrap_ci_is_the_same_when_resamples_are_drawn_in_chunks():
    # 2**20 // 5000 = 209 resamples per draw: 1000 resamples take several draws.
    scores = [float(i % 3 == 0) for i in range(5000)]
    low, high = bootstrap_ci(scores, n_resamples=1000, seed=3)
    assert low < sum(scores) / len(scores) < high
    assert bootstrap_ci(scores, n_resamples=1000, seed=3) == (low, high)


def test_bootstrap_ci_rejects_bad_arguments():
    for kwargs in [{"n_resamples": 0}, {"confidence": 1.0}, {"confidence": 0.0}]:
        with pytest.raises(ValueError):
            bootstrap_ci([1.0], **kwargs)
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        avg_at_k_ci([[True], []])


# ---------------------------------------------------------------- CIR Table 4


def _stats(num_calls, any_error, last_ok):
    return {"num_calls": num_calls, "any_error": any_error, "last_ok": last_ok}


def test_code_block_stats_hand_built_table4():
    stats = [
        _stats(2, False, True),  # correct, all blocks ok
        _stats(1, True, False),  # correct, its one block failed
        _stats(0, False, None),  # correct, no code
        _stats(3, True, True),  # wrong, an error, then a passing last block
        _stats(2, True, False),  # wrong, last block failed
    ]
    correct = [True, True, True, False, False]
    got = code_block_stats(stats, correct)
    expected = {
        # correct: 3 responses, blocks (2 + 1 + 0) / 3; 2 have code: 1 full pass, 1 error,
        # 1 with an ok last block
        "code/correct/n": 3,
        "code/correct/blocks_mean": 1.0,
        "code/correct/with_code_rate": 2 / 3,
        "code/correct/full_pass_rate": 0.5,
        "code/correct/error_rate": 0.5,
        "code/correct/final_pass_rate": 0.5,
        # wrong: blocks (3 + 2) / 2; both have code and an error; one ends ok
        "code/wrong/n": 2,
        "code/wrong/blocks_mean": 2.5,
        "code/wrong/with_code_rate": 1.0,
        "code/wrong/full_pass_rate": 0.0,
        "code/wrong/error_rate": 1.0,
        "code/wrong/final_pass_rate": 0.5,
        # all: blocks 8 / 5; 4 with code: 1 full pass, 3 errors, 2 ending ok
        "code/all/n": 5,
        "code/all/blocks_mean": 1.6,
        "code/all/with_code_rate": 0.8,
        "code/all/full_pass_rate": 0.25,
        "code/all/error_rate": 0.75,
        "code/all/final_pass_rate": 0.5,
    }
    assert got == pytest.approx(expected)


def test_code_block_stats_from_tool_stats_skips_refused_blocks_and_empty_groups_are_nan():
    traj = Trajectory(
        segments=[Segment(SegmentKind.MODEL, [1, 2, 3], "x")],
        tool_calls=[
            ToolCall("1/0", "error", "ZeroDivisionError"),
            ToolCall("print(1)", "ok", "1\n"),
            ToolCall("print(2)", "skipped", ""),  # budget spent: not executed, not a block
        ],
    )
    got = code_block_stats([tool_stats(traj)], [False])
    assert got["code/wrong/blocks_mean"] == 2.0
    assert (got["code/wrong/full_pass_rate"], got["code/wrong/error_rate"]) == (0.0, 1.0)
    assert got["code/wrong/final_pass_rate"] == 1.0
    assert got["code/correct/n"] == 0
    assert math.isnan(got["code/correct/blocks_mean"])
    assert math.isnan(got["code/correct/full_pass_rate"])
    no_code = code_block_stats([_stats(0, False, None)], [True])
    assert no_code["code/correct/blocks_mean"] == 0.0
    assert math.isnan(no_code["code/correct/error_rate"])  # no code is not "no errors"
    with pytest.raises(ValueError):
        code_block_stats([_stats(0, False, None)], [True, False])


# ---------------------------------------------------------------- token efficiency


def test_token_efficiency_hand_computed():
    got = token_efficiency([True, False, True, False], [100, 300, 200, 400])
    assert got == pytest.approx(
        {
            "tokens/mean": 250.0,  # 1000 / 4
            "tokens/correct_mean": 150.0,  # (100 + 200) / 2
            "tokens/wrong_mean": 350.0,  # (300 + 400) / 2
            "tokens/accuracy_per_1k": 2.0,  # 1000 * 2 correct / 1000 tokens
            "tokens/per_correct": 500.0,  # 1000 tokens / 2 correct
        }
    )
    none_right = token_efficiency([False], [10])
    assert math.isnan(none_right["tokens/correct_mean"])
    assert none_right["tokens/accuracy_per_1k"] == 0.0
    assert math.isnan(none_right["tokens/per_correct"])
    with pytest.raises(ValueError):
        token_efficiency([True], [1, 2])


# ---------------------------------------------------------------- per category


def test_by_category_groups_items_and_applies_the_metric():
    categories = ["Algebra", "Geometry", "Algebra", None, "Geometry"]
    assert by_category([1, 0, 1, 1, 1], categories) == {
        "Algebra": 1.0,  # (1 + 1) / 2
        "Geometry": 0.5,  # (0 + 1) / 2
        UNCATEGORIZED: 1.0,
    }
    per_item = [[True, False], [False, False], [True, True], [True, False], [False, True]]
    # Algebra: avg@2 of [1/2, 2/2] = 0.75; Geometry: [0, 1/2] = 0.25; None: [1/2]
    assert by_category(per_item, categories, avg_at_k) == {
        "Algebra": 0.75,
        "Geometry": 0.25,
        UNCATEGORIZED: 0.5,
    }
    assert by_category(per_item, categories, len) == {"Algebra": 2, "Geometry": 2, UNCATEGORIZED: 1}
    assert list(by_category([1, 0, 1], [3, 1, 2])) == [1, 2, 3]  # MATH levels, sorted
    with pytest.raises(ValueError):
        by_category([1], ["a", "b"])


def test_json_text_writes_nan_and_infinity_as_null_and_stays_strict():
    text = json_text({"rate": math.nan, "ci": (0.5, math.inf), 3: [-math.inf, 1]}, indent=None)
    assert text == '{"rate": null, "ci": [0.5, null], "3": [null, 1]}'
