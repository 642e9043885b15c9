"""Hand-computed PPO clip-higher and dual clip, every aggregation mode, KL, entropy bonus,
and the rule that masked (tool) positions change no loss, gradient or denominator."""

import math

import pytest
import torch

from tirl.algos.losses import AGG_MODES, agg_loss, entropy_bonus, kl_penalty, ppo_clip_loss

NAN, INF = float("nan"), float("inf")


def _one_token_loss(ratio: float, adv: float, **kwargs):
    """PPO loss, d loss / d logprob and metrics for a single model token."""
    logprobs = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    advantages = torch.tensor([[adv]], dtype=torch.float64)
    loss, metrics = ppo_clip_loss(logprobs, old, advantages, torch.ones(1, 1), **kwargs)
    loss.backward()
    return loss.item(), logprobs.grad.item(), metrics


# clip_low 0.2, clip_high 0.28 -> ratio range [0.8, 1.28].  l = max(-A r, -A clip(r)).
# d l / d logprob = -A r where the unclipped term is active, 0 where the clipped one is.
CLIP_HIGHER_CASES = [
    # (ratio, A, loss, grad, clipped)
    (0.7, +1.0, -0.7, -0.7, False),  # max(-0.70, -0.80): unclipped; A>0 may lower r freely
    (1.0, +1.0, -1.0, -1.0, False),  # max(-1.00, -1.00)
    (1.35, +1.0, -1.28, 0.0, True),  # max(-1.35, -1.28): clipped at 1 + 0.28
    (0.7, -1.0, 0.8, 0.0, True),  # max( 0.70,  0.80): clipped at 1 - 0.2
    (1.0, -1.0, 1.0, 1.0, False),  # max( 1.00,  1.00)
    (1.35, -1.0, 1.35, 1.35, False),  # max( 1.35,  1.28): unclipped, loss keeps growing
]


@pytest.mark.parametrize(("ratio", "adv", "loss", "grad", "clipped"), CLIP_HIGHER_CASES)
def test_clip_higher_02_028_by_hand(ratio, adv, loss, grad, clipped):
    got_loss, got_grad, metrics = _one_token_loss(ratio, adv, clip_low=0.2, clip_high=0.28)
    assert got_loss == pytest.approx(loss, abs=1e-12)
    assert got_grad == pytest.approx(grad, abs=1e-12)
    assert metrics["actor/clip_frac"] == float(clipped)
    assert metrics["actor/dual_clip_frac"] == 0.0


def test_clip_higher_batch_token_mean_matches_the_table():
    # sum of the table's losses: -0.7 - 1 - 1.28 + 0.8 + 1 + 1.35 = 0.17, over 6 tokens
    ratios = torch.tensor([[0.7, 1.0, 1.35], [0.7, 1.0, 1.35]], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    loss, m = ppo_clip_loss(ratios.log(), torch.zeros_like(ratios), adv, torch.ones(2, 3))
    assert loss.item() == pytest.approx(0.17 / 6, abs=1e-12)
    assert m["actor/clip_frac"] == pytest.approx(2 / 6)


# dual clip c = 3: for A < 0, l = min(max(-A r, -A clip(r)), -3 A).
DUAL_CLIP_CASES = [
    # (ratio, A, loss, grad, dual clipped)
    (0.7, -1.0, 0.8, 0.0, False),  # min(0.8, 3) = 0.8  (ordinary low clip)
    (1.35, -1.0, 1.35, 1.35, False),  # min(1.35, 3)
    (2.5, -1.0, 2.5, 2.5, False),  # min(2.5, 3): below the bound, gradient unchanged
    (4.0, -1.0, 3.0, 0.0, True),  # min(max(4, 1.28), 3) = 3: bounded, no gradient
    (4.0, -2.0, 6.0, 0.0, True),  # min(max(8, 2.56), 6) = 6
    (4.0, +1.0, -1.28, 0.0, False),  # A > 0: dual clip does not apply; max(-4, -1.28)
]


@pytest.mark.parametrize(("ratio", "adv", "loss", "grad", "dual"), DUAL_CLIP_CASES)
def test_dual_clip_c3_by_hand(ratio, adv, loss, grad, dual):
    got_loss, got_grad, metrics = _one_token_loss(ratio, adv, clip_ratio_c=3.0)
    assert got_loss == pytest.approx(loss, abs=1e-12)
    assert got_grad == pytest.approx(grad, abs=1e-12)
    assert metrics["actor/dual_clip_frac"] == float(dual)


def test_without_dual_clip_a_huge_ratio_is_unbounded():
    # the same A = -1, r = 4 token: max(4, 1.28) = 4, gradient -A r = 4
    loss, grad, _ = _one_token_loss(4.0, -1.0)
    assert (loss, grad) == pytest.approx((4.0, 4.0))


@pytest.mark.parametrize("c", [1.0, 0.5, 0.0, -3.0])
def test_dual_clip_bound_must_exceed_one(c):
    with pytest.raises(ValueError, match="clip_ratio_c.*> 1"):
        _one_token_loss(1.0, -1.0, clip_ratio_c=c)


# ---------------------------------------------------------------- aggregation

# rows: [1, 2, 3, 4] with mask [1, 1, 0, 1] -> model sum 7 over 3 tokens
#       [5, 6, 7, 8] with mask [0, 1, 0, 0] -> model sum 6 over 1 token
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
MASK = torch.tensor([[1, 1, 0, 1], [0, 1, 0, 0]])
AGG_CASES = [
    ("token-mean", {}, 13 / 4),  # (7 + 6) / 4 tokens = 3.25
    ("seq-mean-token-mean", {}, (7 / 3 + 6 / 1) / 2),  # = 25/6
    ("seq-mean-token-sum", {}, (7 + 6) / 2),  # = 6.5
    ("seq-mean-token-sum-norm", {}, (7 / 4 + 6 / 4) / 2),  # norm_len = T = 4 -> 1.625
    ("seq-mean-token-sum-norm", {"norm_len": 10}, (7 / 10 + 6 / 10) / 2),  # = 0.65
]


@pytest.mark.parametrize(("mode", "kwargs", "expected"), AGG_CASES)
def test_each_agg_mode_by_hand(mode, kwargs, expected):
    assert agg_loss(LOSS, MASK, mode, **kwargs).item() == pytest.approx(expected, abs=1e-6)


def _garbage_at_masked(x: torch.Tensor, mask: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.full_like(x, fill))


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("fill", [NAN, INF, -INF, 1e30, -7.0])
def test_masked_values_change_neither_loss_nor_gradient(mode, fill):
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 0], [1, 0, 0, 1, 1, 1]])
    lp = torch.randn(3, 6, generator=gen, dtype=torch.float64) * 0.1 - 1.0
    old = lp + torch.randn(3, 6, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(3, 6, generator=gen, dtype=torch.float64)

    def run(fill_value):
        logprobs = _garbage_at_masked(lp, mask, fill_value).requires_grad_()
        loss, _ = ppo_clip_loss(
            logprobs,
            _garbage_at_masked(old, mask, fill_value),
            _garbage_at_masked(adv, mask, fill_value),
            mask,
            agg=mode,
            clip_ratio_c=3.0,
        )
        loss.backward()
        return loss.detach(), logprobs.grad

    clean_loss, clean_grad = run(0.0)
    loss, grad = run(fill)
    assert torch.equal(loss, clean_loss)
    assert torch.equal(grad, clean_grad)
    assert (grad[mask == 0] == 0).all()


@pytest.mark.parametrize("mode", AGG_MODES)
def test_tool_span_changes_no_denominator(mode):
    # The same model tokens with a 3-token tool span inserted between them. norm_len is pinned
    # for the -norm mode (its default, T, is the tensor width and would change with it).
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    tool = torch.full((2, 3), 100.0)
    loss_with_tool = torch.cat([loss[:, :1], tool, loss[:, 1:]], dim=1)
    mask_with_tool = torch.cat([mask[:, :1], torch.zeros(2, 3, dtype=mask.dtype), mask[:, 1:]], 1)
    kwargs = {"norm_len": 8} if mode == "seq-mean-token-sum-norm" else {}
    short = agg_loss(loss, mask, mode, **kwargs)
    long = agg_loss(loss_with_tool, mask_with_tool, mode, **kwargs)
    assert long.item() == pytest.approx(short.item(), abs=1e-12)


def test_tool_span_does_not_change_token_mean_denominator_in_ppo_loss():
    # token-mean over 2 model tokens with gradient 1/2 each, before and after a tool span.
    lp = torch.log(torch.tensor([[1.1, 0.9]]))
    adv = torch.ones(1, 2)
    short, _ = ppo_clip_loss(lp, torch.zeros(1, 2), adv, torch.ones(1, 2))
    lp_long = torch.cat([lp[:, :1], torch.full((1, 4), 3.0), lp[:, 1:]], dim=1).requires_grad_()
    adv_long = torch.cat([adv[:, :1], torch.full((1, 4), 50.0), adv[:, 1:]], dim=1)
    mask_long = torch.tensor([[1, 0, 0, 0, 0, 1]])
    long, _ = ppo_clip_loss(lp_long, torch.zeros(1, 6), adv_long, mask_long)
    long.backward()
    assert long.item() == pytest.approx(short.item())  # -(1.1 + 0.9) / 2 = -1.0
    assert long.item() == pytest.approx(-1.0)
    # inside the clip range: d/dlogprob = -A r / N = -1.1/2 and -0.9/2
    torch.testing.assert_close(
        lp_long.grad, torch.tensor([[-0.55, 0.0, 0.0, 0.0, 0.0, -0.45]]), atol=1e-6, rtol=0
    )


def test_norm_len_must_be_positive():
    with pytest.raises(ValueError, match="norm_len"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=0)


# ---------------------------------------------------------------- KL estimators


def test_k1_k2_k3_by_hand_for_negative_and_positive_log_ratio():
    # d = log pi - log pi_ref per token: [-ln 2, 1, 0]
    ln2 = math.log(2.0)
    lp = torch.tensor([[-ln2, 1.0, 0.0]], dtype=torch.float64)
    ref = torch.zeros(1, 3, dtype=torch.float64)
    # k1 = d
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), lp)
    # k2 = d^2 / 2 = [ln2^2 / 2, 0.5, 0]
    torch.testing.assert_close(
        kl_penalty(lp, ref, "k2"), torch.tensor([[ln2**2 / 2, 0.5, 0.0]]).double()
    )
    # k3 = exp(-d) + d - 1:
    #   d = -ln 2 -> 2 - ln 2 - 1 = 1 - ln 2;   d = 1 -> e^-1 + 1 - 1 = e^-1;   d = 0 -> 0
    torch.testing.assert_close(
        kl_penalty(lp, ref, "k3"), torch.tensor([[1 - ln2, math.exp(-1.0), 0.0]]).double()
    )


def test_k3_is_clamped_at_ten_like_verl():
    # d = -5: exp(5) - 5 - 1 = 142.4 -> clamped to 10
    lp, ref = torch.tensor([[-5.0]]), torch.zeros(1, 1)
    assert kl_penalty(lp, ref, "k3").item() == 10.0


def test_unknown_kl_estimator_lists_valid_ones():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full")  # type: ignore[arg-type]


# ---------------------------------------------------------------- entropy bonus


def test_entropy_bonus_by_hand_over_model_tokens():
    # row 0: H [1, 2, nan(tool)]   row 1: H [3, inf(tool), 0(pad)]
    h = torch.tensor([[1.0, 2.0, NAN], [3.0, INF, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert entropy_bonus(h, mask).item() == 2.0  # token-mean (1 + 2 + 3) / 3
    assert entropy_bonus(h, mask, "seq-mean-token-mean").item() == 2.25  # (1.5 + 3) / 2
    assert entropy_bonus(h, mask, "seq-mean-token-sum").item() == 3.0  # (3 + 3) / 2
    entropy_bonus(h, mask).backward()
    torch.testing.assert_close(h.grad, torch.tensor([[1 / 3, 1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
