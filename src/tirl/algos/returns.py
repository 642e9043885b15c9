"""Token-level returns for REINFORCE++: reward placement, discounted returns, batch whitening.

All functions take `mask: [B, T]` (1 = token the model sampled, 0 = prompt, tool output or
padding) and work on MODEL tokens only:

- the outcome reward sits on the last model token of each sequence (as slime and OpenRLHF place
  it; verl puts it on the last attention-mask token, which in multi-turn runs can be a tool or
  user token);
- the per-token KL shaping term is read at model tokens only (slime PR #1372 had to add this);
- the discounted return is a recursion over model tokens. A tool token neither resets the return
  nor counts as a discount step, so tokens before a tool call still get credit for the outcome.
  verl's `compute_reinforce_plus_plus_outcome_advantage` multiplied the running return by the
  mask at every position, which zeroed every return before the last tool span (verl issue
  #7278, fixed by PR #7300; research/rl-frameworks.md section 1.3).

Masked positions of every output are exactly 0, also when the inputs hold inf/nan there.
Not covered here: GAE / value baselines, per-turn (process) rewards.
"""

from __future__ import annotations

import torch
from torch import Tensor

# verl `masked_whiten` adds 1e-8 to the variance before rsqrt.
WHITEN_EPS = 1e-8


def _masked(x: Tensor, m: Tensor) -> Tensor:
    """`x` where `m` is True, exactly 0 elsewhere (also when x is inf/nan there)."""
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def last_model_token(mask: Tensor) -> Tensor:
    """`mask [B, T] -> bool [B, T]`: True only at the last mask-1 position of each row.

    A row without any model token has no True entry.
    """
    m = mask.bool()
    seen = m.long().cumsum(dim=-1)  # [B, T] model tokens up to and including t
    total = seen[:, -1:]  # [B, 1]
    # The running count first reaches the total at the last model token; `& m` drops the tool
    # and padding positions after it, which share that count.
    return (seen == total) & m


def outcome_token_rewards(
    rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0
) -> Tensor:
    """Per-token rewards `[B, T]` for REINFORCE++ (Hu 2025, arXiv:2501.03262; verl
    `apply_kl_penalty` and reward placement; research/rl-frameworks.md section 12):

        r_t = R * 1[t = last model token] - kl_coef * kl_t     at model tokens
        r_t = 0                                                   at masked tokens

    Args:
        rewards: `[B]` outcome reward per sequence.
        mask: `[B, T]` loss mask.
        kl: `[B, T]` per-token KL estimate (e.g. `kl_penalty(..., "k1")`), or None.
        kl_coef: weight beta of the KL shaping term; needs `kl` when non-zero.

    Returns float64 `[B, T]`: sums stay exact enough over long sequences.
    """
    m = mask.bool()
    r = rewards.to(torch.float64)
    out = torch.where(last_model_token(m), r[:, None], torch.zeros((), dtype=r.dtype))
    if kl_coef != 0.0:
        if kl is None:
            raise ValueError("kl_coef is non-zero but no per-token kl was given")
        out = out - kl_coef * _masked(kl.to(torch.float64), m)
    return out


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted return over model tokens, carried through masked tokens: `[B, T] -> [B, T]`.

        G_t = r_t + gamma * G_next(t)       for model tokens t,

    where next(t) is the next MODEL token after t (tool tokens in between are skipped: they do
    not reset G and do not count as a discount step). Masked positions get 0. Same recursion as
    verl `compute_reinforce_plus_plus_outcome_advantage` after PR #7300 and slime's REINFORCE++.

    Vectorized over the batch; for gamma < 1 it scans the T positions right to left (as verl
    does), for gamma == 1 the return is a plain suffix sum. `tirl.algos.reference` has a loop
    version that the tests compare against.
    """
    if token_rewards.shape != mask.shape or mask.dim() != 2:
        raise ValueError(
            f"token_rewards and mask must both be [B, T]; got {tuple(token_rewards.shape)} "
            f"and {tuple(mask.shape)}"
        )
    m = mask.bool()
    r = _masked(token_rewards.to(torch.float64), m)  # [B, T], 0 at tool tokens
    if gamma == 1.0:
        # No discount: G_t = sum of rewards at model tokens s >= t; tool tokens add 0.
        returns = r.flip(-1).cumsum(-1).flip(-1)
    else:
        returns = torch.zeros_like(r)
        running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)  # [B]
        for t in reversed(range(r.shape[1])):
            # At a tool token the running return passes through unchanged.
            running = torch.where(m[:, t], r[:, t] + gamma * running, running)
            returns[:, t] = running
    return _masked(returns, m)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = WHITEN_EPS) -> Tensor:
    """Whiten over all mask-1 tokens of the batch (verl `masked_whiten`; REINFORCE++,
    arXiv:2501.03262):

        A = (x - mean) / sqrt(var + eps)

    with mean and unbiased (N - 1) variance taken over the mask-1 tokens of the whole batch, so
    a tool token changes neither statistic. Masked positions get 0. With one model token the
    variance is taken as 0 (verl divides by N - 1 = 0 there).
    """
    m = mask.bool()
    x = _masked(values.to(torch.float64), m)  # [B, T]
    n = m.sum()
    mean = x.sum() / n.clamp(min=1)
    centered = _masked(x - mean, m)
    var = centered.square().sum() / (n - 1).clamp(min=1)
    return _masked(centered * torch.rsqrt(var + eps), m)
