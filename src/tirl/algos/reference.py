"""Readable loop versions of the advantage estimators, used as test oracles.

Plain Python loops over sequences and positions, one formula per line, no tensor tricks. They are
slow (O(B * T) Python steps) and exist so that `tests/test_algos_advantages.py` can check the
vectorized estimators in `tirl.algos.advantages` and `tirl.algos.returns` against something
whose correctness can be read off the page. Do not call them from training code.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _groups(group_ids: list[int]) -> dict[int, list[int]]:
    """group id -> indices of its members, in batch order."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    return members


def grpo_loop(
    rewards: list[float], group_ids: list[int], normalize_std: bool, eps: float = 1e-6
) -> list[float]:
    """(R_i - mean_G) / (unbiased std_G + eps), or R_i - mean_G; 0 for a group of size 1."""
    adv = [0.0] * len(rewards)
    for members in _groups(group_ids).values():
        n = len(members)
        if n < 2:
            continue
        mean = sum(rewards[i] for i in members) / n
        std = math.sqrt(sum((rewards[i] - mean) ** 2 for i in members) / (n - 1))
        for i in members:
            adv[i] = (rewards[i] - mean) / (std + eps) if normalize_std else rewards[i] - mean
    return adv


def rloo_loop(rewards: list[float], group_ids: list[int]) -> list[float]:
    """R_i minus the mean reward of the OTHER members of i's group; 0 for a group of size 1."""
    adv = [0.0] * len(rewards)
    for members in _groups(group_ids).values():
        if len(members) < 2:
            continue
        for i in members:
            others = [rewards[j] for j in members if j != i]
            adv[i] = rewards[i] - sum(others) / len(others)
    return adv


def group_mean_baseline_loop(rewards: list[float], group_ids: list[int]) -> list[float]:
    """R_i - mean_G(R)."""
    adv = [0.0] * len(rewards)
    for members in _groups(group_ids).values():
        mean = sum(rewards[i] for i in members) / len(members)
        for i in members:
            adv[i] = rewards[i] - mean
    return adv


def returns_loop(
    reward: float, kl_row: list[float], mask_row: list[int], gamma: float, kl_coef: float
) -> list[float]:
    """Discounted return of one sequence over its model tokens only.

    Walks the model positions right to left; tool positions are never visited, so they neither
    reset the return nor add a discount step. The outcome reward sits on the last model token.
    """
    out = [0.0] * len(mask_row)
    model_positions = [t for t, m in enumerate(mask_row) if m]
    running = 0.0
    for t in reversed(model_positions):
        r_t = -kl_coef * kl_row[t] if kl_coef != 0.0 else 0.0
        if t == model_positions[-1]:
            r_t += reward
        running = r_t + gamma * running
        out[t] = running
    return out


def whiten_loop(values: list[list[float]], mask: list[list[int]], eps: float = 1e-8):
    """(x - mean) / sqrt(unbiased var + eps) over all model tokens of the batch; 0 elsewhere."""
    flat = [v for row, mrow in zip(values, mask) for v, m in zip(row, mrow) if m]
    n = len(flat)
    mean = sum(flat) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in flat) / (n - 1) if n > 1 else 0.0
    return [
        [(v - mean) / math.sqrt(var + eps) if m else 0.0 for v, m in zip(row, mrow)]
        for row, mrow in zip(values, mask)
    ]


def token_advantages_loop(
    name: str,
    rewards: Tensor,
    group_ids: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> Tensor:
    """Loop version of `tirl.algos.advantages.token_advantages`; returns float64 `[B, T]`."""
    r = [float(x) for x in rewards.tolist()]
    g = [int(x) for x in group_ids.tolist()]
    m = [[int(bool(x)) for x in row] for row in mask.tolist()]
    kl_rows = kl.tolist() if kl is not None else [[0.0] * len(row) for row in m]

    if name in ("grpo", "drgrpo", "rloo"):
        if name == "rloo":
            per_seq = rloo_loop(r, g)
        else:
            per_seq = grpo_loop(r, g, normalize_std=name == "grpo")
        out = [[a if mt else 0.0 for mt in row] for a, row in zip(per_seq, m)]
    elif name in ("reinforce++", "reinforce++-baseline"):
        if name == "reinforce++-baseline":
            r = group_mean_baseline_loop(r, g)
        returns = [
            returns_loop(ri, kl_row, mrow, gamma, kl_coef)
            for ri, kl_row, mrow in zip(r, kl_rows, m)
        ]
        out = whiten_loop(returns, m)
    else:
        raise ValueError(f"unknown advantage estimator {name!r}")
    return torch.tensor(out, dtype=torch.float64).reshape(mask.shape)
