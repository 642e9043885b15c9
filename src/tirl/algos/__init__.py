"""RL math for tool-integrated reasoning: advantages, returns, policy losses, length shaping.

Advantage estimators and policy losses are registries (`register_advantage`,
`register_policy_loss`): the config names one, and `docs/extending.md` shows how to add one.

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
    POLICY_LOSSES,
    agg_loss,
    entropy_bonus,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    ppo_clip_loss,
    register_policy_loss,
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
    "POLICY_LOSSES",
    "agg_loss",
    "broadcast_to_tokens",
    "discounted_returns",
    "entropy_bonus",
    "entropy_from_logits",
    "get_advantage_estimator",
    "get_policy_loss",
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
    "register_policy_loss",
    "rloo",
    "token_advantages",
]
