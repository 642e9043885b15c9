"""tirl's advantage estimators that verl 0.9.1 lacks, registered in verl's estimator registry.

`register_estimators()` (idempotent; not run at import) registers, with verl's
`register_adv_est` (`verl.trainer.ppo.core_algos`):

| verl name                           | tirl estimator           | why verl's own is not used |
|-------------------------------------|--------------------------|----------------------------|
| `tirl_reinforce_plus_plus`          | `reinforce++`            | the outcome reward sits on the last MODEL token |
| `tirl_reinforce_plus_plus_baseline` | `reinforce++-baseline`   | the return is discounted by gamma |

Each is a thin wrapper: it reads verl's batch (`token_level_rewards [B, T]`, `response_mask
[B, T]`, the group uids `index [B]`, `config.gamma`) and calls tirl's own pure functions
(`tirl.algos.advantages.token_advantages`, `tirl.algos.returns`); nothing is re-implemented.

Where verl's own and tirl's differ (parity tests in tests/verl/test_verl_estimators.py):

- REINFORCE++: verl's agent loop puts `reward_score` on the last response token
  (`experimental/agent_loop/agent_loop.py`: `rm_scores[-1]` of an output, and
  `AgentLoopWorker._postprocess`: the last attention-mask position), which is an interpreter
  token when a trajectory ends in tool output (cut at the length limit or the budget). verl's
  `compute_reinforce_plus_plus_outcome_advantage` carries returns through mask-0 tokens
  (verl PR #7300) but reads the reward only at mask-1 ones, so that reward is lost and the
  row's returns are all 0. tirl places the outcome on the last model token
  (`tirl.algos.returns.outcome_token_rewards`). When the last response token is a model
  token both give the same advantages and returns.
- REINFORCE++-baseline: verl's ignores `algorithm.gamma`; tirl's discounts the centred reward
  over model tokens. At gamma = 1 they agree, and `tirl verl config` then picks verl's.
- GRPO / RLOO (verl's are used): a group of one sequence gets advantage 0 in tirl; verl uses
  mean 0 (and std 1), passing the raw reward through. tirl's groups always have group_size
  >= 2 members, so this shows only if verl hands over a partial group.

Both wrappers take outcome rewards only: with `algorithm.use_kl_in_reward` the per-token KL
shaping would be folded away by the sum, so they refuse it (tirl puts the KL in the loss).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tirl.algos.advantages import group_mean_baseline, token_advantages
from tirl.algos.returns import discounted_returns, outcome_token_rewards

# tirl estimator -> the verl name its wrapper is registered under (read by the config
# translation, which must not import verl).
TIRL_ESTIMATOR_NAMES: dict[str, str] = {
    "reinforce++": "tirl_reinforce_plus_plus",
    "reinforce++-baseline": "tirl_reinforce_plus_plus_baseline",
}


def _gamma(config: Any) -> float:
    if config is None:
        raise ValueError("the tirl estimators need verl's algorithm config (for gamma)")
    if getattr(config, "use_kl_in_reward", False) or (
        hasattr(config, "get") and config.get("use_kl_in_reward", False)
    ):
        raise ValueError(
            "the tirl estimators take outcome rewards only: set algorithm.use_kl_in_reward=false"
            " and put the KL into the loss (actor.use_kl_loss), as tirl does"
        )
    return float(config.gamma if hasattr(config, "gamma") else config["gamma"])


def group_ids_of(index: Any, device: torch.device) -> Tensor:
    """verl's per-sequence group uids (`non_tensor_batch["uid"]`, any hashable values) as
    `[B]` int64 group ids 0..G-1."""
    inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)[1]
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)


def _outcome(token_level_rewards: Tensor) -> Tensor:
    """`[B, T] -> [B]`: the outcome reward of each sequence, wherever verl placed it."""
    return token_level_rewards.sum(dim=-1)


def _returns(rewards: Tensor, mask: Tensor, gamma: float, like: Tensor) -> Tensor:
    """tirl's REINFORCE++ returns `[B, T]` (for verl's `returns` metrics), in `like`'s dtype."""
    token_rewards = outcome_token_rewards(rewards, mask)  # [B, T], R on the last model token
    return discounted_returns(token_rewards, mask, gamma).to(like.dtype)


def tirl_reinforce_plus_plus(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any = None,
    index: Any = None,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """tirl's `reinforce++` on verl's batch: `(advantages [B, T], returns [B, T])`.

    The outcome R of each row (the sum of its `token_level_rewards`, wherever verl put it)
    goes on the row's last model token, the return runs over model tokens (tool tokens carry
    it, uncounted by gamma) and is whitened over the batch's model tokens. `index` is unused
    (the baseline is the batch whitening)."""
    del index
    gamma = _gamma(config)
    rewards = _outcome(token_level_rewards)  # [B]
    groups = torch.zeros(rewards.shape[0], dtype=torch.long, device=rewards.device)
    with torch.no_grad():
        adv = token_advantages("reinforce++", rewards, groups, response_mask, gamma=gamma)
        returns = _returns(rewards, response_mask, gamma, token_level_rewards)
    return adv.to(token_level_rewards.dtype), returns


def tirl_reinforce_plus_plus_baseline(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    config: Any = None,
    index: Any = None,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """tirl's `reinforce++-baseline` on verl's batch: `(advantages [B, T], returns [B, T])`;
    R minus its group's mean, discounted over model tokens, whitened over the batch. The
    returns are those of the centred reward."""
    if index is None:
        raise ValueError("tirl_reinforce_plus_plus_baseline needs the group uids (index)")
    gamma = _gamma(config)
    rewards = _outcome(token_level_rewards)  # [B]
    groups = group_ids_of(index, rewards.device)  # [B]
    with torch.no_grad():
        adv = token_advantages("reinforce++-baseline", rewards, groups, response_mask, gamma=gamma)
        centred = group_mean_baseline(rewards, groups)  # [B]
        returns = _returns(centred, response_mask, gamma, token_level_rewards)
    return adv.to(token_level_rewards.dtype), returns


VERL_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    TIRL_ESTIMATOR_NAMES["reinforce++"]: tirl_reinforce_plus_plus,
    TIRL_ESTIMATOR_NAMES["reinforce++-baseline"]: tirl_reinforce_plus_plus_baseline,
}


def register_estimators() -> dict[str, Callable[..., tuple[Tensor, Tensor]]]:
    """Register the tirl_* estimators with verl's `register_adv_est`; calling it again is a
    no-op (verl accepts re-registering the same function). Run it in every process that
    computes advantages (verl's trainer process): importing `tirl.integrations.verl.agent_loop`,
    which verl does through `actor_rollout_ref.model.external_lib`, calls it.
    Returns the registered name -> function."""
    from tirl.integrations.verl import require_verl

    require_verl()
    from verl.trainer.ppo.core_algos import register_adv_est

    for name, fn in VERL_ESTIMATORS.items():
        register_adv_est(name)(fn)
    return dict(VERL_ESTIMATORS)
