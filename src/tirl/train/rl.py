"""On-policy RL for code-integrated reasoning, with every CIR and AgentMath strategy a switch.

`RLTrainer` runs the steps and holds the state between them; each part does one job and is
tested alone:

- `tirl.train.feed.RolloutFeed`: samples groups from the engine and scores them, and hands out
  batches by the batch rule (adaptive batches, partial rollouts, the curriculum);
- `tirl.train.learner.Learner`: the update on a batch (advantages, pi_old, the loss over
  micro-batches and ranks of `tirl.train.update`);
- `tirl.train.optim.PolicyOptimizer`: AdamW and its warmup schedule;
- `tirl.train.reference`: the KL term's frozen reference policy;
- `tirl.train.checkpoint`: the file a resumed run continues from, exactly;
- `tirl.train.capabilities.EngineCapabilities`: what the trainer knows of its engine.

One step, after pushing the trained weights into the engine if they changed:
1. Sample `group_size` trajectories for each task the batch still lacks, with the tool budget
   and model-token limit of the budget schedule (CIR §3.1, 2 -> 3 -> 4) or of the current
   expansion stage (AgentMath §3.3) (`RolloutFeed.collect`).
2. Score and reward each trajectory once, as it finishes (`RolloutFeed.score`).
3. Build the batch: exactly `prompts_per_step` usable groups, or none when the sampling
   rounds end short of them; then the step does not update (`train/updated` 0).
4. Token advantages over model tokens only (`Learner.update`).
5. `updates_per_step` optimizer steps; with `rl.one_step_off_policy` in a thread while the
   next step samples, the step's record logged once the update is done.
6. Expansion: if the truncation rate over every trajectory that finished in the step (trained,
   dropped or waiting; failed ones aside: `batch/truncation_rate_sampled`) exceeds
   `expansion_threshold`, move to the next stage, even in a step that does not update. The
   trained batch's rate (`train/truncation_rate`) would lag: truncated groups are mostly all
   wrong, hence uniform, hence dropped by adaptive batches.

A step counts whether or not it updates (the budget schedule, `rl.steps` and the
partial-rollout policy version count steps); `train/updates` counts updates. The trainer's
whole state (model, optimizer, schedule, RNG, step, stage, and the feed's position in the task
stream, curriculum and waiting groups) goes into a checkpoint, and a resumed run continues
exactly where the saved one would have (with partial rollouts, but for the unfinished
trajectories: `tirl.train.feed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tirl.cpu import sharing_cores
from tirl.protocol.segments import Trajectory
from tirl.rollout.limits import budget_at
from tirl.rollout.runner import RolloutSettings
from tirl.train import checkpoint
from tirl.train.capabilities import EngineCapabilities, check_overlap, probe_capabilities
from tirl.train.feed import RolloutFeed
from tirl.train.learner import Learner, old_logprobs_from_sampler
from tirl.train.metrics import MetricsLogger, batch_metrics, peak_rss_gb
from tirl.train.optim import PolicyOptimizer
from tirl.train.reference import reference_policy


@dataclasses.dataclass
class TrainerState:
    step: int = 0  # steps done
    stage: int = 0  # expansion stage (AgentMath), when `rl.stages` is set
    updates: int = 0  # steps that updated the policy (a step short of a full batch does not)


class RLTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        feed: RolloutFeed,
        *,
        settings: RolloutSettings | None,
        pad_id: int,
        logger: MetricsLogger | None = None,
        variant: str = "",
        capabilities: EngineCapabilities | None = None,
    ) -> None:
        """`feed`: what is sampled and how it is rewarded (`RolloutFeed`); its `cfg` and `dist`
        are the trainer's. `settings`: how the phase samples (`tirl.run.build.rl_settings`),
        each step with its own token limit and tool budget; None for a trainer that only
        updates. `capabilities`: the feed's engine's (default: read off it,
        `probe_capabilities`)."""
        self.model = model
        self.feed = feed
        self.cfg = cfg = feed.cfg
        self.dist = dist = feed.dist
        self.rollout = feed.rollout
        self.settings = settings
        self.logger = logger if dist is None or dist.is_main else None
        self.variant = variant
        if capabilities is None:
            capabilities = probe_capabilities(feed.rollout.engine if feed.rollout else None, model)
        self.engine_caps = capabilities
        check_overlap(cfg, dist, capabilities)
        self.optim = PolicyOptimizer(model, cfg)
        from_sampler = old_logprobs_from_sampler(cfg, capabilities, feed.pool is not None)
        self.learner = Learner(
            model, cfg, self.optim, reference_policy(model, cfg),
            pad_id=pad_id, old_from_sampler=from_sampler, dist=dist,
        )  # fmt: skip
        self.state = TrainerState()
        # One step off-policy: the update running in a thread while the next step samples,
        # and the record it completes (logged when it is done).
        self.updating: tuple[asyncio.Task, dict] | None = None
        self.engine_version = 0  # updates included in the weights the engine samples with
        # False once the trained weights differ from the engine's (after an update or a
        # restored checkpoint): the next step pushes them before it samples.
        self.engine_current = True

    # The parts' members that callers read off the trainer.
    optimizer = property(lambda self: self.optim.optimizer)
    task_at = property(lambda self: self.feed.task_at)  # the curriculum's, with it on
    curriculum = property(lambda self: self.feed.curriculum)

    # ------------------------------------------------------------------ the loop
    async def train(self, until: int | None = None, checkpoint_dir: Path | None = None) -> None:
        """Run steps up to `until` (default: all `cfg.steps`), checkpointing every
        `cfg.checkpoint_every` steps and at the end when `checkpoint_dir` is given."""
        until = self.cfg.steps if until is None else min(until, self.cfg.steps)
        bar = tqdm(
            range(self.state.step, until),
            desc=f"{self.variant} RL",
            leave=False,
            disable=self.dist is not None and not self.dist.is_main,
        )
        for _ in bar:
            metrics = await self.step()
            bar.set_postfix(  # a step short of a full batch does not update (no train/ keys)
                acc=f"{metrics.get('train/accuracy', float('nan')):.2f}",
                calls=f"{metrics.get('tools/calls_mean', float('nan')):.2f}",
            )
            every = self.cfg.checkpoint_every
            if checkpoint_dir is not None and every and self.state.step % every == 0:
                await self.finish_update()  # a checkpoint holds whole steps only
                self.save_checkpoint(checkpoint_dir)
        await self.finish_update()
        if checkpoint_dir is not None:
            self.save_checkpoint(checkpoint_dir)

    def limits(self) -> tuple[int, int]:
        """(model tokens, tool budget) now: the expansion stage's, or the budget schedule's."""
        cfg = self.cfg
        if cfg.stages:
            stage = cfg.stages[self.state.stage]
            return stage.max_model_tokens, stage.tool_budget
        budget = budget_at(cfg.budget_schedule, self.state.step / max(1, cfg.steps))
        return cfg.max_model_tokens, budget

    async def step(self) -> dict:
        """One step (module docstring); returns its record. With `rl.one_step_off_policy` the
        step returns once its update has started, in a thread, while the next step samples;
        the record gets the update's keys and is logged when the update is done."""
        start = time.perf_counter()
        cfg = self.cfg
        # With an update still running, the engine keeps the weights it has until it is done.
        stale = not self.engine_current and self.updating is None
        pushed = await self.push_weights() if stale else {}
        max_tokens, budget = self.limits()
        if self.settings is None:
            raise ValueError("this RLTrainer was built without rollout settings: it only updates")
        settings = dataclasses.replace(
            self.settings, max_model_tokens=max_tokens, tool_budget=budget
        )
        batch, batch_stats = await self.feed.collect(settings, self.state.step, self.engine_version)
        rollout_s = time.perf_counter() - start
        await self.finish_update()  # the previous step's, which ran while this one sampled
        metrics: dict = {"variant": self.variant, "phase": "rl", "step": self.state.step}
        metrics.update({"rl/budget": budget, "rl/max_model_tokens": max_tokens})
        metrics.update(batch_stats)
        metrics.update(pushed)  # a restored checkpoint's weights; an update's push replaces it
        if batch:
            if self.engine_caps.sleeps_during_update:  # e.g. vLLM frees its KV cache
                await self.rollout.engine.pause()
            trajs = [t for group in batch for t in group]
            rewards = torch.tensor([t.meta["reward"] for t in trajs], dtype=torch.float)
            metrics.update(batch_metrics(trajs, rewards))
            # which tasks this update learned from, so a study can count its mixture from the log
            metrics["train/tasks"] = [self.task_at(group[0].meta["task"]).id for group in batch]
            order = torch.randperm(len(trajs))  # drawn here: the update may run in a thread
            if cfg.one_step_off_policy:
                update = asyncio.to_thread(self.timed_update, trajs, max_tokens, rewards, order)
                self.updating = (asyncio.ensure_future(update), metrics)
            else:
                metrics.update(self.timed_update(trajs, max_tokens, rewards, order))
                await self.updated(metrics)
        metrics["train/updated"] = int(bool(batch))
        truncation = metrics.get("batch/truncation_rate_sampled", 0.0)
        if cfg.stages and truncation > cfg.expansion_threshold:
            self.state.stage = min(self.state.stage + 1, len(cfg.stages) - 1)
        self.state.step += 1
        metrics["rl/stage"] = self.state.stage
        metrics["time/rollout_s"] = rollout_s
        metrics["time/step_s"] = time.perf_counter() - start
        if self.updating is None or self.updating[1] is not metrics:
            self.log(metrics)
        return metrics

    def timed_update(self, trajs, max_tokens, rewards, order) -> dict:
        start = time.perf_counter()
        with sharing_cores(2 if self.cfg.one_step_off_policy else 1):  # with the sampler
            metrics = self.update(trajs, max_tokens, rewards, order)
        metrics["time/update_s"] = time.perf_counter() - start
        return metrics

    def update(
        self,
        trajs: list[Trajectory],
        max_tokens: int,
        rewards: torch.Tensor | None = None,
        order: torch.Tensor | None = None,
    ) -> dict:
        """Optimizer steps on one batch; `rewards` [B] (default: the feed's `rewards_of`),
        `order` [B] the rows' permutation into minibatches (default: drawn here)."""
        rewards = self.feed.rewards_of(trajs, max_tokens) if rewards is None else rewards
        order = torch.randperm(len(trajs)) if order is None else order
        metrics = self.learner.update(trajs, rewards, order, max_tokens, self.state.updates)
        self.engine_current = False  # until push_weights, which the step awaits next
        return metrics

    async def updated(self, metrics: dict) -> None:
        """After an update: the count, and the new weights into the engine."""
        self.state.updates += 1
        metrics.update(await self.push_weights())

    async def finish_update(self) -> None:
        """Wait for the update running in a thread (one step off-policy), push its weights and
        log the record it completes; nothing when none runs."""
        if self.updating is None:
            return
        task, metrics = self.updating
        try:
            metrics.update(await task)
        finally:
            self.updating = None
        await self.updated(metrics)
        self.log(metrics)

    def log(self, metrics: dict) -> None:
        metrics["train/updates"] = self.state.updates
        metrics["mem/peak_rss_gb"] = peak_rss_gb()
        if self.logger is not None:
            self.logger.log(metrics)

    async def push_weights(self) -> dict:
        """Put the trained policy into an engine that receives weights (`load_weights`,
        `tirl.backends.engine`; under FSDP a collective every rank calls). A push that fails
        raises `WeightPushError` and the run stops: nothing samples stale weights."""
        start = time.perf_counter()
        if self.engine_caps.receives_weights:
            await self.rollout.engine.load_weights(self.model)
        self.engine_current = True
        self.engine_version = self.state.updates
        return {"time/weight_push_s": time.perf_counter() - start}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, directory: Path) -> Path:
        """Write `trainer.pt` (`tirl.train.checkpoint`) into `directory`."""
        feed = self.feed.state_dict()
        state = {**dataclasses.asdict(self.state), "next_task": feed.pop("next_task")}
        sections = {"state": state, **feed, "config": dataclasses.asdict(self.cfg)}
        write = self.dist is None or self.dist.is_main
        return checkpoint.save(directory, self.model, self.optim, sections, write=write)

    def load_checkpoint(self, directory: Path) -> None:
        """Restore everything `save_checkpoint` wrote; the next step is the one after it."""
        payload = checkpoint.restore(directory, self.model, self.optim)
        state = dict(payload["state"])
        where = Path(directory) / checkpoint.FILE
        self.feed.load_state_dict({**payload, "next_task": state.pop("next_task")}, where)
        self.state = TrainerState(**state)
        self.engine_current = False  # the next step pushes the restored weights first
