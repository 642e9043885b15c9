"""Advantage estimators: pure functions from per-sequence outcome rewards to advantages.

Every estimator takes `rewards: Tensor[B]` (one outcome reward per sequence) and
`group_ids: Tensor[B]` (sequences sampled for the same prompt share an id) and returns a
per-sequence advantage `Tensor[B]`. `broadcast_to_tokens` spreads it over the loss mask.

Estimators are registered by name (`@register_advantage("grpo")`) so the trainer picks one from a
config string instead of an if/elif chain.

Not covered here: token-level estimators (GAE, REINFORCE++ returns). Those must carry their return
through masked tool tokens rather than reset at them (DESIGN.md invariant 2; verl issue #7278).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

AdvantageFn = Callable[..., Tensor]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under `name`."""

    def deco(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


def get_advantage_estimator(name: str) -> AdvantageFn:
    """Look up an estimator by name; raise ValueError listing the valid names."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        valid = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {valid}") from None


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group ids to 0..G-1. Returns (index[B], G)."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, uniq.numel()


@register_advantage("grpo")
def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO outcome advantage (GRPO, DeepSeekMath, Shao et al. 2024).

    Args:
        rewards: `[B]` float, one outcome reward per sequence.
        group_ids: `[B]` int; sequences with the same id were sampled for the same prompt.
        normalize_std: divide by the group std (GRPO). False gives Dr.GRPO (Liu et al. 2025):
            `A_i = R_i - mean_G(R)`.
        eps: added to the std so a group whose rewards are all equal gets advantage 0, not nan.

    Returns:
        `[B]` advantages, in the dtype of `rewards`:

            A_i = (R_i - mean_G(R)) / (std_G(R) + eps)

        where G is the group of i and std is the unbiased (N-1) estimate, as `torch.std` and verl
        compute it. A group of size 1 has no baseline and gets advantage 0 (verl instead uses
        mean 0, std 1 there, which passes the raw reward through).
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [B]; got {tuple(rewards.shape)} and "
            f"{tuple(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.double()  # group sums in float64 so large groups do not lose precision
    idx, num_groups = _group_index(group_ids)
    count = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, idx, torch.ones_like(r))  # [G]
    mean = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, idx, r) / count  # [G]
    centered = r - mean[idx]  # [B]
    singleton = count[idx] < 2  # [B]
    if normalize_std:
        sq = torch.zeros(num_groups, dtype=r.dtype).index_add_(0, idx, centered**2)  # [G]
        std = (sq / (count - 1).clamp(min=1)).sqrt()  # [G], unbiased
        adv = centered / (std[idx] + eps)
    else:
        adv = centered
    adv = torch.where(singleton, torch.zeros_like(adv), adv)
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
