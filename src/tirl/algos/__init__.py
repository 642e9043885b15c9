"""RL math for tool-integrated reasoning: advantages, returns, policy losses, length shaping.

Pure functions over `[B]` / `[B, T]` tensors with an explicit loss mask (1 = model-sampled
token; 0 = prompt, tool output, padding). Tool tokens never count: not in a return's discount
steps, not in a loss denominator, not in a length penalty.
"""

from tirl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    broadcast_to_tokens,
    get_advantage_estimator,
    group_mean_baseline,
    grpo,
    register_advantage,
    rloo,
    token_advantages,
)
from tirl.algos.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    agg_loss,
    entropy_bonus,
    entropy_from_logits,
    kl_penalty,
    ppo_clip_loss,
)
from tirl.algos.overlong import model_token_counts, overlong_penalty
from tirl.algos.returns import (
    discounted_returns,
    last_model_token,
    masked_whiten,
    outcome_token_rewards,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "agg_loss",
    "broadcast_to_tokens",
    "discounted_returns",
    "entropy_bonus",
    "entropy_from_logits",
    "get_advantage_estimator",
    "group_mean_baseline",
    "grpo",
    "kl_penalty",
    "last_model_token",
    "masked_whiten",
    "model_token_counts",
    "outcome_token_rewards",
    "overlong_penalty",
    "ppo_clip_loss",
    "register_advantage",
    "rloo",
    "token_advantages",
]
