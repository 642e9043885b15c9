"""Policy losses, loss aggregation, KL estimators and entropy: pure functions over `[B, T]` tensors.

Every function takes an explicit `mask: [B, T]` (1 = token the model sampled, 0 = prompt, tool
output or padding). A masked position contributes exactly 0 to the loss and 0 to the gradient,
even when its inputs are inf or nan: values are selected with `torch.where` *before* any
arithmetic, because `0 * nan` is nan and a multiplied-out position would still poison the
backward pass (DESIGN.md invariant 2). Every token count (the token-mean denominator) counts
mask-1 tokens only.

Formulas follow verl `trainer/ppo/core_algos.py` (see research/rl-frameworks.md section 12).
Not covered here: dual-clip, decoupled (AReaL) and DPPO-style objectives, value losses.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")

# log-ratio clamp before exp, as in verl: keeps exp() finite; gradient is 0 outside the range.
_LOG_RATIO_CLAMP = 20.0
# k3 values are clamped to this range, as verl's low_var_kl does, so one outlier token cannot
# dominate the KL loss.
_K3_CLAMP = 10.0


def _check_bt(name: str, x: Tensor, like: Tensor) -> None:
    if x.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(like.shape)}")


def _masked(x: Tensor, m: Tensor) -> Tensor:
    """`x` where `m` is True, exactly 0 elsewhere (also when x is inf/nan there)."""
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Aggregate a per-token loss `[B, T]` into a scalar over mask-1 tokens.

    Modes (m = mask, l = loss_mat; verl `loss_agg_mode`):

    - `"token-mean"`: sum_{i,t} m*l / sum_{i,t} m — every model token in the batch weighs the
      same (DAPO; verl, SkyRL, TRL default).
    - `"seq-mean-token-mean"`: mean_i ( sum_t m*l / sum_t m ) — each sequence weighs the same,
      whatever its length (original GRPO).
    - `"seq-mean-token-sum"`: mean_i sum_t m*l.

    The seq-mean modes average over sequences that have at least one mask-1 token. With no
    mask-1 token at all the result is 0 (and its gradient is 0), not nan.
    """
    _check_bt("mask", mask, loss_mat)
    m = mask.bool()
    lm = _masked(loss_mat, m)  # [B, T]
    if mode == "token-mean":
        return lm.sum() / m.sum().clamp(min=1)
    tok_per_seq = m.sum(dim=-1)  # [B]
    seq_sum = lm.sum(dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        seq_loss = seq_sum / tok_per_seq.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        seq_loss = seq_sum
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")
    n_seq = (tok_per_seq > 0).sum().clamp(min=1)
    return seq_loss.sum() / n_seq


def _masked_mean_value(x: Tensor, m: Tensor) -> float:
    return float((_masked(x, m).sum() / m.sum().clamp(min=1)).item())


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (PPO, Schulman et al. 2017; clip-higher, DAPO,
    Yu et al. 2025).

    All inputs are `[B, T]`. With r = exp(logprobs - old_logprobs) per token:

        l_t = max(-A_t * r_t, -A_t * clip(r_t, 1 - clip_low, 1 + clip_high))

    then `agg_loss(l, mask, agg)`. DAPO's defaults are clip_low=0.2, clip_high=0.28: a
    positive-advantage token may raise its probability further before the gradient stops.
    The log-ratio is clamped to [-20, 20] before exp, as in verl.

    Masked positions (prompt, tool output, padding) give exactly 0 loss and 0 gradient even if
    their logprobs or advantages are inf/nan.

    Returns:
        (loss, metrics) with metrics over mask-1 tokens:
        `actor/clip_frac` (share of tokens where the clipped term is the active, larger one),
        `actor/ratio_mean`, `actor/approx_kl` (k3: mean of (r - 1) - log r), `actor/pg_loss`.
    """
    for name, x in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        _check_bt(name, x, logprobs)
    m = mask.bool()
    # Select before computing: gradients through where() to unselected inputs are exactly 0,
    # and the arithmetic below never sees a nan/inf from a masked position.
    lp = _masked(logprobs, m)
    old = _masked(old_logprobs, m)
    adv = _masked(advantages, m)

    log_ratio = (lp - old).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    pg_unclipped = -adv * ratio  # [B, T]
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    pg_losses = torch.maximum(pg_unclipped, pg_clipped)  # [B, T]
    loss = agg_loss(pg_losses, m, agg)

    with torch.no_grad():
        clipped = (pg_clipped > pg_unclipped).to(ratio.dtype)
        k3 = (ratio - 1.0) - log_ratio
        metrics = {
            "actor/clip_frac": _masked_mean_value(clipped, m),
            "actor/ratio_mean": _masked_mean_value(ratio, m),
            "actor/approx_kl": _masked_mean_value(k3, m),
            "actor/pg_loss": float(loss.detach().item()),
        }
    return loss, metrics


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: Literal["k1", "k2", "k3"]) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled-token log-probs (Schulman, "Approximating
    KL divergence", 2020). Inputs and output `[B, T]`; not masked — aggregate with `agg_loss`.

    With d = logprobs - ref_logprobs:

    - k1 = d                          (unbiased, high variance, can be negative)
    - k2 = d**2 / 2                   (biased, low variance)
    - k3 = exp(-d) - (-d) - 1         (unbiased, low variance, >= 0; verl `low_var_kl`),
      clamped to [-10, 10] as in verl.
    """
    _check_bt("ref_logprobs", ref_logprobs, logprobs)
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return (torch.exp(-d) + d - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)
    raise ValueError(f"unknown KL estimator {kind!r}; valid: k1, k2, k3")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution: `logits [B, T, V] -> [B, T]`.

        H = -sum_v p_v log p_v,  p = softmax(logits)

    Vocabulary entries with logit -inf (p = 0) contribute 0 and give a finite gradient.
    Not masked: aggregate with `agg_loss(H, mask, ...)`.
    """
    logp = torch.log_softmax(logits, dim=-1)  # [B, T, V]
    p = logp.exp()
    # p == 0 only where logp is -inf (or underflows); 0 * -inf would be nan, so zero logp there.
    logp = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -(p * logp).sum(dim=-1)
