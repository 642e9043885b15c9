"""On-policy RL for code-integrated reasoning: rollouts with the interpreter, a verifiable
reward, group-relative advantages and the clipped policy loss.

One step: draw `prompts_per_step` training tasks, sample `group_size` trajectories each (the
tool budget taken from the schedule), score them (CIR: +1 correct, -1 otherwise), compute
GRPO advantages within each group, recompute the behaviour policy's log-probabilities, then
take `updates_per_step` optimizer steps over minibatches with the PPO clipped loss
(clip-higher), aggregated over model tokens only. KL and entropy terms are off by default
(CIR §2.3.2) and computed only when their coefficient is non-zero.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from tirl.algos.advantages import broadcast_to_tokens, grpo
from tirl.algos.losses import agg_loss, kl_penalty, ppo_clip_loss
from tirl.envs.arithmetic import Task
from tirl.eval.evaluate import score
from tirl.protocol.segments import Trajectory
from tirl.rewards.reward import make_reward
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.synth.arithmetic import prompt_for
from tirl.train.batch import collate, token_logprobs
from tirl.train.config import RLConfig
from tirl.train.curriculum import budget_at
from tirl.train.metrics import MetricsLogger


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, estimator: str
) -> torch.Tensor:
    """Per-sequence advantages [B]: GRPO, or Dr.GRPO (mean-centred, no std division)."""
    return grpo(rewards, group_ids, normalize_std=estimator == "grpo")


class RLTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        rollout: Rollout,
        tasks: Iterator[Task],
        cfg: RLConfig,
        *,
        pad_id: int,
        use_tools: bool,
        max_output_chars: int = RolloutSettings.max_output_chars,
        logger: MetricsLogger | None = None,
        variant: str = "",
    ) -> None:
        self.model = model
        self.rollout = rollout
        self.tasks = tasks
        self.cfg = cfg
        self.pad_id = pad_id
        self.use_tools = use_tools
        self.max_output_chars = max_output_chars  # as in evaluation: one view of tool output
        self.logger = logger
        self.variant = variant
        params = {}
        if cfg.reward == "composite":
            params = dict(
                alpha=cfg.composite_alpha, beta=cfg.composite_beta, r_max=cfg.composite_max
            )
        self.reward = make_reward(cfg.reward, **params)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        warmup = max(1, cfg.warmup_steps * cfg.updates_per_step)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: min(1.0, (u + 1) / warmup)
        )
        self.reference = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None
        self.device = next(model.parameters()).device

    async def train(self) -> None:
        bar = tqdm(range(self.cfg.steps), desc=f"{self.variant} RL", leave=False)
        for step in bar:
            metrics = await self.step(step)
            bar.set_postfix(
                acc=f"{metrics['train/accuracy']:.2f}",
                calls=f"{metrics.get('tools/calls_mean', 0):.2f}",
            )

    async def sample(self, step: int) -> tuple[list[Trajectory], int]:
        cfg = self.cfg
        budget = budget_at(cfg.budget_schedule, step / max(1, cfg.steps))
        settings = RolloutSettings(
            max_model_tokens=cfg.max_model_tokens,
            tool_budget=budget,
            temperature=cfg.temperature,
            use_tools=self.use_tools,
            max_output_chars=self.max_output_chars,
        )
        tasks = [next(self.tasks) for _ in range(cfg.prompts_per_step)]
        prompts = [prompt_for(t) for t in tasks for _ in range(cfg.group_size)]
        metas = [{"group": g} for g in range(len(tasks)) for _ in range(cfg.group_size)]
        trajs = await self.rollout.run_many(prompts, settings, metas)
        for traj in trajs:
            score(traj, tasks[traj.meta["group"]])
        return trajs, budget

    async def step(self, step: int) -> dict:
        start = time.perf_counter()
        trajs, budget = await self.sample(step)
        rollout_s = time.perf_counter() - start
        cfg = self.cfg
        rewards = torch.tensor([self.reward(bool(t.meta["correct"]), tool_stats(t)) for t in trajs])
        groups = torch.tensor([t.meta["group"] for t in trajs])
        advantages = group_advantages(rewards, groups, cfg.advantage)  # [B]

        batch = collate(trajs, self.pad_id, cfg.mask_tool_output).to(self.device)
        with torch.no_grad():
            old_logprobs, _ = token_logprobs(self.model, batch)  # [B, T-1]
            ref_logprobs = (
                token_logprobs(self.reference, batch)[0] if self.reference is not None else None
            )
        token_adv = broadcast_to_tokens(advantages.to(self.device), batch.loss_mask)  # [B, T-1]

        self.model.train()
        update_metrics: list[dict] = []
        order = torch.randperm(len(trajs))
        for rows in order.chunk(cfg.updates_per_step):
            mb = batch.select(rows)
            logprobs, entropy = token_logprobs(self.model, mb, with_entropy=cfg.entropy_coef > 0)
            loss, m = ppo_clip_loss(
                logprobs,
                old_logprobs[rows],
                token_adv[rows],
                mb.loss_mask,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                agg=cfg.loss_agg,
            )
            if entropy is not None:
                loss = loss - cfg.entropy_coef * agg_loss(entropy, mb.loss_mask, cfg.loss_agg)
            if ref_logprobs is not None:
                kl = kl_penalty(logprobs, ref_logprobs[rows], "k3")
                loss = loss + cfg.kl_coef * agg_loss(kl, mb.loss_mask, cfg.loss_agg)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            m["actor/grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            )
            self.optimizer.step()
            self.schedule.step()
            update_metrics.append(m)
        self.model.eval()

        mask = batch.loss_mask
        logprob_gap = (
            (old_logprobs - batch.sampler_logprobs).abs() * mask
        ).sum() / mask.sum().clamp_min(1)
        metrics = {
            "variant": self.variant,
            "phase": "rl",
            "step": step,
            "rl/budget": budget,
            "train/lr": self.schedule.get_last_lr()[0],
            "train/reward_mean": rewards.mean().item(),
            "train/accuracy": sum(bool(t.meta["correct"]) for t in trajs) / len(trajs),
            "train/truncation_rate": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
            "train/uniform_group_share": _share_of_uniform_groups(rewards, groups),
            "rollout/logprob_gap": logprob_gap.item(),
            **{
                k: sum(m[k] for m in update_metrics) / len(update_metrics)
                for k in update_metrics[0]
            },
            **aggregate_tool_stats([tool_stats(t) for t in trajs]),
            "time/rollout_s": rollout_s,
            "time/step_s": time.perf_counter() - start,
        }
        if self.logger is not None:
            self.logger.log(metrics)
        return metrics


def _share_of_uniform_groups(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose rewards are all equal (they carry no GRPO signal)."""
    ids = groups.unique()
    uniform = sum(bool((rewards[groups == g] == rewards[groups == g][0]).all()) for g in ids)
    return uniform / len(ids)
