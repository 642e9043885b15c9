"""avg@k, pass@k and maj@k on hand-computed cases."""

import math

import pytest

from tirl.eval.metrics import avg_at_k, maj_at_k, majority_answer, mean_pass_at_k, pass_at_k


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
