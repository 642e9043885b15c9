"""The sampler/trainer gap and truncated importance sampling (`tirl.algos.mismatch`), on
hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from tirl.algos.losses import ppo_clip_loss
from tirl.algos.mismatch import mismatch_metrics, truncated_is_weights

# Two sampled tokens and one masked position whose numbers must not count.
TRAINER = torch.tensor([[-1.0, -0.5, -9.0]])
SAMPLER = torch.tensor([[-1.5, -0.5, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_the_gap_by_hand():
    # log r = trainer - sampler = [0.5, 0.0] on the sampled tokens
    m = mismatch_metrics(TRAINER, SAMPLER, MASK)
    assert m["mismatch/abs_diff_mean"] == pytest.approx(0.25)
    assert m["mismatch/abs_diff_max"] == pytest.approx(0.5)
    # k3 = (r - 1) - log r: (e^0.5 - 1 - 0.5 + 0) / 2
    assert m["mismatch/kl_k3"] == pytest.approx((math.exp(0.5) - 1.5) / 2)


def test_identical_log_probs_have_no_gap_and_no_tokens_give_zeros():
    same = mismatch_metrics(TRAINER, TRAINER, MASK)
    assert same == {
        "mismatch/abs_diff_mean": 0.0,
        "mismatch/abs_diff_max": 0.0,
        "mismatch/kl_k3": 0.0,
    }
    empty = mismatch_metrics(TRAINER, SAMPLER, torch.zeros_like(MASK))
    assert set(empty.values()) == {0.0}


def test_tis_weights_are_the_ratio_capped_and_zero_off_the_mask():
    # ratio pi_old / pi_sampler = [e^0.5, 1]; the masked position's e^-9 is dropped
    assert truncated_is_weights(TRAINER, SAMPLER, MASK, cap=2.0)[0].tolist() == pytest.approx(
        [math.exp(0.5), 1.0, 0.0]
    )
    assert truncated_is_weights(TRAINER, SAMPLER, MASK, cap=1.5)[0].tolist() == pytest.approx(
        [1.5, 1.0, 0.0]
    )
    # a token the sampler thought nearly impossible: capped, not inf
    assert (
        truncated_is_weights(
            torch.tensor([[0.0]]), torch.tensor([[-1e4]]), torch.ones(1, 1), 2.0
        ).item()
        == 2.0
    )
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(TRAINER, SAMPLER, MASK, cap=0.0)


def test_weights_on_the_advantages_weight_each_tokens_ppo_loss():
    """The trainer applies TIS by scaling the advantages: for PPO's clipped loss (with dual
    clip too) that is exactly the weighted mean of the per-token losses."""
    logprobs = torch.tensor([[-0.7, -1.2, -0.1, -2.0]])
    old = torch.tensor([[-1.0, -1.0, -0.5, -1.5]])  # ratios e^0.3, e^-0.2, e^0.4, e^-0.5
    adv = torch.tensor([[1.0, -1.0, 2.0, -0.5]])
    mask = torch.ones(1, 4)
    w = torch.tensor([[1.5, 0.5, 2.0, 1.0]])
    for dual in (None, 3.0):
        weighted, _ = ppo_clip_loss(logprobs, old, adv * w, mask, clip_ratio_c=dual)
        per_token = []
        for t in range(4):
            one = torch.zeros(1, 4)
            one[0, t] = 1.0
            loss, _ = ppo_clip_loss(logprobs, old, adv, one, clip_ratio_c=dual)
            per_token.append(loss.item())
        expected = sum(w[0, t].item() * per_token[t] for t in range(4)) / 4
        assert weighted.item() == pytest.approx(expected)
