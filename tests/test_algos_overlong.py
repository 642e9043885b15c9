"""DAPO soft overlong penalty, counted in model tokens only."""

import pytest
import torch

from tirl.algos.overlong import model_token_counts, overlong_penalty


def test_model_token_counts_skip_tool_and_padding():
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert model_token_counts(mask).tolist() == [3, 0, 5]


def test_overlong_penalty_three_regimes_by_hand():
    # max_len 10, buffer 4 -> L_exp = 6
    #   L <= 6        : 0                           (L = 3, 6)
    #   6 < L <= 10   : (6 - L) / 4 * 1             (L = 7 -> -0.25, 8 -> -0.5, 10 -> -1)
    #   L > 10        : -1                          (L = 11, 20)
    lengths = torch.tensor([3, 6, 7, 8, 10, 11, 20])
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    assert overlong_penalty(lengths, max_len=10, buffer=4).tolist() == expected
    # penalty 0.5 scales every regime: (6 - 8) / 4 * 0.5 = -0.25; beyond: -0.5
    half = overlong_penalty(lengths, max_len=10, buffer=4, penalty=0.5)
    assert half.tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5, -0.5]


def test_tool_tokens_do_not_count_toward_overlong():
    # 5 model tokens and 100 tool-output tokens: the span (105) would be far past max_len 10,
    # but the model wrote only 5 tokens, which is under L_exp = 6.
    mask = torch.cat([torch.ones(1, 3), torch.zeros(1, 100), torch.ones(1, 2)], dim=1)
    lengths = model_token_counts(mask)
    assert lengths.tolist() == [5]
    assert overlong_penalty(lengths, max_len=10, buffer=4).tolist() == [0.0]


@pytest.mark.parametrize(
    ("max_len", "buffer", "penalty"), [(10, 0, 1.0), (10, 11, 1.0), (10, 4, -1.0)]
)
def test_overlong_penalty_rejects_bad_arguments(max_len, buffer, penalty):
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([5]), max_len=max_len, buffer=buffer, penalty=penalty)
