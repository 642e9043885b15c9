"""Policy losses, loss aggregation, KL estimators and entropy: pure functions over `[B, T]` tensors.

Every function takes an explicit `mask: [B, T]` (1 = token the model sampled, 0 = prompt, tool
output or padding). A masked position contributes exactly 0 to the loss and 0 to the gradient,
even when its inputs are inf or nan: values are selected with `torch.where` *before* any
arithmetic, because `0 * nan` is nan and a multiplied-out position would still poison the
backward pass (architecture.md invariant 2). Every token count (the token-mean denominator) counts
mask-1 tokens only.

Policy losses are registered by name (`@register_policy_loss("ppo_clip")`), as verl's
`register_policy_loss` does, so the trainer picks one from `rl.policy_loss`. A policy loss is
called as

    loss_fn(logprobs, old_logprobs, advantages, mask, agg=..., norm_len=..., **params)

with `[B, T]` tensors and returns `(loss, metrics)`; `params` are its own keyword
hyper-parameters (`rl.clip_low`, `rl.clip_high`, `rl.clip_ratio_c` for the losses that take
parameters of those names, plus `rl.policy_loss_params`). A loss that is 0 wherever the
advantage is 0 carries `zero_at_zero_advantage = True`, so that the update may skip rows
without an advantage (`tirl.train.update`).

Formulas follow verl `trainer/ppo/core_algos.py` (see research/rl-frameworks.md section 12).
Not covered here: decoupled (AReaL), GSPO/CISPO/DPPO-style objectives, value losses, the
straight-through `k3+` KL gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from tirl.registry import Registry

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# log-ratio clamp before exp, as in verl: keeps exp() finite; gradient is 0 outside the range.
_LOG_RATIO_CLAMP = 20.0
# k3 values are clamped to this range, as verl's low_var_kl does, so one outlier token cannot
# dominate the KL loss.
_K3_CLAMP = 10.0


# (logprobs, old_logprobs, advantages, mask [B, T], *, agg, norm_len, **params) -> (loss, metrics)
PolicyLossFn = Callable[..., tuple[Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", entry_type=Callable)

# The arguments every policy loss receives from the trainer; any other keyword is a parameter.
POLICY_LOSS_ARGS = ("logprobs", "old_logprobs", "advantages", "mask", "agg", "norm_len")

# Decorator: register a policy loss under a name (see the module doc for its call).
register_policy_loss = POLICY_LOSSES.register


def get_policy_loss(name: str) -> PolicyLossFn:
    """Look up a policy loss by name; KeyError listing the registered names."""
    return POLICY_LOSSES.get_entry(name)


def _check_bt(name: str, x: Tensor, like: Tensor) -> None:
    if x.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(like.shape)}")


def _masked(x: Tensor, m: Tensor) -> Tensor:
    """`x` where `m` is True, exactly 0 elsewhere (also when x is inf/nan there)."""
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, *, norm_len: int | None = None) -> Tensor:
    """Aggregate a per-token loss `[B, T]` into a scalar over mask-1 tokens (verl `agg_loss`).

    Modes (m = mask, l = loss_mat, N = number of sequences with at least one mask-1 token):

    - `"token-mean"`: sum_{i,t} m*l / sum_{i,t} m — every model token in the batch weighs the
      same (DAPO, Yu et al. 2025, section 3.3; verl, SkyRL, TRL default).
    - `"seq-mean-token-mean"`: (1/N) sum_i ( sum_t m*l / sum_t m ) — each sequence weighs the
      same, whatever its length (original GRPO, Shao et al. 2024, section 4.1, eq. 3).
    - `"seq-mean-token-sum"`: (1/N) sum_i sum_t m*l.
    - `"seq-mean-token-sum-norm"`: (1/N) sum_i ( sum_t m*l / norm_len ) — Dr.GRPO (Liu et al.
      2025, section 3.1): a constant normaliser, so a sequence's weight does not depend on its
      own length. `norm_len` defaults to T, the mask's width (verl's default); pass the
      model-token budget instead so that the constant depends neither on padding nor on tool
      spans. verl's version sums over sequences instead of averaging (a factor B larger).

    A mask-0 token (prompt, tool output, padding) changes no sum and no denominator. With no
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
    elif mode == "seq-mean-token-sum-norm":
        norm = loss_mat.shape[-1] if norm_len is None else norm_len
        if norm <= 0:
            raise ValueError(f"norm_len must be positive; got {norm}")
        seq_loss = seq_sum / norm
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}")
    n_seq = (tok_per_seq > 0).sum().clamp(min=1)
    return seq_loss.sum() / n_seq


def _masked_mean_value(x: Tensor, m: Tensor) -> float:
    return float((_masked(x, m).sum() / m.sum().clamp(min=1)).item())


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    *,
    clip_ratio_c: float | None = None,
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (PPO, Schulman et al. 2017, eq. 7; clip-higher,
    DAPO, Yu et al. 2025, section 3.1) and optional dual clip (Ye et al. 2020, "Mastering
    Complex Control in MOBA Games with Deep RL"; verl `compute_policy_loss_vanilla`).

    All inputs are `[B, T]`. With r = exp(logprobs - old_logprobs) per token:

        l_t = max(-A_t * r_t, -A_t * clip(r_t, 1 - clip_low, 1 + clip_high))
        l_t = min(l_t, -A_t * c)        only where A_t < 0, when clip_ratio_c = c is given

    then `agg_loss(l, mask, agg, norm_len=norm_len)`. DAPO's defaults are clip_low=0.2,
    clip_high=0.28: a positive-advantage token may raise its probability further before the
    gradient stops. Dual clip bounds the loss of a negative-advantage token whose ratio has
    grown huge (r > c) at -A*c, with zero gradient; verl's default is c = 3, the DAPO and ReTool
    recipes use 10. c must be > 1. The log-ratio is clamped to [-20, 20] before exp, as in verl.

    Masked positions (prompt, tool output, padding) give exactly 0 loss and 0 gradient even if
    their logprobs or advantages are inf/nan.

    Returns:
        (loss, metrics) with metrics over mask-1 tokens:
        `actor/clip_frac` (share of tokens where the clipped term is the active, larger one),
        `actor/dual_clip_frac` (share of tokens where the dual-clip bound is active; 0 when
        off), `actor/ratio_mean`, `actor/approx_kl` (k3: mean of (r - 1) - log r),
        `actor/pg_loss`.
    """
    for name, x in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        _check_bt(name, x, logprobs)
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1; got {clip_ratio_c}")
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
    dual_clipped = torch.zeros_like(m)  # [B, T] bool
    if clip_ratio_c is not None:
        pg_bound = -adv * clip_ratio_c  # [B, T]
        dual_clipped = (adv < 0) & (pg_losses > pg_bound)
        pg_losses = torch.where(dual_clipped, pg_bound, pg_losses)
    loss = agg_loss(pg_losses, m, agg, norm_len=norm_len)

    with torch.no_grad():
        clipped = (pg_clipped > pg_unclipped).to(ratio.dtype)
        k3 = (ratio - 1.0) - log_ratio
        metrics = {
            "actor/clip_frac": _masked_mean_value(clipped, m),
            "actor/dual_clip_frac": _masked_mean_value(dual_clipped.to(ratio.dtype), m),
            "actor/ratio_mean": _masked_mean_value(ratio, m),
            "actor/approx_kl": _masked_mean_value(k3, m),
            "actor/pg_loss": float(loss.detach().item()),
        }
    return loss, metrics


# -A r and -A clip(r) are 0 where A is 0: a row with no advantage adds nothing to the loss or
# its gradient, so the update may skip its passes (tirl.train.update, rl.skip_zero_advantage).
ppo_clip_loss.zero_at_zero_advantage = True


def _k1(d: Tensor) -> Tensor:
    return d


def _k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


def _k3(d: Tensor) -> Tensor:
    return (torch.exp(-d) + d - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)


# name -> estimate of KL(pi || pi_ref) at a sampled token from d = log pi - log pi_ref
KL_ESTIMATORS: dict[str, Callable[[Tensor], Tensor]] = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: Literal["k1", "k2", "k3"]) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled-token log-probs (Schulman, "Approximating
    KL divergence", 2020; verl `kl_penalty`). Inputs and output `[B, T]`; not masked — aggregate
    with `agg_loss`.

    With d = logprobs - ref_logprobs:

    - k1 = d                          (unbiased, high variance, can be negative)
    - k2 = d**2 / 2                   (biased, low variance)
    - k3 = exp(-d) - (-d) - 1         (unbiased, low variance, >= 0; verl `low_var_kl`),
      clamped to [-10, 10] as in verl.
    """
    _check_bt("ref_logprobs", ref_logprobs, logprobs)
    try:
        estimator = KL_ESTIMATORS[kind]
    except KeyError:
        valid = ", ".join(KL_ESTIMATORS)
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {valid}") from None
    return estimator(logprobs - ref_logprobs)


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


def entropy_bonus(
    entropy: Tensor, mask: Tensor, agg: str = "token-mean", *, norm_len: int | None = None
) -> Tensor:
    """Aggregated policy entropy over model tokens: `entropy [B, T] -> scalar`.

    The trainer subtracts it: `loss = pg_loss - entropy_coef * entropy_bonus(H, mask, agg)`
    (verl `entropy_coeff`, default 0; research/rl-frameworks.md section 12). Off by default:
    the CIR paper (section 2.3.2) drops the entropy bonus for tool-integrated RL because raising
    the policy's randomness amplifies the noise of tool feedback. Tool tokens (mask 0) are not
    the model's choices and are left out like in every other aggregate.
    """
    return agg_loss(entropy, mask, agg, norm_len=norm_len)
