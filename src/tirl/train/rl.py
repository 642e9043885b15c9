"""On-policy RL for code-integrated reasoning, with every CIR and AgentMath strategy a switch.

One step:
1. Sample `group_size` trajectories for each of the tasks the batch still lacks, with the
   tool budget and model-token limit of the budget schedule (CIR §3.1, 2 -> 3 -> 4) or of the
   current expansion stage (AgentMath §3.3). Each trajectory is seeded by its task index and
   sample number, so what is sampled does not depend on scheduling or on the number of ranks.
2. Score each trajectory once, as it finishes, by its own task (`Task.score` on the model's
   text, `tirl.tasks.scoring`), and reward it (`rl.reward`: CIR's +1 / -1, AgentMath's
   composite, or `task`: the scorer's reward in [0, 1], RACES's partial credit), minus DAPO's
   overlong penalty if on; the reward is kept in `meta["reward"]`.
3. Build the batch (the rule below). Adaptive batches (AgentMath §3.2) drop groups whose
   rewards are all equal (no group-relative signal) and refill from fresh tasks.
4. Token advantages (`tirl.algos`: GRPO, Dr.GRPO, REINFORCE++ with the return carried
   through tool tokens, REINFORCE++-baseline, RLOO), over model tokens only.
5. `updates_per_step` optimizer steps over minibatches of the PPO clipped loss (clip-higher,
   optional dual clip), KL and entropy terms only when their coefficients are non-zero
   (CIR §2.3.2 turns both off); micro-batches and ranks as in `tirl.train.update`.
6. Expansion: if the truncation rate over every trajectory that finished in the step,
   whether its group is trained, dropped or waits (failed ones aside;
   `batch/truncation_rate_sampled`), exceeds `expansion_threshold`, move to the next stage.
   A step that does not update may still expand. Measuring only the trained batch
   (`train/truncation_rate`, logged beside it) would lag: truncated groups are mostly all
   wrong, hence uniform, hence dropped by adaptive batches.

The batch rule: an update trains on exactly `prompts_per_step` usable groups, never fewer
and never more. A group is usable when some member did not fail (finish_reason "error" or
"cancelled": an engine or sandbox failure says nothing about the policy, so failed members
are left out and counted in `rollout/failed`) and, with `adaptive_batch`, when its rewards
are not all equal. A step samples in rounds: the first, then, with `adaptive_batch`, up to
`max_refill_rounds` refill rounds, each starting only as many new tasks as the batch still
lacks (no oversampling, so no surplus group is ever thrown away). `max_refill_rounds` is
thus the cap on extra sampling per step. When the rounds end short of a full batch the step
does not update (`train/updated` 0, `batch/cap_hit` 1): the usable groups found so far wait
for the next step, where the refill starts from them. They are still exactly on-policy,
because the weights did not change (they keep the reward they were scored with, should the
stage or tool budget move meanwhile). The step still counts (the budget schedule,
`rl.steps` and the partial-rollout policy version count steps, not updates);
`train/updates` counts updates.

Partial rollouts (`segment_tokens` / `segment_tool_calls`, `tirl.rollout.partial`): each
step advances every unfinished trajectory by one segment and starts new tasks; a group is
complete once all its members have finished. Complete usable groups wait in task order
(oldest first) and an update takes the `prompts_per_step` oldest; the rest wait for the next
step (one update staler, as partial rollouts are anyway; `mismatch/abs_diff_mean` shows it). A
refill round, when adaptive batches call one, advances every unfinished trajectory by one
more segment under the same weights. So that waiting and unfinished groups cannot pile up,
a round starts min(shortfall, 2 * prompts_per_step - open) new tasks, where shortfall =
prompts_per_step - waiting groups and open = waiting groups + groups with a member still
sampling: at most two batches' worth of groups are ever open (the batch being trained and
the next one filling), so one long-running group does not hold up the others, and nothing
grows without bound.

Curriculum (`rl.curriculum`, `tirl.train.curriculum`): task position i is then the
curriculum's draw rather than the stream's i-th item. Every position a round starts is drawn
when it starts (on every rank alike), and every finished group's pass rate (its correct share,
failed members aside) is fed back as the group completes, so later rounds and steps draw from
the buckets whose rate is in the target band. Off, the stream is untouched.

The trainer's whole state (model, optimizer, learning-rate schedule, RNG, step, stage, the
position in the task stream, the curriculum's state and the groups waiting for the next
update) goes into a checkpoint, and a resumed run continues exactly where the saved one would have. With partial
rollouts, unfinished trajectories cannot be saved mid-sample (their sandbox sessions die with
the process): they restart from their prompts after a resume, so that resume is not exact.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tirl.algos.mismatch import mismatch_metrics, truncated_is_weights
from tirl.algos.overlong import overlong_penalty
from tirl.config import ConfigError
from tirl.cpu import pace, sharing_cores
from tirl.models.lora import is_lora, trainable_parameters
from tirl.protocol import Protocol, get_protocol
from tirl.protocol.segments import Trajectory
from tirl.rewards.reward import configured_reward
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.limits import budget_at, is_truncated
from tirl.rollout.partial import PartialRolloutPool
from tirl.rollout.runner import Rollout, RolloutSettings, trajectory_seed
from tirl.tasks.base import Task
from tirl.tasks.prompts import PLAIN_TEMPLATE
from tirl.tasks.scoring import score_trajectory
from tirl.train.batch import collate
from tirl.train.config import RLConfig
from tirl.train.curriculum import Curriculum
from tirl.train.distributed import DistContext, gather_in_order, grad_norm_value, sum_over_ranks
from tirl.train.metrics import MetricsLogger, peak_rss_gb
from tirl.train.runtime import phase_settings
from tirl.train.update import (
    Shard,
    batch_advantages,
    batch_logprobs,
    minibatch_loss_backward,
    update_autocast,
)

FAILED = ("error", "cancelled")  # finish reasons of trajectories left out of training
TaskAt = Callable[[int], Task]  # the i-th training task; positions make runs resumable
PromptOf = Callable[[Task], Sequence[int] | str]  # a task's prompt: token ids (or plain text)


@dataclasses.dataclass
class TrainerState:
    step: int = 0  # steps done
    next_task: int = 0  # position in the task stream
    stage: int = 0  # expansion stage (AgentMath), when `rl.stages` is set
    updates: int = 0  # steps that updated the policy (a step short of a full batch does not)


def plain_prompt(task: Task) -> str:
    """The plain prompt text of `task` (no chat template), as `PromptRenderer` writes it."""
    return PLAIN_TEMPLATE.format(problem=task.problem)


def _prompt(prompt: Sequence[int] | str) -> list[int] | str:
    return prompt if isinstance(prompt, str) else list(prompt)


def reward_from_config(cfg: RLConfig) -> Callable[[Trajectory], float]:
    """The reward `rl.reward` names with the parameters the config gives it
    (`tirl.rewards.reward.configured_reward`), as a function of a scored trajectory."""
    return configured_reward(cfg.reward, cfg.reward_kwargs())


def uniform_groups(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """[G] bool over `groups.unique()`: True where every reward of the group is equal."""
    return torch.stack(
        [(rewards[groups == g] == rewards[groups == g][0]).all() for g in groups.unique()]
    )


def tasks_to_start(prompts_per_step: int, waiting: int, in_flight: int | None) -> int:
    """New tasks for one sampling round (see the module docstring): the batch's shortfall,
    and with partial rollouts (`in_flight` not None) no more than keeps
    2 * `prompts_per_step` groups open (waiting + in flight)."""
    shortfall = max(0, prompts_per_step - waiting)
    if in_flight is None:
        return shortfall
    return max(0, min(shortfall, 2 * prompts_per_step - waiting - in_flight))


def staleness_metrics(trajs: Sequence[Trajectory], updates: int) -> dict[str, float]:
    """How many updates the weights being trained are ahead of those that sampled the batch
    (`meta["policy_version"]`: the engine's update count when the trajectory finished)."""
    lags = [updates - t.meta.get("policy_version", updates) for t in trajs]
    return {"rl/staleness_mean": sum(lags) / len(lags), "rl/staleness_max": float(max(lags))}


def old_logprobs_from_sampler(cfg: RLConfig, engine: object, partial: bool) -> bool:
    """Whether the update takes the sampler's log-probabilities as pi_old (`rl.old_logprobs`).
    `auto` does where the sampler computes the trainer's own numbers: an engine that declares
    `logprobs_match_trainer` (tirl's HF engine: the trainer's model or a copy of it, in its
    dtype, untempered log-probs), without partial rollouts (several policy versions in one
    trajectory), TIS (which corrects against the trainer's pass) or a bf16 update (the
    engine samples in the weights' dtype)."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "sampler"
    agree = getattr(engine, "logprobs_match_trainer", False)
    return bool(agree) and not partial and cfg.tis_cap is None and not cfg.bf16


class RLTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        rollout: Rollout,
        task_at: TaskAt,
        cfg: RLConfig,
        *,
        pad_id: int,
        use_tools: bool,
        prompt_of: PromptOf | None = None,
        protocol: Protocol | str = "cir_fences",
        max_output_chars: int = RolloutSettings.max_output_chars,
        logger: MetricsLogger | None = None,
        variant: str = "",
        seed: int = 0,
        dist: DistContext | None = None,
        reward_fn: Callable[[Trajectory], float] | None = None,
    ) -> None:
        """`task_at(i)` is the i-th training task, asked as `prompt_of(task)` (its prompt ids
        from `tirl.tasks.prompts.PromptRenderer`; default: the plain prompt text), with code
        written in `protocol` (a name: in exact-match mode). `reward_fn(trajectory)`
        replaces the configured reward (`rl.reward`); it is called once per trajectory, when
        it finishes (failed ones excluded), and trajectories carry `meta["task"]` (the task's
        index), `meta["seed"]`, the task's `task_id` and `score` (`tirl.tasks.scoring`) and their
        real `finish_reason`."""
        self.model = model
        self.rollout = rollout
        # With `rl.curriculum` on, position i is the curriculum's draw, not the stream's i-th.
        self.curriculum = (
            Curriculum(task_at, cfg.curriculum, seed) if cfg.curriculum.enabled else None
        )
        self.task_at = self.curriculum.task_at if self.curriculum is not None else task_at
        self.prompt_of = prompt_of or plain_prompt
        self.cfg = cfg
        self.pad_id = pad_id
        self.use_tools = use_tools
        self.max_output_chars = max_output_chars  # as in evaluation: one view of tool output
        self.logger = logger if dist is None or dist.is_main else None
        self.variant = variant
        self.seed = seed
        self.dist = dist
        self.shard = dist.shard if dist is not None else Shard()
        self.reward_fn = reward_fn or reward_from_config(cfg)
        if isinstance(protocol, str):
            protocol = get_protocol(protocol)
        self.protocol = protocol
        self.params = trainable_parameters(model)  # the adapters only, under LoRA
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)
        warmup = max(1, cfg.warmup_steps * cfg.updates_per_step)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: min(1.0, (u + 1) / warmup)
        )
        self.reference = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None
        self.device = next(model.parameters()).device
        self.state = TrainerState()
        self.pool = None  # partial rollouts: unfinished trajectories carried across steps
        if cfg.segment_tokens or cfg.segment_tool_calls:
            if dist is not None:
                raise ConfigError(
                    "rl.segment_tokens / segment_tool_calls (partial rollouts) do not run"
                    " under torch.distributed yet"
                )
            self.pool = PartialRolloutPool(rollout, max_staleness=cfg.max_staleness)
        engine = rollout.engine if rollout is not None else None
        if cfg.one_step_off_policy:
            if dist is not None:
                raise ConfigError("rl.one_step_off_policy does not run under torch.distributed yet")
            if getattr(engine, "model", None) is model:
                raise ConfigError(
                    "rl.one_step_off_policy needs an engine that samples a copy of the"
                    " weights, not the model being trained (tirl train makes one)"
                )
            if getattr(engine, "sleep_during_update", False):
                raise ConfigError(
                    "rl.one_step_off_policy samples during the update, so the engine cannot"
                    " sleep through it: drop sleep_during_update from rollout.engine_options"
                )
        self.old_from_sampler = old_logprobs_from_sampler(cfg, engine, self.pool is not None)
        # One step off-policy: the update running in a thread while the next step samples,
        # and the record it completes (logged when it is done).
        self.updating: tuple[asyncio.Task, dict] | None = None
        self.engine_version = 0  # updates included in the weights the engine samples with
        # False once the trained weights differ from the engine's (after an update or a
        # restored checkpoint): the next step pushes them before it samples.
        self.engine_current = True
        self.pending: dict[int, list[Trajectory]] = {}  # finished members of unfinished groups
        self.restart: list[dict] = []  # metas of carried trajectories a resume must restart
        # Complete usable groups not trained on yet, oldest task first: a step short of a
        # full batch leaves them here, and with partial rollouts so does a surplus.
        self.ready: list[list[Trajectory]] = []

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

    def new_metas(self, n: int) -> list[dict]:
        """Metas of the next `n` tasks' trajectories (this rank's share of them)."""
        first = self.state.next_task
        self.state.next_task += n
        if self.curriculum is not None:  # every rank draws every position, in order
            self.curriculum.assign(first + n)
        return [
            {"task": i, "seed": trajectory_seed(self.seed, i, j)}
            for i in range(first + self.shard.rank, first + n, self.shard.world)
            for j in range(self.cfg.group_size)
        ]

    def score(self, trajs: list[Trajectory], max_tokens: int) -> None:
        """Correctness and, for those that did not fail, `meta["reward"]`: computed once, as a
        trajectory finishes, under the limit it was sampled with. The batch rule and the
        update then read the same number, even when a group waits for a later step whose
        limit (and so overlong penalty) differs."""
        for traj in trajs:
            score_trajectory(traj, self.task_at(traj.meta["task"]))
            traj.meta.setdefault("policy_version", self.engine_version)
        ok = [t for t in trajs if t.finish_reason not in FAILED]
        if ok:
            for traj, reward in zip(ok, self.rewards_of(ok, max_tokens).tolist()):
                traj.meta["reward"] = reward

    async def sample_groups(self, n: int, settings: RolloutSettings) -> list[list[Trajectory]]:
        """`n` fresh tasks, `group_size` scored trajectories each. Under torch.distributed each
        rank samples every world-th group and all ranks get all groups. With partial
        rollouts, the groups whose last member finished in this step, whenever they began."""
        metas = self.new_metas(n)
        prompts = [_prompt(self.prompt_of(self.task_at(m["task"]))) for m in metas]
        if self.pool is not None:
            return await self.sample_partial(prompts, metas, settings)
        trajs = await self.rollout.run_many(prompts, settings, metas)
        self.score(trajs, settings.max_model_tokens)
        g_size = self.cfg.group_size
        groups = [trajs[k : k + g_size] for k in range(0, len(trajs), g_size)]
        return gather_in_order(groups, self.dist, n)

    async def sample_partial(
        self, prompts: list, metas: list[dict], settings: RolloutSettings
    ) -> list[list[Trajectory]]:
        restart, self.restart = self.restart, []
        prompts += [_prompt(self.prompt_of(self.task_at(m["task"]))) for m in restart]
        finished = await self.pool.step(prompts, settings, self.state.step, metas + restart)
        self.score(finished, settings.max_model_tokens)
        for traj in finished:
            self.pending.setdefault(traj.meta["task"], []).append(traj)
        done = sorted(
            t for t, members in self.pending.items() if len(members) == self.cfg.group_size
        )
        return [sorted(self.pending.pop(t), key=lambda x: x.meta["seed"]) for t in done]

    def rewards_of(self, trajs: list[Trajectory], max_tokens: int) -> torch.Tensor:
        rewards = torch.tensor([self.reward_fn(t) for t in trajs], dtype=torch.float)
        if self.cfg.overlong_buffer > 0:
            lengths = torch.tensor([t.num_model_tokens for t in trajs])
            rewards = rewards + overlong_penalty(
                lengths, max_tokens, self.cfg.overlong_buffer, self.cfg.overlong_penalty
            )
        return rewards

    def groups_in_flight(self) -> int | None:
        """Groups with a member still sampling (partial rollouts; None without them): carried
        to the next step, to restart after a resume, or finished and waiting for the rest."""
        if self.pool is None:
            return None
        return len({m["task"] for m in self.carried_metas()} | set(self.pending))

    async def collect(self, settings: RolloutSettings) -> tuple[list[list[Trajectory]], dict]:
        """The step's batch by the batch rule of the module docstring: `prompts_per_step`
        usable groups, or none when the sampling rounds end short of them."""
        cfg = self.cfg
        want = cfg.prompts_per_step
        carried_in = len(self.ready)
        rounds_allowed = 1 + (cfg.max_refill_rounds if cfg.adaptive_batch else 0)
        sampled = dropped = failed = started = rounds = 0
        finished: list[Trajectory] = []  # every trajectory that finished in this step, not failed
        while rounds < rounds_allowed:
            # A step with partial rollouts always runs its first round: it is what advances
            # the unfinished trajectories, even when the batch is already full.
            if len(self.ready) >= want and (rounds or self.pool is None):
                break
            n = tasks_to_start(want, len(self.ready), self.groups_in_flight())
            started += n
            groups = await self.sample_groups(n, settings)
            rounds += 1
            sampled += len(groups)
            for group in groups:
                ok = [t for t in group if t.finish_reason not in FAILED]
                failed += len(group) - len(ok)
                finished += ok
                if self.curriculum is not None and ok:  # failures say nothing of the policy
                    pass_rate = sum(t.correct for t in ok) / len(ok)
                    self.curriculum.observe(group[0].meta["task"], pass_rate)
                rewards = [t.meta["reward"] for t in ok]
                if not ok or (cfg.adaptive_batch and len(set(rewards)) == 1):
                    dropped += 1
                else:
                    self.ready.append(ok)
        # Oldest task first: with partial rollouts a group started early may finish late.
        self.ready.sort(key=lambda group: group[0].meta["task"])
        full = len(self.ready) >= want
        batch = self.ready[:want] if full else []
        fill = min(len(self.ready), want) / want
        if full:
            self.ready = self.ready[want:]
        stats = {
            "batch/groups_sampled": sampled,
            "batch/groups_dropped": dropped,
            "batch/groups_carried_in": carried_in,
            "batch/groups_waiting": len(self.ready),
            "batch/tasks_started": started,
            "batch/refill_rounds": max(0, rounds - 1),
            "batch/fill": fill,
            "batch/cap_hit": int(not full),
            "batch/trajectories_sampled": len(finished),
            "rollout/failed": failed,
        }
        if finished:  # nothing finished (partial rollouts' first steps): no rate, no expansion
            stats["batch/truncation_rate_sampled"] = sum(map(is_truncated, finished)) / len(
                finished
            )
        if self.pool is not None:
            stats["batch/groups_in_flight"] = self.groups_in_flight()
        if self.curriculum is not None:
            stats.update(self.curriculum.step_metrics())
        return batch, stats

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
        settings = phase_settings(
            self.protocol,
            self.max_output_chars,
            self.use_tools,
            max_model_tokens=max_tokens,
            tool_budget=budget,
            temperature=cfg.temperature,
            segment_tokens=cfg.segment_tokens or None,
            segment_tool_calls=cfg.segment_tool_calls or None,
        )
        batch, batch_stats = await self.collect(settings)
        if self.pool is not None:
            batch_stats.update(self.pool.stats())
        rollout_s = time.perf_counter() - start
        await self.finish_update()  # the previous step's, which ran while this one sampled
        metrics: dict = {"variant": self.variant, "phase": "rl", "step": self.state.step}
        metrics.update({"rl/budget": budget, "rl/max_model_tokens": max_tokens})
        metrics.update(batch_stats)
        metrics.update(pushed)  # a restored checkpoint's weights; an update's push replaces it
        if batch:
            pause = getattr(self.rollout.engine, "pause", None) if self.rollout else None
            if pause is not None and not cfg.one_step_off_policy:
                await pause()  # e.g. vLLM's sleep mode frees its KV cache for the update
            trajs = [t for group in batch for t in group]
            rewards = torch.tensor([t.meta["reward"] for t in trajs], dtype=torch.float)
            metrics.update(self.rollout_metrics(trajs, rewards))
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

    def rollout_metrics(self, trajs: list[Trajectory], rewards: torch.Tensor) -> dict:
        """Statistics of the trained batch (`rewards` [B], one per trajectory)."""
        n = len(trajs)
        return {
            "train/reward_mean": float(rewards.mean()),
            "train/accuracy": sum(t.correct for t in trajs) / n,
            "train/truncation_rate": sum(is_truncated(t) for t in trajs) / n,
            "length/model_tokens_mean": sum(t.num_model_tokens for t in trajs) / n,
            "length/tool_tokens_mean": sum(t.num_tool_tokens for t in trajs) / n,
            **aggregate_tool_stats([tool_stats(t) for t in trajs]),
        }

    # ------------------------------------------------------------------ the update
    def update(
        self,
        trajs: list[Trajectory],
        max_tokens: int,
        rewards: torch.Tensor | None = None,
        order: torch.Tensor | None = None,
    ) -> dict:
        """Optimizer steps on one batch; `rewards` [B] (default: `rewards_of(trajs)`), `order`
        [B] the rows' permutation into minibatches (default: drawn here)."""
        cfg = self.cfg
        rewards = self.rewards_of(trajs, max_tokens) if rewards is None else rewards
        order = torch.randperm(len(trajs)) if order is None else order
        groups = torch.tensor([t.meta["task"] for t in trajs])
        batch = collate(trajs, self.pad_id, cfg.mask_tool_output).to(self.device)
        token_adv = batch_advantages(cfg, rewards, groups, batch.loss_mask.cpu()).to(
            self.device
        )  # [B, T-1]
        micro = (cfg.micro_batch_size, cfg.micro_batch_tokens)
        mismatch = staleness_metrics(trajs, self.state.updates)
        if self.old_from_sampler:  # no pass: the sampler's numbers are pi_old
            old_logprobs = batch.sampler_logprobs * batch.sampled  # [B, T-1]
        else:
            # Every rank scores the whole batch here, so the numbers match one process
            # exactly; the backward passes below are what is sharded.
            with update_autocast(cfg, self.model, self.device):  # as the update's forward
                old_logprobs = batch_logprobs(self.model, batch, *micro)
            mismatch |= mismatch_metrics(old_logprobs, batch.sampler_logprobs, batch.sampled)
            if cfg.tis_cap is not None:  # [B, T-1] weights on the token losses (algos.mismatch)
                tis = truncated_is_weights(
                    old_logprobs, batch.sampler_logprobs, batch.sampled, cfg.tis_cap
                )
                token_adv = token_adv * torch.where(batch.sampled.bool(), tis, 1.0)
                mismatch["mismatch/tis_weight_mean"] = float(
                    (tis * batch.sampled).sum() / batch.sampled.sum().clamp_min(1)
                )
        ref_logprobs = None
        if self.reference is not None:
            with update_autocast(cfg, self.reference, self.device):
                ref_logprobs = batch_logprobs(self.reference, batch, *micro)

        self.model.train()
        per_update: list[dict] = []
        for rows in order.chunk(cfg.updates_per_step):
            pace()  # torch's threads follow the free cores (tirl.cpu)
            self.optimizer.zero_grad(set_to_none=True)
            m = minibatch_loss_backward(
                self.model, batch, rows.to(self.device), old_logprobs, token_adv,
                ref_logprobs, cfg, self.shard, norm_len=max_tokens,
            )  # fmt: skip
            m = sum_over_ranks(m, self.dist)
            norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
            m["actor/grad_norm"] = grad_norm_value(norm)
            self.optimizer.step()
            self.schedule.step()
            per_update.append(m)
        self.model.eval()
        self.engine_current = False  # until push_weights, which the step awaits next

        groups_uniform = uniform_groups(rewards, groups)
        return {
            "train/lr": self.schedule.get_last_lr()[0],
            "train/groups": len(groups_uniform),
            "train/uniform_group_share": float(groups_uniform.float().mean()),
            **mismatch,
            **{k: sum(m[k] for m in per_update) / len(per_update) for k in per_update[0]},
        }

    async def push_weights(self) -> dict:
        """Put the trained policy into the rollout engine (`load_weights` of
        `tirl.backends.engine`): nothing for an HF engine sampling the trained model itself,
        a copy for an HF engine on a separate model (always under FSDP, where the shards are
        gathered: a collective every rank calls), vLLM's weight reload for `vllm`. A push that
        fails raises `WeightPushError` and the run stops: nothing samples stale weights."""
        load = getattr(self.rollout.engine, "load_weights", None) if self.rollout else None
        start = time.perf_counter()
        if load is not None:
            await load(self.model)
        self.engine_current = True
        self.engine_version = self.state.updates
        return {"time/weight_push_s": time.perf_counter() - start}

    # ------------------------------------------------------------------ checkpoints
    def carried_metas(self) -> list[dict]:
        """Metas (task, seed) of the trajectories carried to the next step, and of those still
        to restart."""
        carried = self.pool.carried if self.pool is not None else []
        keep = ("task", "seed")
        metas = [{k: c.trajectory.meta[k] for k in keep} for c in carried]
        return metas + self.restart

    def save_checkpoint(self, directory: Path) -> Path:
        """Write `trainer.pt` (model, optimizer, schedule, RNG, state) into `directory`."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        # Under LoRA the frozen base is the SFT start's, saved already: only adapters here.
        options = StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=True
        )
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        if is_lora(self.model):  # a head tied to the frozen embedding is listed all the same
            trained = {name for name, p in self.model.named_parameters() if p.requires_grad}
            model_sd = {k: v for k, v in model_sd.items() if k in trained}
        path = Path(directory) / "trainer.pt"
        if self.dist is None or self.dist.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            payload = {
                "model": model_sd,
                "optimizer": optim_sd,
                "schedule": self.schedule.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
                "state": dataclasses.asdict(self.state),
                # Partial rollouts: finished members of open groups are kept; carried ones
                # restart from their prompts after a resume (their sessions die with us).
                "pending": {t: [x.to_dict() for x in xs] for t, xs in self.pending.items()},
                "restart": self.carried_metas(),
                # Usable groups waiting for the next update: on-policy, so a resume trains
                # on exactly what the uninterrupted run would have.
                "ready": [[x.to_dict() for x in group] for group in self.ready],
                "config": dataclasses.asdict(self.cfg),
            }
            if self.curriculum is not None:  # the draws so far and the rates behind the next
                payload["curriculum"] = self.curriculum.state_dict()
            from tirl.files import open_replacing  # whole or not at all; ENOSPC as OSError

            with open_replacing(path) as f:  # a crash while saving keeps the previous one
                torch.save(payload, f)
        return path

    def load_checkpoint(self, directory: Path) -> None:
        """Restore everything `save_checkpoint` wrote; the next step is the one after it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        path = Path(directory) / "trainer.pt"
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        from tirl.files import read_whole  # a damaged checkpoint: one line that says so

        payload = read_whole(
            path,
            lambda f: torch.load(f, map_location="cpu", weights_only=False),
            f"delete {path.parent} to start RL over from the SFT model",
        )
        # set_state_dict builds the optimizer's state by a zero step, which it skips when
        # gradients are present (e.g. left by an earlier run of the same model object).
        self.model.zero_grad(set_to_none=True)
        frozen = is_lora(self.model)  # the checkpoint holds the adapters, not the frozen base
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=False, strict=not frozen
        )
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=payload["model"],
            optim_state_dict=payload["optimizer"],
            options=options,
        )
        self.schedule.load_state_dict(payload["schedule"])
        torch.set_rng_state(payload["torch_rng"])
        random.setstate(payload["python_rng"])
        self.state = TrainerState(**payload["state"])
        self.pending = {
            t: [Trajectory.from_dict(x) for x in xs] for t, xs in payload["pending"].items()
        }
        self.restart = payload["restart"]
        ready = payload.get("ready", [])  # absent from checkpoints written before it was kept
        self.ready = [[Trajectory.from_dict(x) for x in group] for group in ready]
        if self.curriculum is not None:
            if "curriculum" not in payload:
                raise ConfigError(
                    f"rl.curriculum.enabled: the checkpoint {path} was written without the"
                    " curriculum; resume with it off, or delete the folder to start RL over",
                    "rl.curriculum.enabled",
                )
            self.curriculum.load_state_dict(payload["curriculum"])
        self.engine_current = False  # the next step pushes the restored weights first
