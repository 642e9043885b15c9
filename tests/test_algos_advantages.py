"""Token-level advantages: hand-computed cases, tool-span handling, loop vs vectorized."""

import math

import pytest
import torch

from tirl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    group_mean_baseline,
    rloo,
    token_advantages,
)
from tirl.algos.reference import token_advantages_loop
from tirl.algos.returns import (
    discounted_returns,
    last_model_token,
    masked_whiten,
    outcome_token_rewards,
)

NAN = float("nan")
M, TOOL = 1, 0  # mask values: model-sampled token, tool-output token


# ---------------------------------------------------------------- REINFORCE++ by hand


def test_reinforce_pp_return_carries_through_tool_tokens_gamma_half():
    # sequence [m, m, tool, tool, m], reward R = 1 on the last model token (position 4).
    # Model tokens are discount steps 0, 1, 2; the tool tokens are not steps:
    #   G4 = 1
    #   G1 = 0 + 0.5 * G4 = 0.5       (the two tool tokens in between carry G4 unchanged)
    #   G0 = 0 + 0.5 * G1 = 0.25
    # verl before PR #7300 reset the return at tool tokens and gave [0, 0, 0, 0, 1].
    mask = torch.tensor([[M, M, TOOL, TOOL, M]])
    rewards = torch.tensor([1.0])
    returns = discounted_returns(outcome_token_rewards(rewards, mask), mask, gamma=0.5)
    expected = torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0]], dtype=torch.float64)
    assert torch.equal(returns, expected)

    # Whitening over the 3 model tokens [0.25, 0.5, 1]:
    #   mean = 1.75 / 3 = 7/12; deviations = (-4, -1, 5) / 12
    #   unbiased var = ((16 + 1 + 25) / 144) / 2 = 7/48
    #   A = (-4, -1, 5) / 12 / sqrt(7/48) = (-4, -1, 5) / sqrt(21)
    adv = token_advantages("reinforce++", rewards, torch.tensor([0]), mask, gamma=0.5)
    s = math.sqrt(21)
    torch.testing.assert_close(adv, torch.tensor([[-4 / s, -1 / s, 0.0, 0.0, 5 / s]]))
    assert adv[0, 0] != 0  # the token before the tool call gets credit


def test_reinforce_pp_kl_shaped_reward_by_hand():
    # kl = [0.2, 0.4, nan, nan, 0.2] (nan at tool tokens must be ignored), kl_coef 0.5, R = 1:
    #   r = [-0.1, -0.2, 0, 0, 1 - 0.1 = 0.9]
    #   G4 = 0.9;  G1 = -0.2 + 0.5 * 0.9 = 0.25;  G0 = -0.1 + 0.5 * 0.25 = 0.025
    mask = torch.tensor([[M, M, TOOL, TOOL, M]])
    kl = torch.tensor([[0.2, 0.4, NAN, NAN, 0.2]])
    r = outcome_token_rewards(torch.tensor([1.0]), mask, kl, kl_coef=0.5)
    torch.testing.assert_close(r, torch.tensor([[-0.1, -0.2, 0.0, 0.0, 0.9]], dtype=torch.float64))
    returns = discounted_returns(r, mask, gamma=0.5)
    torch.testing.assert_close(
        returns, torch.tensor([[0.025, 0.25, 0.0, 0.0, 0.9]], dtype=torch.float64)
    )


def test_tool_tokens_are_not_discount_steps():
    # The model tokens of [m, tool, m, tool, tool, m] get the same returns as [m, m, m].
    gamma = 0.9
    plain = torch.tensor([[M, M, M]])
    with_tools = torch.tensor([[M, TOOL, M, TOOL, TOOL, M]])
    r = torch.tensor([2.0])
    g_plain = discounted_returns(outcome_token_rewards(r, plain), plain, gamma)
    g_tools = discounted_returns(outcome_token_rewards(r, with_tools), with_tools, gamma)
    # 2 * 0.9^2 = 1.62, 2 * 0.9 = 1.8, 2
    torch.testing.assert_close(g_plain[0], torch.tensor([1.62, 1.8, 2.0], dtype=torch.float64))
    assert torch.equal(g_tools[0, [0, 2, 5]], g_plain[0])
    assert torch.equal(g_tools[0, [1, 3, 4]], torch.zeros(3, dtype=torch.float64))


def test_reinforce_pp_baseline_by_hand():
    # one group, rewards [1, 0] -> centred [0.5, -0.5]; gamma 1, no KL.
    # row 0 mask [m, tool, m] -> returns [0.5, 0, 0.5];  row 1 mask [m, pad, pad] -> [-0.5, 0, 0]
    # whitening over the 3 model tokens [0.5, 0.5, -0.5]:
    #   mean = 1/6; deviations [1/3, 1/3, -2/3]; unbiased var = (1/9 + 1/9 + 4/9) / 2 = 1/3
    #   A = deviations * sqrt(3) = [1/sqrt3, 1/sqrt3, -2/sqrt3]
    mask = torch.tensor([[M, TOOL, M], [M, 0, 0]])
    adv = token_advantages(
        "reinforce++-baseline", torch.tensor([1.0, 0.0]), torch.tensor([4, 4]), mask
    )
    a = 1 / math.sqrt(3)
    torch.testing.assert_close(adv, torch.tensor([[a, 0.0, a], [-2 * a, 0.0, 0.0]]))


def test_group_mean_baseline_by_hand():
    # group 0: [1, 0, 0.5] mean 0.5 -> [0.5, -0.5, 0];  group 1: [3] -> centred on itself, 0
    r = group_mean_baseline(torch.tensor([1.0, 0.0, 0.5, 3.0]), torch.tensor([0, 0, 0, 1]))
    assert r.tolist() == [0.5, -0.5, 0.0, 0.0]


# ---------------------------------------------------------------- outcome estimators by hand


def test_rloo_group_of_three_by_hand():
    # group 5: rewards [1, 0, 0.5]
    #   A_0 = 1   - (0 + 0.5) / 2 =  0.75
    #   A_1 = 0   - (1 + 0.5) / 2 = -0.75
    #   A_2 = 0.5 - (1 + 0)   / 2 =  0
    # group 9 has one member: no leave-one-out baseline -> 0
    rewards = torch.tensor([1.0, 0.0, 0.5, 7.0])
    groups = torch.tensor([5, 5, 5, 9])
    assert rloo(rewards, groups).tolist() == [0.75, -0.75, 0.0, 0.0]
    mask = torch.tensor([[M, TOOL, M], [M, M, 0], [M, 0, 0], [M, M, M]])
    expected = torch.tensor([[0.75, 0.0, 0.75], [-0.75, -0.75, 0.0], [0.0] * 3, [0.0] * 3])
    assert torch.equal(token_advantages("rloo", rewards, groups, mask), expected)


def test_grpo_and_drgrpo_token_advantages_by_hand():
    # one group, rewards [1, 0]: mean 0.5, unbiased std sqrt(0.5)
    #   grpo:   +-0.5 / sqrt(0.5) = +-1/sqrt2;  drgrpo: +-0.5
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    mask = torch.tensor([[M, TOOL, M], [TOOL, M, 0]])
    a = 1 / math.sqrt(2)
    torch.testing.assert_close(
        token_advantages("grpo", rewards, groups, mask),
        torch.tensor([[a, 0.0, a], [0.0, -a, 0.0]]),
        atol=1e-5,
        rtol=0,
    )
    assert token_advantages("drgrpo", rewards, groups, mask).tolist() == [
        [0.5, 0.0, 0.5],
        [0.0, -0.5, 0.0],
    ]


# ---------------------------------------------------------------- helpers by hand


def test_last_model_token_skips_trailing_tool_and_padding():
    mask = torch.tensor([[M, TOOL, M, TOOL, 0], [0, 0, 0, 0, 0], [TOOL, M, M, M, 0]])
    expected = torch.tensor([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 1, 0]]).bool()
    assert torch.equal(last_model_token(mask), expected)


def test_masked_whiten_by_hand_ignores_masked_values():
    # model values [1, 2, 3]: mean 2, unbiased var 1 -> [-1, 0, 1] (eps 1e-8 is negligible)
    values = torch.tensor([[1.0, NAN, 2.0], [1e9, 3.0, float("inf")]])
    mask = torch.tensor([[M, TOOL, M], [TOOL, M, TOOL]])
    out = masked_whiten(values, mask)
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).double())


# ---------------------------------------------------------------- every estimator


def _random_tool_mask(gen: torch.Generator, b: int, t: int) -> torch.Tensor:
    """Rows of alternating model / tool spans of random lengths, then padding."""
    mask = torch.zeros(b, t, dtype=torch.long)
    for i in range(b):
        length = int(torch.randint(0, t + 1, (1,), generator=gen))
        pos, model_turn = 0, bool(torch.randint(0, 2, (1,), generator=gen))
        while pos < length:
            span = int(torch.randint(1, 5, (1,), generator=gen))
            if model_turn:
                mask[i, pos : min(pos + span, length)] = 1
            pos += span
            model_turn = not model_turn
    return mask


def _random_case(gen: torch.Generator):
    b = int(torch.randint(1, 12, (1,), generator=gen))
    t = int(torch.randint(1, 24, (1,), generator=gen))
    mask = _random_tool_mask(gen, b, t)
    if bool(torch.randint(0, 2, (1,), generator=gen)):
        rewards = torch.randint(0, 2, (b,), generator=gen).double() * 2 - 1  # +-1, ties
    else:
        rewards = torch.randn(b, generator=gen, dtype=torch.float64)
    groups = torch.randint(0, 4, (b,), generator=gen)
    kl = torch.randn(b, t, generator=gen, dtype=torch.float64)
    kl = torch.where(mask.bool(), kl, torch.full_like(kl, NAN))  # garbage at tool tokens
    return rewards, groups, mask, kl


@pytest.mark.parametrize(
    ("name", "gamma", "kl_coef"),
    [
        ("grpo", 1.0, 0.0),
        ("drgrpo", 1.0, 0.0),
        ("rloo", 1.0, 0.0),
        ("reinforce++", 1.0, 0.0),
        ("reinforce++", 0.9, 0.0),
        ("reinforce++", 0.5, 0.1),
        ("reinforce++", 1.0, 0.1),
        ("reinforce++-baseline", 1.0, 0.0),
        ("reinforce++-baseline", 0.7, 0.05),
    ],
)
def test_loop_and_vectorized_agree_on_random_tool_spans(name, gamma, kl_coef):
    gen = torch.Generator().manual_seed(1234)
    for _ in range(25):
        rewards, groups, mask, kl = _random_case(gen)
        kwargs = {"gamma": gamma, "kl": kl, "kl_coef": kl_coef}
        fast = token_advantages(name, rewards, groups, mask, **kwargs)
        slow = token_advantages_loop(name, rewards, groups, mask, **kwargs)
        torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_masked_positions_are_exactly_zero_and_dtype_follows_rewards(name):
    gen = torch.Generator().manual_seed(7)
    rewards, groups, mask, kl = _random_case(gen)
    adv = token_advantages(name, rewards.float(), groups, mask, kl=kl)  # kl_coef 0: kl unused
    assert adv.dtype == torch.float32
    assert adv.shape == mask.shape
    assert torch.isfinite(adv).all()
    assert (adv[mask == 0] == 0).all()


def test_integer_rewards_give_float_advantages():
    # +-1 as int64: drgrpo over one group [1, -1] -> mean 0 -> [1, -1] on model tokens
    mask = torch.tensor([[M, TOOL], [M, M]])
    adv = token_advantages("drgrpo", torch.tensor([1, -1]), torch.tensor([0, 0]), mask)
    assert adv.dtype == torch.get_default_dtype()
    assert adv.tolist() == [[1.0, 0.0], [-1.0, -1.0]]
    rloo_adv = token_advantages("rloo", torch.tensor([1, 0, 0]), torch.zeros(3), torch.ones(3, 1))
    assert rloo_adv.flatten().tolist() == [1.0, -0.5, -0.5]  # 1 - 0, 0 - (1 + 0)/2


def test_sequence_without_model_tokens_gets_zero_everywhere():
    mask = torch.tensor([[M, TOOL, M], [TOOL, TOOL, 0]])
    adv = token_advantages("reinforce++", torch.tensor([1.0, 5.0]), torch.tensor([0, 1]), mask)
    assert adv[1].tolist() == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------- argument errors


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError) as err:
        token_advantages("ppo", torch.zeros(1), torch.zeros(1), torch.ones(1, 1))
    for name in ("grpo", "drgrpo", "rloo", "reinforce++", "reinforce++-baseline"):
        assert name in str(err.value)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_outcome_estimators_reject_discount_and_kl_reward(name):
    args = (torch.zeros(2), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="outcome estimator"):
        token_advantages(name, *args, gamma=0.9)
    with pytest.raises(ValueError, match="outcome estimator"):
        token_advantages(name, *args, kl=torch.zeros(2, 3), kl_coef=0.1)


def test_bad_shapes_gamma_and_missing_kl_raise():
    r, g, m = torch.zeros(2), torch.zeros(2), torch.ones(2, 3)
    with pytest.raises(ValueError, match="kl_coef"):
        token_advantages("reinforce++", r, g, m, kl_coef=0.1)
    with pytest.raises(ValueError, match="gamma"):
        token_advantages("reinforce++", r, g, m, gamma=1.5)
    with pytest.raises(ValueError, match="mask"):
        token_advantages("reinforce++", r, g, torch.ones(3, 3))
    with pytest.raises(ValueError, match="kl"):
        token_advantages("reinforce++", r, g, m, kl=torch.zeros(2, 4), kl_coef=0.1)
