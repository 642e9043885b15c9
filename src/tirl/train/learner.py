"""The RL update on one scored batch: `updates_per_step` optimizer steps of the policy.

The batch's rows are collated token for token (`tirl.train.batch`), given token advantages by
the configured estimator over model tokens only (GRPO, Dr.GRPO, REINFORCE++ with the return
carried through tool tokens, REINFORCE++-baseline, RLOO: `tirl.algos`), then cut into
`updates_per_step` minibatches in a drawn order, each one optimizer step of the configured
policy loss (PPO-clip with clip-higher and optional dual clip by default), with KL and entropy
terms only when their coefficients are non-zero (CIR §2.3.2 turns both off). The loss over
micro-batches and ranks is `tirl.train.update`'s, the optimizer `tirl.train.optim`'s, the
KL's reference `tirl.train.reference`'s.

pi_old is the sampler's log-probabilities where they are the trainer's own
(`old_logprobs_from_sampler`), else one scoring pass with the weights before the update, which
also measures the sampler's mismatch (`mismatch/`) and, with `rl.tis_cap`, weighs each token's
advantage by its truncated importance ratio (`tirl.algos.mismatch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tirl.algos.mismatch import mismatch_metrics, truncated_is_weights
from tirl.cpu import pace
from tirl.protocol.segments import Trajectory
from tirl.run.config import RLConfig
from tirl.train.batch import TokenBatch, collate
from tirl.train.capabilities import EngineCapabilities
from tirl.train.distributed import DistContext, sum_over_ranks
from tirl.train.optim import PolicyOptimizer
from tirl.train.reference import reference_logprobs
from tirl.train.update import (
    Shard,
    batch_advantages,
    batch_logprobs,
    minibatch_loss_backward,
    update_autocast,
)


def old_logprobs_from_sampler(cfg: RLConfig, engine: EngineCapabilities, partial: bool) -> bool:
    """Whether the update takes the sampler's log-probabilities as pi_old (`rl.old_logprobs`).
    `auto` does where the sampler computes the trainer's own numbers for the weights that
    sampled: an engine whose `logprobs_match_trainer` (tirl's HF engine: the trainer's model
    or a copy of it, in its dtype, untempered log-probs), without partial rollouts (several
    policy versions in one trajectory), TIS (which corrects against the trainer's pass) or a
    bf16 update (the engine samples in the weights' dtype).

    Off-policy (`rl.off_policy_steps` k >= 1) the batch was sampled by a behaviour policy
    pi_behav up to k versions old. Without `rl.tis_cap`, pi_old is pi_behav (the sampler's
    numbers): PPO's clipped ratio pi_theta / pi_behav is the importance weight, as verl's
    one-step-off and prime-rl's async trainer use it. With `rl.tis_cap` the trainer
    recomputes, and the update is AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL: A
    Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning",
    arXiv:2505.24298, "Decoupled PPO Objective"), per model token t:

        J(theta) = E_{a_t ~ pi_behav}[ min(pi_prox(a_t) / pi_behav(a_t), tis_cap)
                   * min(u_t A_t, clip(u_t, 1 - eps_low, 1 + eps_high) A_t) ],
        u_t = pi_theta(a_t) / pi_prox(a_t)

    where pi_prox, the proximal policy, is the trainer's weights before this update (this
    scoring pass: the trust region is around the newest weights, not the stale sampler's),
    and the behaviour weight is truncated (`tirl.algos.mismatch.truncated_is_weights`).
    Recomputing without the behaviour weight (`old_logprobs: trainer`, no cap) would train
    a stale batch as if pi_prox had sampled it: measured worse as k grows
    (docs/benchmarks/history.md, "Async RL with a staleness bound")."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "sampler"
    agree = engine.logprobs_match_trainer
    return agree and not partial and cfg.tis_cap is None and not cfg.bf16


def uniform_groups(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """[G] bool over `groups.unique()`: True where every reward of the group is equal."""
    return torch.stack(
        [(rewards[groups == g] == rewards[groups == g][0]).all() for g in groups.unique()]
    )


def staleness_metrics(trajs: Sequence[Trajectory], updates: int) -> dict[str, float]:
    """How many updates the weights being trained are ahead of those that sampled the batch
    (`meta["policy_version"]`: the engine's update count when the trajectory finished)."""
    lags = [updates - t.meta.get("policy_version", updates) for t in trajs]
    return {"rl/staleness_mean": sum(lags) / len(lags), "rl/staleness_max": float(max(lags))}


class Learner:
    """Updates `model` on scored batches with `optim`, against `reference` for the KL term
    (None: no term); `old_from_sampler` says where pi_old comes from
    (`old_logprobs_from_sampler`). Under torch.distributed every rank calls `update` on the
    whole batch and backpropagates its shard of each minibatch (`tirl.train.update`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: RLConfig,
        optim: PolicyOptimizer,
        reference: torch.nn.Module | None,
        *,
        pad_id: int,
        old_from_sampler: bool,
        dist: DistContext | None = None,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.optim = optim
        self.reference = reference
        self.pad_id = pad_id
        self.old_from_sampler = old_from_sampler
        self.dist = dist
        self.shard = dist.shard if dist is not None else Shard()
        self.device = next(model.parameters()).device

    def update(
        self,
        trajs: list[Trajectory],
        rewards: torch.Tensor,
        order: torch.Tensor,
        max_tokens: int,
        updates: int,
    ) -> dict:
        """Optimizer steps on one batch: `rewards` [B], `order` [B] the rows' permutation into
        minibatches, `max_tokens` the model-token limit it was sampled under (Dr.GRPO's
        constant divisor), `updates` the updates made before it (for the staleness)."""
        cfg = self.cfg
        groups = torch.tensor([t.meta["task"] for t in trajs])
        batch = collate(trajs, self.pad_id, cfg.mask_tool_output).to(self.device)
        token_adv = batch_advantages(cfg, rewards, groups, batch.loss_mask.cpu()).to(
            self.device
        )  # [B, T-1]
        mismatch = staleness_metrics(trajs, updates)
        old_logprobs, token_adv, checks = self.old_logprobs(batch, token_adv)
        mismatch |= checks
        ref_logprobs = reference_logprobs(self.reference, batch, cfg, self.device)

        self.model.train()
        per_update: list[dict] = []
        for rows in order.chunk(cfg.updates_per_step):
            pace()  # torch's threads follow the free cores (tirl.cpu)
            self.optim.zero_grad()
            m = minibatch_loss_backward(
                self.model, batch, rows.to(self.device), old_logprobs, token_adv,
                ref_logprobs, cfg, self.shard, norm_len=max_tokens,
            )  # fmt: skip
            m = sum_over_ranks(m, self.dist)
            m["actor/grad_norm"] = self.optim.step()
            per_update.append(m)
        self.model.eval()

        groups_uniform = uniform_groups(rewards, groups)
        return {
            "train/lr": self.optim.lr,
            "train/groups": len(groups_uniform),
            "train/uniform_group_share": float(groups_uniform.float().mean()),
            **mismatch,
            **{k: sum(m[k] for m in per_update) / len(per_update) for k in per_update[0]},
        }

    def old_logprobs(
        self, batch: TokenBatch, token_adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """pi_old [B, T-1], the advantages [B, T-1] (TIS-weighted with `rl.tis_cap`) and the
        sampler's mismatch metrics (none when the sampler's numbers are taken as they are)."""
        cfg = self.cfg
        if self.old_from_sampler:  # no pass: the sampler's numbers are pi_old
            return batch.sampler_logprobs * batch.sampled, token_adv, {}
        # Every rank scores the whole batch here, so the numbers match one process exactly;
        # the backward passes of the update are what is sharded.
        with update_autocast(cfg, self.model, self.device):  # as the update's forward
            old = batch_logprobs(self.model, batch, cfg.micro_batch_size, cfg.micro_batch_tokens)
        metrics = mismatch_metrics(old, batch.sampler_logprobs, batch.sampled)
        if cfg.tis_cap is not None:  # [B, T-1] weights on the token losses (algos.mismatch)
            tis = truncated_is_weights(old, batch.sampler_logprobs, batch.sampled, cfg.tis_cap)
            token_adv = token_adv * torch.where(batch.sampled.bool(), tis, 1.0)
            metrics["mismatch/tis_weight_mean"] = float(
                (tis * batch.sampled).sum() / batch.sampled.sum().clamp_min(1)
            )
        return old, token_adv, metrics
