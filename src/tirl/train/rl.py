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
5. `updates_per_step` optimizer steps; with a staleness bound k >= 1 (`rl.off_policy_steps`)
   in a worker thread while the next steps sample, the step's record logged once its update
   is done (below).
6. Expansion: if the truncation rate over every trajectory that finished in the step (trained,
   dropped or waiting; failed ones aside: `batch/truncation_rate_sampled`) exceeds
   `expansion_threshold`, move to the next stage, even in a step that does not update. The
   trained batch's rate (`train/truncation_rate`) would lag: truncated groups are mostly all
   wrong, hence uniform, hence dropped by adaptive batches.

Async RL with a staleness bound k (`rl.off_policy_steps`; `rl.one_step_off_policy` is k = 1):
a batch is trained at most k policy versions after the version that sampled it (AReaL's
`max_head_offpolicyness`: Fu et al. 2025, arXiv:2505.24298, §5.1 "Staleness-Aware Training";
prime-rl's `async_level`, under which "the model used for generating rollouts at step n is
from ckpt[n - async_level]"; verl's fully async recipe bounds stale samples instead, as a share
of a batch, `staleness_threshold`). Updates run one after another, in batch order, in one
worker thread. After sampling, a step finishes the oldest updates until fewer than k are
pending, pushes the last finished one's weights into the engine and queues its own update: so
the next step samples while up to k updates are pending, and the engine's weights change only
between samplings, never mid-generation. The schedule is prime-rl's, not AReaL's: the engine
takes exactly the updates the bound requires, never a fresher one that happens to have
finished, so which weights sample which step does not hang on timing and a run is
reproducible at its seed. With k >= 2 an update may be running during a push, so the worker
copies the weights after each update and the engine loads that copy, never a half-updated
model (memory: up to k copies of the weights). Each batch's lag is `rl/staleness_mean` /
`_max` (the trajectories' `policy_version`, the engine's update count when they were sampled);
pi_old is the sampler's (the behaviour policy), or with `rl.tis_cap` the trainer's proximal
policy and the truncated behaviour weight (`tirl.train.learner.old_logprobs_from_sampler`). A checkpoint
finishes and pushes every pending update first, in a resumed run as in an uninterrupted one,
so checkpoints hold whole steps.

A step counts whether or not it updates (the budget schedule, `rl.steps` and the
partial-rollout policy version count steps); `train/updates` counts updates. The trainer's
whole state (model, optimizer, schedule, RNG, step, stage, and the feed's position in the task
stream, curriculum and waiting groups) goes into a checkpoint, and a resumed run continues
exactly where the saved one would have (with partial rollouts, but for the unfinished
trajectories: `tirl.train.feed`).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
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
class PendingStep:
    """A step's record not logged yet (async RL): its update queued or running in the worker
    (`update`: a future of the update's metrics and, with k >= 2, a copy of the weights it
    left), or None for a step that did not update, logged after the updates before it."""

    metrics: dict
    update: asyncio.Future | None = None


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
        # Async RL (module docstring): the staleness bound k, the steps whose records wait
        # for their updates (oldest first), the one worker thread that runs the updates in
        # order, and with k >= 2 the module the engine loads a finished update's weights from.
        self.bound = cfg.staleness_bound
        self.pending: collections.deque[PendingStep] = collections.deque()
        self.worker = ThreadPoolExecutor(1, "tirl-update") if self.bound else None
        self.staging = copy.deepcopy(model) if self.bound >= 2 else None
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
                await self.finish_updates()  # a checkpoint holds whole steps only
                self.save_checkpoint(checkpoint_dir)
        await self.finish_updates()
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
        """One step (module docstring); returns its record. With a staleness bound k >= 1 the
        step returns once its update is queued in the worker; the record gets the update's
        keys and is logged once the update is done, after the records before it."""
        start = time.perf_counter()
        cfg = self.cfg
        # A restored checkpoint's weights; with updates pending, the engine keeps the weights
        # it has until `settle` hands it a finished one.
        stale = not self.engine_current and not self.pending
        pushed = await self.push_weights() if stale else {}
        max_tokens, budget = self.limits()
        if self.settings is None:
            raise ValueError("this RLTrainer was built without rollout settings: it only updates")
        settings = dataclasses.replace(
            self.settings, max_model_tokens=max_tokens, tool_budget=budget
        )
        batch, batch_stats = await self.feed.collect(settings, self.state.step, self.engine_version)
        rollout_s = time.perf_counter() - start
        metrics: dict = {"variant": self.variant, "phase": "rl", "step": self.state.step}
        metrics.update({"rl/budget": budget, "rl/max_model_tokens": max_tokens})
        metrics.update(batch_stats)
        metrics.update(pushed)  # a restored checkpoint's weights; an update's push replaces it
        if self.bound:  # the oldest updates, sampled over while this step sampled
            waited = time.perf_counter()
            await self.settle(self.bound - 1)
            metrics["time/update_wait_s"] = time.perf_counter() - waited
        if batch:
            if self.engine_caps.sleeps_during_update:  # e.g. vLLM frees its KV cache
                await self.rollout.engine.pause()
            trajs = [t for group in batch for t in group]
            rewards = torch.tensor([t.meta["reward"] for t in trajs], dtype=torch.float)
            metrics.update(batch_metrics(trajs, rewards))
            # which tasks this update learned from, so a study can count its mixture from the log
            metrics["train/tasks"] = [self.task_at(group[0].meta["task"]).id for group in batch]
            order = torch.randperm(len(trajs))  # drawn here: the update may run in a thread
            if not self.bound:
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
        if not self.bound:
            self.log(metrics)
            return metrics
        update = None
        if batch:  # after every update queued before it: the worker runs them in order
            before = self.state.updates + self.updates_pending()
            work = (trajs, max_tokens, rewards, order, before)
            update = asyncio.get_running_loop().run_in_executor(self.worker, self.work, *work)
        self.pending.append(PendingStep(metrics, update))
        await self.settle(self.bound)  # logs this record now if it waits for no update
        return metrics

    def work(self, trajs, max_tokens, rewards, order, before: int) -> tuple[dict, dict | None]:
        """One queued update, in the worker thread: its metrics and, with k >= 2, a copy of
        the weights it left, which the engine loads while the next update runs."""
        metrics = self.timed_update(trajs, max_tokens, rewards, order, before)
        if self.staging is None:
            return metrics, None
        return metrics, {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def timed_update(self, trajs, max_tokens, rewards, order, before: int | None = None) -> dict:
        start = time.perf_counter()
        with sharing_cores(2 if self.bound else 1):  # with the sampler
            metrics = self.learn(trajs, max_tokens, rewards, order, before)
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
        metrics = self.learn(trajs, max_tokens, rewards, order)
        self.engine_current = False  # until push_weights, which the step awaits next
        return metrics

    def learn(self, trajs, max_tokens, rewards=None, order=None, before=None) -> dict:
        """`update` without touching the trainer's flags (the worker thread calls it);
        `before`: the updates made before this one (default: the count so far)."""
        rewards = self.feed.rewards_of(trajs, max_tokens) if rewards is None else rewards
        order = torch.randperm(len(trajs)) if order is None else order
        before = self.state.updates if before is None else before
        return self.learner.update(trajs, rewards, order, max_tokens, before)

    async def updated(self, metrics: dict) -> None:
        """After an update: the count, and the new weights into the engine."""
        self.state.updates += 1
        metrics.update(await self.push_weights())

    def updates_pending(self) -> int:
        return sum(p.update is not None for p in self.pending)

    async def settle(self, limit: int) -> None:
        """Finish the oldest pending updates until at most `limit` are pending, push the last
        finished one's weights into the engine, and log the records that wait for nothing
        more, in order."""
        done: list[dict] = []
        weights: dict | None = None
        try:
            while self.pending:
                head = self.pending[0]
                if head.update is not None and self.updates_pending() <= limit:
                    break
                if head.update is not None:
                    result, weights = await head.update
                    head.metrics.update(result)
                    self.state.updates += 1
                head.metrics["train/updates"] = self.state.updates
                done.append(self.pending.popleft().metrics)
        except BaseException:
            self.abandon()
            raise
        if any(m["train/updated"] for m in done):  # the newest one carries the push
            last = [m for m in done if m["train/updated"]][-1]
            last.update(await self.push_weights(weights))
        for metrics in done:
            self.log(metrics)

    async def finish_updates(self) -> None:
        """Finish every pending update, push the last one's weights and log the records: what
        a checkpoint holds and where a phase ends. Nothing when none is pending."""
        await self.settle(0)

    def abandon(self) -> None:
        """An update failed: the queued ones are cancelled, and the run stops."""
        for pending in self.pending:
            if pending.update is not None:
                pending.update.cancel()
        self.pending.clear()

    def log(self, metrics: dict) -> None:
        metrics.setdefault("train/updates", self.state.updates)
        metrics["mem/peak_rss_gb"] = peak_rss_gb()
        if self.logger is not None:
            self.logger.log(metrics)

    async def push_weights(self, weights: dict | None = None) -> dict:
        """Put the trained policy into an engine that receives weights (`load_weights`,
        `tirl.backends.engine`; under FSDP a collective every rank calls): the model, or
        `weights`, a finished update's copy, by way of the staging module (k >= 2, while the
        next update may run). A push that fails raises `WeightPushError` and the run stops:
        nothing samples stale weights."""
        start = time.perf_counter()
        if self.engine_caps.receives_weights:
            source = self.model
            if weights is not None:
                self.staging.load_state_dict(weights)
                source = self.staging
            await self.rollout.engine.load_weights(source)
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
