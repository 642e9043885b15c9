"""Parity of tirl's estimators and PPO loss with verl 0.9.1's `core_algos`, on hand-built
batches whose responses hold interpreter spans (response_mask 0 between model tokens), and
the differences that are meant (each shown by a test):

- REINFORCE++: a reward that verl's agent loop puts on a trailing interpreter token is lost
  by verl's estimator; `tirl_reinforce_plus_plus` moves it to the last model token.
- REINFORCE++-baseline: verl's ignores gamma; `tirl_reinforce_plus_plus_baseline` discounts.
- GRPO: a group of one gets 0 in tirl, its raw reward in verl.

Runs in the verl environment only (tests/verl/)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tirl.algos.advantages import token_advantages
from tirl.algos.losses import AGG_MODES, agg_loss, kl_penalty, ppo_clip_loss
from tirl.algos.returns import discounted_returns, outcome_token_rewards
from tirl.integrations.verl import require_verl
from tirl.integrations.verl.config_table import DUAL_CLIP_OFF
from tirl.integrations.verl.estimators import (
    TIRL_ESTIMATOR_NAMES,
    register_estimators,
    tirl_reinforce_plus_plus,
    tirl_reinforce_plus_plus_baseline,
)

require_verl()
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

ATOL = 1e-6

# Six responses of 12 tokens: 1 = model token, 0 = interpreter output or padding. Every row
# but the last has an interpreter span between model tokens; groups of 2 and 4.
MASK = torch.tensor(
    [
        [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0],
        [1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    ]
)
REWARDS = torch.tensor([1.0, -1.0, 0.5, 1.0, -1.0, 0.2])
UIDS = np.array(["a", "a", "b", "b", "b", "b"], dtype=object)
GROUPS = torch.tensor([0, 0, 1, 1, 1, 1])


def last_model_token(mask: torch.Tensor) -> torch.Tensor:
    """[B] index of each row's last mask-1 token."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def token_level_rewards(rewards: torch.Tensor, mask: torch.Tensor, at=None) -> torch.Tensor:
    """verl's `token_level_rewards` [B, T]: each reward at position `at` (default: the last
    model token, where verl's agent loop puts it when the response ends on a model token)."""
    at = last_model_token(mask) if at is None else at
    out = torch.zeros(mask.shape, dtype=torch.float32)
    out[torch.arange(mask.shape[0]), at] = rewards
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a.double() - b.double()).abs().max() <= ATOL)


# ---------------------------------------------------------------- advantages both have


def test_grpo_and_dr_grpo_equal_verls_on_model_tokens_with_tool_spans():
    tlr = token_level_rewards(REWARDS, MASK)
    for tirl_name, norm in (("grpo", True), ("drgrpo", False)):
        ours = token_advantages(tirl_name, REWARDS, GROUPS, MASK)
        verls, _ = core_algos.compute_grpo_outcome_advantage(
            tlr, MASK.float(), UIDS, norm_adv_by_std_in_grpo=norm
        )
        assert close(ours, verls), tirl_name
        assert (ours[MASK == 0] == 0).all() and (verls[MASK == 0] == 0).all()
        assert (ours[MASK == 1] != 0).all()  # every model token carries the signal


def test_rloo_equals_verls():
    ours = token_advantages("rloo", REWARDS, GROUPS, MASK)
    verls, _ = core_algos.compute_rloo_outcome_advantage(
        token_level_rewards(REWARDS, MASK), MASK.float(), UIDS
    )
    assert close(ours, verls)


def test_reinforce_pp_baseline_equals_verls_at_gamma_one():
    ours = token_advantages("reinforce++-baseline", REWARDS, GROUPS, MASK, gamma=1.0)
    verls, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        token_level_rewards(REWARDS, MASK), MASK.float(), UIDS, config=AlgoConfig(gamma=1.0)
    )
    assert close(ours, verls)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_returns_carry_through_tool_spans_as_verls_do(gamma):
    """Reward on the last model token: advantages and returns equal verl's (its PR #7300
    return recursion), the discount counting model tokens only."""
    tlr = token_level_rewards(REWARDS, MASK)
    verl_adv, verl_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        tlr, MASK.float(), config=AlgoConfig(gamma=gamma)
    )
    ours = token_advantages("reinforce++", REWARDS, GROUPS, MASK, gamma=gamma)
    returns = discounted_returns(outcome_token_rewards(REWARDS, MASK), MASK, gamma)
    assert close(ours, verl_adv) and close(returns, verl_ret)
    wrapped_adv, wrapped_ret = tirl_reinforce_plus_plus(tlr, MASK.float(), AlgoConfig(gamma=gamma))
    assert close(wrapped_adv, verl_adv) and close(wrapped_ret, verl_ret)
    # row 0: model tokens 0-2 and 6-8, a tool span 3-5; token 2 is 3 model tokens from the end
    assert returns[0, 2].item() == pytest.approx(REWARDS[0].item() * gamma**3)
    assert (returns[0, 3:6] == 0).all()


# ---------------------------------------------------------------- intended differences


def test_a_reward_on_a_trailing_tool_token_is_lost_by_verl_and_kept_by_tirl():
    """verl's agent loop puts reward_score on the last response token; when the response ends
    in interpreter output (row 4: model tokens 0-1 and 8, tool tokens 9-11 kept as response),
    that token has mask 0 and verl's REINFORCE++ never reads it."""
    mask = MASK.clone()
    at = last_model_token(mask)
    at[4] = 11  # the response ends in a tool span: rows' last attention token is a tool token
    tlr_tool = token_level_rewards(REWARDS, mask, at=at)
    assert mask[4, 11] == 0 and tlr_tool[4, 11] == REWARDS[4]
    config = AlgoConfig(gamma=1.0)
    verls, verl_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        tlr_tool, mask.float(), config=config
    )
    lost = REWARDS.clone()
    lost[4] = 0.0
    verl_without, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        token_level_rewards(lost, mask), mask.float(), config=config
    )
    assert close(verls, verl_without) and (verl_ret[4] == 0).all()  # the reward is gone
    ours, ours_ret = tirl_reinforce_plus_plus(tlr_tool, mask.float(), config)
    verl_on_model, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        token_level_rewards(REWARDS, mask), mask.float(), config=config
    )
    assert close(ours, verl_on_model)  # tirl: as if verl had put it on the last model token
    assert not close(ours, verls)
    assert ours_ret[4, 8].item() == pytest.approx(REWARDS[4].item())


def test_reinforce_pp_baseline_discounts_where_verls_ignores_gamma():
    tlr = token_level_rewards(REWARDS, MASK)
    verl_09, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        tlr, MASK.float(), UIDS, config=AlgoConfig(gamma=0.9)
    )
    verl_10, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        tlr, MASK.float(), UIDS, config=AlgoConfig(gamma=1.0)
    )
    assert close(verl_09, verl_10)  # verl's does not read gamma
    ours, ours_ret = tirl_reinforce_plus_plus_baseline(
        tlr, MASK.float(), AlgoConfig(gamma=0.9), UIDS
    )
    assert close(ours, token_advantages("reinforce++-baseline", REWARDS, GROUPS, MASK, gamma=0.9))
    assert not close(ours, verl_09)
    # the centred reward, discounted like REINFORCE++'s return: verl's own recursion agrees
    group_means = torch.stack([REWARDS[GROUPS == g].mean() for g in GROUPS])
    centred = token_level_rewards(REWARDS - group_means, MASK)
    _, verl_ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        centred, MASK.float(), config=AlgoConfig(gamma=0.9)
    )
    assert close(ours_ret, verl_ret)


def test_a_group_of_one_gets_zero_in_tirl_and_its_raw_reward_in_verl():
    uids = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    groups = torch.tensor([0, 0, 1, 1, 1, 2])
    ours = token_advantages("grpo", REWARDS, groups, MASK)
    verls, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards(REWARDS, MASK), MASK.float(), uids
    )
    assert (ours[5] == 0).all()
    assert close(verls[5], torch.full((12,), REWARDS[5].item() / (1 + 1e-6)))
    assert close(ours[:5], verls[:5])  # the groups of two and three agree


def test_the_wrappers_take_outcome_rewards_only():
    tlr = token_level_rewards(REWARDS, MASK)
    kl_in_reward = AlgoConfig(gamma=1.0, use_kl_in_reward=True)
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        tirl_reinforce_plus_plus(tlr, MASK.float(), kl_in_reward)
    with pytest.raises(ValueError, match="index"):
        tirl_reinforce_plus_plus_baseline(tlr, MASK.float(), AlgoConfig(gamma=1.0))


# ---------------------------------------------------------------- registration, verl's driver


def test_registered_estimators_run_in_verls_compute_advantage():
    """Registered twice (idempotent), then called by name through verl's own driver
    (`ray_trainer.compute_advantage`, which the v1 trainer delegates non-GRPO estimators to)."""
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    assert register_estimators() == register_estimators()
    for tirl_name, verl_name in TIRL_ESTIMATOR_NAMES.items():
        assert core_algos.get_adv_estimator_fn(verl_name).__name__ == verl_name
        tlr = token_level_rewards(REWARDS, MASK)
        batch = TensorDict(
            {"token_level_rewards": tlr, "response_mask": MASK.float()}, batch_size=[6]
        )
        data = DataProto(batch=batch, non_tensor_batch={"uid": UIDS})
        out = compute_advantage(data, verl_name, gamma=0.9, config=AlgoConfig(gamma=0.9))
        expected = token_advantages(tirl_name, REWARDS, GROUPS, MASK, gamma=0.9)
        assert close(out.batch["advantages"], expected), verl_name


# ---------------------------------------------------------------- the PPO loss


def loss_case(seed: int = 0):
    """float64 [B, T] log-probs, advantages and the tool-span mask; some log-ratios beyond
    the clip range and a few beyond verl's +-20 clamp, negative advantages among them."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(MASK.shape, generator=g, dtype=torch.float64) * 3
    log_ratio = torch.randn(MASK.shape, generator=g, dtype=torch.float64) * 0.4
    log_ratio[1, 4], log_ratio[3, 9], log_ratio[5, 0] = 25.0, 3.0, -4.0
    adv = torch.randn(MASK.shape, generator=g, dtype=torch.float64)
    adv[1, 4], adv[3, 9] = -0.7, -1.3
    return old + log_ratio, old, adv * MASK


def verl_actor_config(clip_ratio_c: float, norm_len: int | None):
    from verl.workers.config import FSDPActorConfig

    config = FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=clip_ratio_c,
    )
    config.global_batch_info["loss_scale_factor"] = norm_len  # as verl's ppo_loss sets it
    return config


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("clip_ratio_c", [None, 3.0, 10.0])
def test_ppo_clip_loss_and_gradient_equal_verls(agg, clip_ratio_c):
    """clip-higher (0.2 / 0.28), dual clip (tirl's null = verl's DUAL_CLIP_OFF) and every
    aggregation mode (seq-mean-token-sum-norm over a constant 16, verl's loss_scale_factor)."""
    logp, old, adv = loss_case()
    norm_len = 16 if agg == "seq-mean-token-sum-norm" else None
    ours_lp, verl_lp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    ours, metrics = ppo_clip_loss(
        ours_lp, old, adv, MASK, 0.2, 0.28, agg, clip_ratio_c=clip_ratio_c, norm_len=norm_len
    )
    config = verl_actor_config(DUAL_CLIP_OFF if clip_ratio_c is None else clip_ratio_c, norm_len)
    verls, verl_metrics = core_algos.compute_policy_loss_vanilla(
        old, verl_lp, adv, MASK.bool(), loss_agg_mode=agg, config=config
    )
    assert abs(ours.item() - verls.item()) <= ATOL
    ours.backward()
    verls.backward()
    assert close(ours_lp.grad, verl_lp.grad)
    assert (ours_lp.grad[MASK == 0] == 0).all()  # tool tokens get no gradient
    assert metrics["actor/clip_frac"] == pytest.approx(verl_metrics["actor/pg_clipfrac"])
    if clip_ratio_c is None:
        assert verl_metrics["actor/pg_clipfrac_lower"] == 0.0  # the stand-in bound never binds
    elif clip_ratio_c == 3.0:
        assert metrics["actor/dual_clip_frac"] > 0  # the case exercises the dual clip


def test_the_loss_cases_reach_the_clips():
    logp, old, _ = loss_case()
    ratio = (logp - old)[MASK == 1].exp()
    assert (ratio > 1.28).any() and (ratio < 0.8).any() and (ratio > 1e8).any()


@pytest.mark.parametrize("agg", AGG_MODES)
def test_loss_aggregation_equals_verls_with_an_all_tool_row(agg):
    g = torch.Generator().manual_seed(1)
    loss_mat = torch.randn(MASK.shape, generator=g, dtype=torch.float64)
    mask = MASK.clone()
    mask[2] = 0  # a response of interpreter tokens only: no sequence in the seq-mean modes
    norm_len = 16 if agg == "seq-mean-token-sum-norm" else None
    ours = agg_loss(loss_mat, mask, agg, norm_len=norm_len)
    verls = core_algos.agg_loss(loss_mat, mask.double(), agg, loss_scale_factor=norm_len)
    assert abs(ours.item() - verls.item()) <= ATOL


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_estimators_equal_verls(kind):
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(MASK.shape, generator=g, dtype=torch.float64) * 3
    ref = logp + torch.randn(MASK.shape, generator=g, dtype=torch.float64) * 0.5
    assert close(kl_penalty(logp, ref, kind), core_algos.kl_penalty(logp, ref, kind))


def test_importing_the_agent_loop_registers_tirls_estimators_in_verl():
    """verl's trainer process imports the loop module (external_lib) and nothing else of tirl."""
    import subprocess
    import sys

    code = (
        "import tirl.integrations.verl.agent_loop\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "print(get_adv_estimator_fn('tirl_reinforce_plus_plus').__module__)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "tirl.integrations.verl.estimators"
