"""Hand-computed checks of advantages, PPO-clip, aggregation, KL and entropy."""

import math

import pytest
import torch

from tirl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    broadcast_to_tokens,
    get_advantage_estimator,
    grpo,
)
from tirl.algos.losses import agg_loss, entropy_from_logits, kl_penalty, ppo_clip_loss

# ---------------------------------------------------------------- advantages


def test_grpo_two_groups_by_hand():
    # group 7: rewards [1, 0]        -> mean 0.5, unbiased std sqrt(0.5)  -> +-1/sqrt(2)
    # group 3: rewards [1, 1, -1, -1] -> mean 0,  unbiased std sqrt(4/3)  -> +-sqrt(3)/2
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, -1.0, -1.0])
    groups = torch.tensor([7, 3, 7, 3, 3, 3])
    a, b = 1 / math.sqrt(2), math.sqrt(3) / 2
    expected = torch.tensor([a, b, -a, b, -b, -b])
    torch.testing.assert_close(grpo(rewards, groups), expected, atol=1e-5, rtol=0)


def test_dr_grpo_subtracts_group_mean_only():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, -1.0, -1.0])
    groups = torch.tensor([7, 3, 7, 3, 3, 3])
    expected = torch.tensor([0.5, 1.0, -0.5, 1.0, -1.0, -1.0])
    torch.testing.assert_close(grpo(rewards, groups, normalize_std=False), expected)


def test_grpo_group_of_size_one_gets_zero():
    rewards = torch.tensor([5.0, 1.0, -1.0])
    groups = torch.tensor([0, 1, 1])
    for norm in (True, False):
        adv = grpo(rewards, groups, normalize_std=norm)
        assert adv[0].item() == 0.0
        assert adv[1].item() > 0 > adv[2].item()


def test_grpo_all_equal_group_gets_zero_not_nan():
    adv = grpo(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3))


def _grpo_loop(rewards, groups, normalize_std, eps=1e-6):
    out = torch.zeros_like(rewards)
    for g in groups.unique():
        idx = (groups == g).nonzero().flatten()
        r = rewards[idx]
        if len(idx) == 1:
            continue
        a = r - r.mean()
        if normalize_std:
            a = a / (r.std() + eps)
        out[idx] = a
    return out


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_loop_and_vectorized_agree_on_random_data(normalize_std):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        b = int(torch.randint(1, 40, (1,), generator=gen))
        rewards = torch.randn(b, generator=gen)
        groups = torch.randint(0, 6, (b,), generator=gen) * 11 - 20  # arbitrary, negative ids
        torch.testing.assert_close(
            grpo(rewards, groups, normalize_std=normalize_std),
            _grpo_loop(rewards, groups, normalize_std),
            atol=1e-5,
            rtol=1e-5,
        )


def test_advantage_registry_holds_token_estimators_and_lists_names_on_error():
    names = {"grpo", "drgrpo", "rloo", "reinforce++", "reinforce++-baseline"}
    assert set(ADVANTAGE_ESTIMATORS) == names
    assert get_advantage_estimator("grpo") is ADVANTAGE_ESTIMATORS["grpo"]
    with pytest.raises(KeyError, match="drgrpo.*grpo.*reinforce\\+\\+-baseline.*rloo"):
        get_advantage_estimator("nope")


def test_broadcast_to_tokens_zeroes_masked_positions():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    expected = torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]])
    assert torch.equal(broadcast_to_tokens(adv, mask), expected)


# ---------------------------------------------------------------- PPO clip


def _lp(ratios):
    return torch.log(torch.tensor([ratios], dtype=torch.float64))


def test_clip_higher_is_asymmetric():
    # clip range [0.8, 1.28]
    ones = torch.ones(1, 4, dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    # A > 0: 1.25 stays inside (not clipped), 1.3 is clipped to 1.28.
    _, m = ppo_clip_loss(_lp([1.25, 1.25, 1.25, 1.25]), old, ones, ones)
    assert m["actor/clip_frac"] == 0.0
    _, m = ppo_clip_loss(_lp([1.3, 1.3, 1.3, 1.3]), old, ones, ones)
    assert m["actor/clip_frac"] == 1.0
    # A < 0: 0.7 is clipped at 0.8; 0.85 is not.
    _, m = ppo_clip_loss(_lp([0.7, 0.7, 0.85, 0.85]), old, -ones, ones)
    assert m["actor/clip_frac"] == 0.5
    # With a symmetric 0.2 clip, 1.25 would have been clipped.
    _, m = ppo_clip_loss(_lp([1.25] * 4), old, ones, ones, clip_high=0.2)
    assert m["actor/clip_frac"] == 1.0


def test_ppo_token_mean_hand_value_and_gradients():
    # ratios [1.25, 1.3, 0.7, 1.0], advantages [1, 1, -1, 2]:
    #   tok0: max(-1.25, -1.25) = -1.25      (inside the range)
    #   tok1: max(-1.30, -1.28) = -1.28      (clipped at 1 + 0.28)
    #   tok2: max( 0.70,  0.80) =  0.80      (clipped at 1 - 0.2)
    #   tok3: max(-2.00, -2.00) = -2.00
    # token-mean = (-1.25 - 1.28 + 0.8 - 2) / 4 = -0.9325
    logprobs = _lp([1.25, 1.3, 0.7, 1.0]).requires_grad_()
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4)
    loss, m = ppo_clip_loss(logprobs, old, adv, mask)
    assert loss.item() == pytest.approx(-0.9325, abs=1e-12)
    assert m["actor/pg_loss"] == pytest.approx(-0.9325, abs=1e-12)
    assert m["actor/clip_frac"] == 0.5
    assert m["actor/ratio_mean"] == pytest.approx((1.25 + 1.3 + 0.7 + 1.0) / 4)
    k3 = [(r - 1) - math.log(r) for r in (1.25, 1.3, 0.7, 1.0)]
    assert m["actor/approx_kl"] == pytest.approx(sum(k3) / 4)
    loss.backward()
    # d loss / d logprob = -A * ratio / N inside the range, 0 where clipped.
    expected_grad = torch.tensor([[-1.25 / 4, 0.0, 0.0, -2.0 / 4]], dtype=torch.float64)
    torch.testing.assert_close(logprobs.grad, expected_grad)


def test_masked_tool_position_contributes_zero_loss_and_zero_gradient():
    nan, inf = float("nan"), float("inf")
    # position 0 is a model token (ratio 1.1, A = 1); positions 1-2 are tool output with
    # garbage logprobs and advantages.
    logprobs = torch.tensor([[math.log(1.1), nan, 1e4]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, -inf]])
    adv = torch.tensor([[1.0, 1e30, nan]])
    mask = torch.tensor([[1, 0, 0]])
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        logprobs.grad = None
        loss, metrics = ppo_clip_loss(logprobs, old, adv, mask, agg=agg)
        assert loss.item() == pytest.approx(-1.1)
        assert all(math.isfinite(v) for v in metrics.values())
        loss.backward()
        assert logprobs.grad[0, 0].item() == pytest.approx(-1.1)
        assert logprobs.grad[0, 1].item() == 0.0
        assert logprobs.grad[0, 2].item() == 0.0


def test_tool_tokens_never_count_in_token_mean():
    # The same model tokens with and without extra masked tool tokens give the same loss.
    lp = torch.log(torch.tensor([[1.1, 0.9]]))
    adv = torch.tensor([[1.0, 1.0]])
    short, _ = ppo_clip_loss(lp, torch.zeros(1, 2), adv, torch.ones(1, 2))
    lp_long = torch.cat([lp, torch.full((1, 3), 5.0)], dim=1)
    adv_long = torch.cat([adv, torch.full((1, 3), 100.0)], dim=1)
    mask_long = torch.tensor([[1, 1, 0, 0, 0]])
    long, _ = ppo_clip_loss(lp_long, torch.zeros(1, 5), adv_long, mask_long)
    assert long.item() == short.item()


# ---------------------------------------------------------------- aggregation


def test_agg_modes_differ_on_hand_case_and_ignore_nan_at_masked():
    nan, inf = float("nan"), float("inf")
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, inf, nan]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert agg_loss(loss_mat, mask, "token-mean").item() == 2.5  # (1+2+3+4)/4
    assert agg_loss(loss_mat, mask, "seq-mean-token-mean").item() == 3.0  # (6/3 + 4/1)/2
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum").item() == 5.0  # (6 + 4)/2


def test_agg_gradient_is_zero_at_masked_positions():
    loss_mat = torch.tensor([[1.0, float("nan")]], requires_grad=True)
    agg_loss(loss_mat, torch.tensor([[1, 0]]), "token-mean").backward()
    assert loss_mat.grad.tolist() == [[1.0, 0.0]]


def test_agg_skips_fully_masked_sequences_and_empty_mask_is_zero():
    loss_mat = torch.tensor([[1.0, 2.0], [float("nan"), 7.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert agg_loss(loss_mat, mask, "seq-mean-token-mean").item() == 1.5
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum").item() == 3.0
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert agg_loss(loss_mat, torch.zeros(2, 2), mode).item() == 0.0


def test_agg_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "sum")


# ---------------------------------------------------------------- KL and entropy


def test_kl_estimators_by_hand():
    # d = log pi - log pi_ref = ln 2
    lp = torch.tensor([[math.log(2.0), 0.0]], dtype=torch.float64)
    ref = torch.zeros(1, 2, dtype=torch.float64)
    ln2 = math.log(2.0)
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), torch.tensor([[ln2, 0.0]]).double())
    torch.testing.assert_close(
        kl_penalty(lp, ref, "k2"), torch.tensor([[0.5 * ln2**2, 0.0]]).double()
    )
    # k3 = exp(-d) + d - 1 = 0.5 + ln 2 - 1
    torch.testing.assert_close(
        kl_penalty(lp, ref, "k3"), torch.tensor([[0.5 + ln2 - 1, 0.0]]).double()
    )
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "k4")  # type: ignore[arg-type]


def test_entropy_uniform_and_one_hot():
    logits = torch.zeros(1, 2, 4)
    logits[0, 1] = torch.tensor([0.0, -float("inf"), -float("inf"), -float("inf")])
    logits.requires_grad_()
    h = entropy_from_logits(logits)
    torch.testing.assert_close(h, torch.tensor([[math.log(4.0), 0.0]]))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
