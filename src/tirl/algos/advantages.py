"""Advantage estimators: pure functions from outcome rewards to per-token advantages.

Inputs are `rewards: Tensor[B]` (one outcome reward per sequence), `group_ids: Tensor[B]`
(sequences sampled for the same prompt share an id) and `mask: Tensor[B, T]` (1 = token the
model sampled, 0 = prompt, tool output or padding). The one entry point is

    token_advantages(name, rewards, group_ids, mask, *, gamma=1.0, kl=None, kl_coef=0.0, **params)

which returns `[B, T]` advantages, exactly 0 at masked positions. Estimators are registered by
name (`@register_advantage("rloo")`), so the trainer picks one from a config string
(`rl.advantage`); `params` are an estimator's own keyword hyper-parameters
(`rl.advantage_params`), passed through unchanged:

| name                   | advantage                                                   |
|------------------------|-------------------------------------------------------------|
| `grpo`                 | (R - mean_G R) / (std_G R + eps), on every model token       |
| `drgrpo`               | R - mean_G R, on every model token                          |
| `rloo`                 | R - mean of the other members of the group                  |
| `reinforce++`          | whiten_batch(discounted return over model tokens)           |
| `reinforce++-baseline` | same, with R replaced by R - mean_G R                       |

The outcome estimators (`grpo`, `drgrpo`, `rloo`) have no per-token reward, so they reject
gamma != 1 and kl_coef != 0 rather than ignore them; put the KL into the loss instead
(`tirl.algos.losses.kl_penalty`). The REINFORCE++ returns carry through tool tokens
(`tirl.algos.returns`). Loop versions of every estimator live in `tirl.algos.reference`.

Not covered here: GAE / critic-based estimators, ReMax, OPO, pass@k advantages.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tirl.algos.returns import discounted_returns, masked_whiten, outcome_token_rewards
from tirl.registry import Registry

# (rewards [B], group_ids [B], mask [B, T], *, gamma, kl, kl_coef) -> advantages [B, T]
AdvantageFn = Callable[..., Tensor]

ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator", entry_type=Callable)

# The arguments every estimator receives from `token_advantages`; any other keyword is a parameter.
ADVANTAGE_ARGS = ("rewards", "group_ids", "mask", "gamma", "kl", "kl_coef")

# Decorator: register a token-level advantage estimator under a name.
register_advantage = ADVANTAGE_ESTIMATORS.register


def get_advantage_estimator(name: str) -> AdvantageFn:
    """Look up an estimator by name; KeyError listing the registered names."""
    return ADVANTAGE_ESTIMATORS.get_entry(name)


# ---------------------------------------------------------------- per-sequence (group) baselines


def _check_rewards(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [B]; got {tuple(rewards.shape)} and "
            f"{tuple(group_ids.shape)}"
        )


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Float64 `(r, idx, count, mean)`, all `[B]`: each sequence's reward, its group mapped to
    0..G-1, the size of its group and its group's mean. Sums run in float64 so large groups do
    not lose precision. Needs B >= 1."""
    r = rewards.double()
    idx = torch.unique(group_ids, return_inverse=True)[1]  # [B]
    zeros = torch.zeros(int(idx.max()) + 1, dtype=r.dtype, device=r.device)  # [G]
    count = zeros.index_add(0, idx, torch.ones_like(r))  # [G]
    mean = zeros.index_add(0, idx, r) / count  # [G]
    return r, idx, count[idx], mean[idx]


def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO outcome advantage per sequence (GRPO, DeepSeekMath, Shao et al. 2024, section 4.1.2;
    verl `compute_grpo_outcome_advantage`).

    Args:
        rewards: `[B]` float, one outcome reward per sequence.
        group_ids: `[B]` int; sequences with the same id were sampled for the same prompt.
        normalize_std: divide by the group std (GRPO). False gives Dr.GRPO (Liu et al. 2025,
            "Understanding R1-Zero-Like Training", section 3.1): `A_i = R_i - mean_G(R)`.
        eps: added to the std so a group whose rewards are all equal gets advantage 0, not nan.

    Returns:
        `[B]` advantages, in the dtype of `rewards`:

            A_i = (R_i - mean_G(R)) / (std_G(R) + eps)

        where G is the group of i and std is the unbiased (N-1) estimate, as `torch.std` and verl
        compute it. A group of size 1 has no baseline and gets advantage 0 (verl instead uses
        mean 0, std 1 there, which passes the raw reward through).
    """
    _check_rewards(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    r, idx, count, mean = _group_stats(rewards, group_ids)
    centered = r - mean  # [B]
    if normalize_std:
        sq = torch.zeros(int(idx.max()) + 1, dtype=r.dtype, device=r.device)  # [G]
        sq = sq.index_add(0, idx, centered**2)[idx]  # [B], sum of squares in i's group
        std = (sq / (count - 1).clamp(min=1)).sqrt()  # [B], unbiased
        adv = centered / (std + eps)
    else:
        adv = centered
    adv = torch.where(count < 2, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


def group_mean_baseline(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """`R_i - mean_G(R)` per sequence `[B]` (the REINFORCE++-baseline centring, verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`). A group of size 1 is centred on
    itself and gets 0 (verl uses mean 0 there, passing the raw reward through)."""
    _check_rewards(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    r, _, _, mean = _group_stats(rewards, group_ids)
    return (r - mean).to(rewards.dtype)


def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO leave-one-out advantage per sequence `[B]` (Ahmadian et al. 2024, "Back to Basics";
    Kool et al. 2019; verl `compute_rloo_outcome_advantage`):

        A_i = R_i - (sum_{j in G, j != i} R_j) / (n - 1) = n / (n - 1) * (R_i - mean_G(R))

    with n the size of i's group. A group of size 1 has no other member and gets 0.
    """
    _check_rewards(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    r, _, count, mean = _group_stats(rewards, group_ids)
    adv = count / (count - 1).clamp(min=1) * (r - mean)
    adv = torch.where(count < 2, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


def broadcast_to_tokens(adv: Tensor, mask: Tensor) -> Tensor:
    """Spread a per-sequence advantage over the tokens: `adv[B] , mask[B, T] -> [B, T]`.

    Returns `adv[:, None] * mask`, so prompt and tool positions (mask 0) get advantage 0.
    The losses in `tirl.algos.losses` mask again with `torch.where`, so this is not what keeps
    tool tokens out of the loss; it keeps logged per-token advantages honest.
    """
    if adv.dim() != 1 or mask.dim() != 2 or mask.shape[0] != adv.shape[0]:
        raise ValueError(
            f"need adv [B] and mask [B, T]; got {tuple(adv.shape)}, {tuple(mask.shape)}"
        )
    return adv[:, None] * mask.to(adv.dtype)


# ---------------------------------------------------------------- registered token estimators


def _outcome_only(name: str, gamma: float, kl_coef: float) -> None:
    if gamma != 1.0 or kl_coef != 0.0:
        raise ValueError(
            f"{name!r} is an outcome estimator: it takes no discount or per-token KL reward "
            f"(got gamma={gamma}, kl_coef={kl_coef}); use 'reinforce++' or put the KL in the loss"
        )


def _outcome_estimator(name: str, per_sequence: Callable[[Tensor, Tensor], Tensor]) -> AdvantageFn:
    """Register an outcome estimator: its per-sequence advantage on every model token."""

    def token_fn(
        rewards: Tensor,
        group_ids: Tensor,
        mask: Tensor,
        *,
        gamma: float,
        kl: Tensor | None,
        kl_coef: float,
    ) -> Tensor:
        _outcome_only(name, gamma, kl_coef)
        return broadcast_to_tokens(per_sequence(rewards, group_ids), mask)

    token_fn.__name__ = f"{name}_token_advantages"
    token_fn.__doc__ = f"The {name} advantage of each sequence, on every model token."
    return register_advantage(name)(token_fn)


grpo_token_advantages = _outcome_estimator("grpo", grpo)
drgrpo_token_advantages = _outcome_estimator(
    "drgrpo", lambda rewards, group_ids: grpo(rewards, group_ids, normalize_std=False)
)
rloo_token_advantages = _outcome_estimator("rloo", rloo)


@register_advantage("reinforce++")
def reinforce_pp_token_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    kl: Tensor | None,
    kl_coef: float,
) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262; verl
    `compute_reinforce_plus_plus_outcome_advantage` after PR #7300):

        r_t = R * 1[t = last model token] - kl_coef * kl_t
        G_t = r_t + gamma * G_next(t)          (next MODEL token; tool tokens carry G)
        A   = (G - mean) / sqrt(var + 1e-8)    (mean, unbiased var over the batch's model tokens)

    `group_ids` is unused: the baseline is the batch-level whitening.
    """
    del group_ids
    token_rewards = outcome_token_rewards(rewards, mask, kl, kl_coef)  # [B, T]
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)


@register_advantage("reinforce++-baseline")
def reinforce_pp_baseline_token_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    kl: Tensor | None,
    kl_coef: float,
) -> Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262; verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`, slime, OpenRLHF
    `reinforce_baseline`): subtract the group mean from each outcome reward, then the
    REINFORCE++ return and batch whitening above. With gamma = 1 and no KL this is verl's
    `whiten_batch((R_i - mean_G R) * m)`.
    """
    centred = group_mean_baseline(rewards, group_ids)  # [B]
    token_rewards = outcome_token_rewards(centred, mask, kl, kl_coef)  # [B, T]
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)


def token_advantages(
    name: str,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    **params: object,
) -> Tensor:
    """Per-token advantages `[B, T]` from the estimator registered as `name`.

    Args:
        name: one of `ADVANTAGE_ESTIMATORS` (grpo, drgrpo, rloo, reinforce++,
            reinforce++-baseline); anything else raises ValueError listing them.
        rewards: `[B]` outcome reward per sequence.
        group_ids: `[B]` int; sequences with the same id were sampled for the same prompt.
        mask: `[B, T]` loss mask, 1 = model token; 0 = prompt, tool output, padding.
        gamma: discount per MODEL token (REINFORCE++ only; tool tokens are not steps).
        kl: `[B, T]` per-token KL estimate for KL-shaped rewards (REINFORCE++ only).
        kl_coef: weight of `kl` in the reward; 0 disables it.
        params: the estimator's own keyword parameters (none for the built-in ones).

    Returns:
        `[B, T]` in the dtype of `rewards` (the default float dtype for integer rewards);
        exactly 0 wherever `mask` is 0.
    """
    fn = get_advantage_estimator(name)
    _check_rewards(rewards, group_ids)
    if not rewards.is_floating_point():  # integer +-1 rewards would truncate the advantages
        rewards = rewards.to(torch.get_default_dtype())
    if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask must be [B, T] with B={rewards.shape[0]}; got {tuple(mask.shape)}")
    if kl is not None and kl.shape != mask.shape:
        raise ValueError(f"kl has shape {tuple(kl.shape)}, expected {tuple(mask.shape)}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1]; got {gamma}")
    adv = fn(rewards, group_ids, mask, gamma=gamma, kl=kl, kl_coef=kl_coef, **params)  # [B, T]
    m = mask.bool()
    return torch.where(m, adv, torch.zeros((), dtype=adv.dtype, device=adv.device)).to(
        rewards.dtype
    )
