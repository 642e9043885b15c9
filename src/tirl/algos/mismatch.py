"""The gap between the sampler's and the trainer's log-probabilities, and its correction.

Once the engine that samples differs from the model that trains (vLLM's kernels against
PyTorch's, bf16 sampling against an fp32 trainer), the tokens were drawn from pi_sampler, not
from the pi_old the trainer recomputes, and the policy gradient is off-policy by their ratio.
Both tensors here are [B, T] log-probabilities of the same sampled tokens; `mask` [B, T] is 1
on the tokens the sampler drew (model tokens; prompt, tool and padding positions are 0).

`mismatch_metrics` measures the gap per step: mean and max |log pi_old - log pi_sampler|, and
the k3 estimate of KL(pi_sampler || pi_old) from the sampled tokens (Schulman's k3: with
r = pi_old / pi_sampler, k3 = (r - 1) - log r >= 0, unbiased for the KL under the sampler).

`truncated_is_weights` is truncated importance sampling (TIS; Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training"; verl's
`rollout_is_threshold` with token-level truncation, TRL's `vllm_importance_sampling_cap`):

    w_t = min(pi_old(a_t) / pi_sampler(a_t), C)        (detached; 0 where mask is 0)

and the token's policy-gradient loss is multiplied by w_t. The trainer applies it by scaling
each token's advantage by w_t before the policy loss, which is the same thing for every loss
that is positively homogeneous in the advantage (PPO's clipped surrogate with or without dual
clip, vanilla policy gradient): w > 0 factors out of their min/max.
"""

from __future__ import annotations

import torch
from torch import Tensor


def mismatch_metrics(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict:
    """{"mismatch/abs_diff_mean", "mismatch/abs_diff_max", "mismatch/kl_k3"} over the masked
    tokens (all 0.0 when there are none). Inputs [B, T]."""
    mask = mask.bool()
    if not mask.any():
        return {"mismatch/abs_diff_mean": 0.0, "mismatch/abs_diff_max": 0.0, "mismatch/kl_k3": 0.0}
    diff = (trainer_logprobs - sampler_logprobs).detach().float()[mask]  # [N]
    k3 = torch.expm1(diff) - diff  # (r - 1) - log r with log r = diff
    return {
        "mismatch/abs_diff_mean": float(diff.abs().mean()),
        "mismatch/abs_diff_max": float(diff.abs().max()),
        "mismatch/kl_k3": float(k3.mean()),
    }


def truncated_is_weights(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """[B, T] TIS weights min(exp(log pi_old - log pi_sampler), cap), detached, 0 off `mask`."""
    if not cap > 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    log_ratio = (trainer_logprobs - sampler_logprobs).detach().float()
    # Clamped before exp so a token the sampler thought nearly impossible cannot overflow.
    weights = torch.exp(log_ratio.clamp(max=20.0)).clamp(max=cap)
    return weights * mask.float()
