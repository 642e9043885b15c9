"""On-policy RL for code-integrated reasoning, with every CIR and AgentMath strategy a switch.

One step:
1. Sample `group_size` trajectories for each of `prompts_per_step` training tasks, with the
   tool budget and model-token limit of the budget schedule (CIR §3.1, 2 -> 3 -> 4) or of the
   current expansion stage (AgentMath §3.3). Each trajectory is seeded by its task index and
   sample number, so what is sampled does not depend on scheduling or on the number of ranks.
2. Score them (CIR: +1 / -1; AgentMath: composite), minus DAPO's overlong penalty if on.
3. Adaptive batches (AgentMath §3.2): drop groups whose rewards are all equal (no group-
   relative signal) and refill from fresh tasks, at most `max_refill_rounds` more rounds.
4. Token advantages (`tirl.algos`: GRPO, Dr.GRPO, REINFORCE++ with the return carried
   through tool tokens, REINFORCE++-baseline, RLOO), over model tokens only.
5. `updates_per_step` optimizer steps over minibatches of the PPO clipped loss (clip-higher,
   optional dual clip), KL and entropy terms only when their coefficients are non-zero
   (CIR §2.3.2 turns both off); micro-batches and ranks as in `tirl.train.update`.
6. Expansion: if the step's truncation rate exceeds `expansion_threshold`, move to the next
   stage.

The trainer's whole state (model, optimizer, learning-rate schedule, RNG, step, stage and
the position in the task stream) goes into a checkpoint, and a resumed run continues exactly
where the saved one would have.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from tirl.algos.advantages import token_advantages
from tirl.algos.overlong import overlong_penalty
from tirl.config import ConfigError
from tirl.envs.arithmetic import Task
from tirl.eval.evaluate import score
from tirl.protocol import get_protocol
from tirl.protocol.segments import Trajectory
from tirl.rewards.reward import make_reward
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.partial import PartialRolloutPool
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.synth.arithmetic import prompt_for
from tirl.train.batch import collate
from tirl.train.config import RLConfig
from tirl.train.curriculum import budget_at
from tirl.train.distributed import DistContext, gather_in_order, grad_norm_value, sum_over_ranks
from tirl.train.metrics import MetricsLogger
from tirl.train.update import Shard, batch_logprobs, minibatch_loss_backward

FAILED = ("error", "cancelled")  # finish reasons of trajectories left out of training
TaskSource = Callable[[int], Task]  # the i-th training task; positions make runs resumable


@dataclasses.dataclass
class TrainerState:
    step: int = 0  # steps done
    next_task: int = 0  # position in the task stream
    stage: int = 0  # expansion stage (AgentMath), when `rl.stages` is set


def trajectory_seed(seed: int, task_index: int, sample: int) -> int:
    """The sampling seed of one trajectory: fixed by what it answers, not by when it runs."""
    return (seed * 1_000_003 + task_index) * 1_009 + sample


def is_truncated(traj: Trajectory) -> bool:
    """Cut by the model-token limit, the tool-call budget or the staleness bound (AgentMath's
    truncation)."""
    cut = traj.finish_reason in ("length", "stale")
    return cut or any(c.status == "skipped" for c in traj.tool_calls)


def uniform_groups(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """[G] bool over `groups.unique()`: True where every reward of the group is equal."""
    return torch.stack(
        [(rewards[groups == g] == rewards[groups == g][0]).all() for g in groups.unique()]
    )


class RLTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        rollout: Rollout,
        task_at: TaskSource,
        cfg: RLConfig,
        *,
        pad_id: int,
        use_tools: bool,
        max_output_chars: int = RolloutSettings.max_output_chars,
        logger: MetricsLogger | None = None,
        variant: str = "",
        seed: int = 0,
        dist: DistContext | None = None,
        reward_fn: Callable[[Trajectory], float] | None = None,
    ) -> None:
        """`task_at(i)` is the i-th training task. `reward_fn(trajectory)` replaces the
        configured reward (`rl.reward`) for custom tasks; trajectories carry `meta["task"]`
        (the task's index) and `meta["correct"]`."""
        self.model = model
        self.rollout = rollout
        self.task_at = task_at
        self.cfg = cfg
        self.pad_id = pad_id
        self.use_tools = use_tools
        self.max_output_chars = max_output_chars  # as in evaluation: one view of tool output
        self.logger = logger if dist is None or dist.is_main else None
        self.variant = variant
        self.seed = seed
        self.dist = dist
        self.shard = dist.shard if dist is not None else Shard()
        params = {}
        if cfg.reward == "composite":
            params = dict(
                alpha=cfg.composite_alpha, beta=cfg.composite_beta, r_max=cfg.composite_max
            )
        reward = make_reward(cfg.reward, **params)
        self.reward_fn = reward_fn or (lambda t: reward(bool(t.meta["correct"]), tool_stats(t)))
        self.protocol = get_protocol("cir_fences", cfg.boundary)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
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
        self.pending: dict[int, list[Trajectory]] = {}  # finished members of unfinished groups
        self.restart: list[dict] = []  # metas of carried trajectories a resume must restart

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
            bar.set_postfix(  # a step may train on nothing (all groups dropped or carried)
                acc=f"{metrics.get('train/accuracy', float('nan')):.2f}",
                calls=f"{metrics.get('tools/calls_mean', float('nan')):.2f}",
            )
            every = self.cfg.checkpoint_every
            if checkpoint_dir is not None and every and self.state.step % every == 0:
                self.save_checkpoint(checkpoint_dir)
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
        return [
            {"task": i, "seed": trajectory_seed(self.seed, i, j)}
            for i in range(first + self.shard.rank, first + n, self.shard.world)
            for j in range(self.cfg.group_size)
        ]

    def score(self, trajs: list[Trajectory]) -> None:
        for traj in trajs:
            score(traj, self.task_at(traj.meta["task"]))

    async def sample_groups(self, n: int, settings: RolloutSettings) -> list[list[Trajectory]]:
        """`n` fresh tasks, `group_size` scored trajectories each. Under torch.distributed each
        rank samples every world-th group and all ranks get all groups. With partial
        rollouts, the groups whose last member finished in this step, whenever they began."""
        metas = self.new_metas(n)
        prompts = [prompt_for(self.task_at(m["task"])) for m in metas]
        if self.pool is not None:
            return await self.sample_partial(prompts, metas, settings)
        trajs = await self.rollout.run_many(prompts, settings, metas)
        self.score(trajs)
        g_size = self.cfg.group_size
        groups = [trajs[k : k + g_size] for k in range(0, len(trajs), g_size)]
        return gather_in_order(groups, self.dist, n)

    async def sample_partial(
        self, prompts: list[str], metas: list[dict], settings: RolloutSettings
    ) -> list[list[Trajectory]]:
        restart, self.restart = self.restart, []
        prompts += [prompt_for(self.task_at(m["task"])) for m in restart]
        finished = await self.pool.step(prompts, settings, self.state.step, metas + restart)
        self.score(finished)
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

    async def collect(self, settings: RolloutSettings) -> tuple[list[list[Trajectory]], dict]:
        """The step's groups, with AgentMath's adaptive batch construction when it is on."""
        cfg = self.cfg
        kept: list[list[Trajectory]] = []
        sampled = dropped = rounds = failed = 0
        while True:
            groups = await self.sample_groups(cfg.prompts_per_step - len(kept), settings)
            sampled += len(groups)
            for group in groups:
                # A trajectory the engine or sandbox failed says nothing about the policy.
                ok = [t for t in group if t.finish_reason not in FAILED]
                failed += len(group) - len(ok)
                group = ok
                if not group:
                    dropped += 1
                    continue
                rewards = self.rewards_of(group, settings.max_model_tokens)
                if cfg.adaptive_batch and bool((rewards == rewards[0]).all()):
                    dropped += 1
                else:
                    kept.append(group)
            if not cfg.adaptive_batch or len(kept) >= cfg.prompts_per_step:
                break
            if rounds == cfg.max_refill_rounds:
                break
            rounds += 1
        stats = {
            "batch/groups_sampled": sampled,
            "batch/groups_dropped": dropped,
            "batch/refill_rounds": rounds,
            "batch/fill": len(kept) / cfg.prompts_per_step,
            "rollout/failed": failed,
        }
        return kept, stats

    async def step(self) -> dict:
        start = time.perf_counter()
        cfg = self.cfg
        max_tokens, budget = self.limits()
        settings = RolloutSettings(
            max_model_tokens=max_tokens,
            tool_budget=budget,
            temperature=cfg.temperature,
            use_tools=self.use_tools,
            max_output_chars=self.max_output_chars,
            protocol=self.protocol,
            segment_tokens=cfg.segment_tokens or None,
            segment_tool_calls=cfg.segment_tool_calls or None,
        )
        kept, batch_stats = await self.collect(settings)
        if self.pool is not None:
            batch_stats.update(self.pool.stats())
        rollout_s = time.perf_counter() - start
        trajs = [t for group in kept for t in group]
        metrics: dict = {"variant": self.variant, "phase": "rl", "step": self.state.step}
        metrics.update(batch_stats)
        if trajs:
            metrics.update(self.rollout_metrics(trajs, max_tokens, budget))
            metrics.update(self.update(trajs, max_tokens))
        truncation = metrics.get("train/truncation_rate", 0.0)
        if cfg.stages and truncation > cfg.expansion_threshold:
            self.state.stage = min(self.state.stage + 1, len(cfg.stages) - 1)
        self.state.step += 1
        metrics["rl/stage"] = self.state.stage
        metrics["time/rollout_s"] = rollout_s
        metrics["time/step_s"] = time.perf_counter() - start
        if self.logger is not None:
            self.logger.log(metrics)
        return metrics

    def rollout_metrics(self, trajs: list[Trajectory], max_tokens: int, budget: int) -> dict:
        n = len(trajs)
        return {
            "rl/budget": budget,
            "rl/max_model_tokens": max_tokens,
            "train/reward_mean": float(self.rewards_of(trajs, max_tokens).mean()),
            "train/accuracy": sum(bool(t.meta["correct"]) for t in trajs) / n,
            "train/truncation_rate": sum(is_truncated(t) for t in trajs) / n,
            "length/model_tokens_mean": sum(t.num_model_tokens for t in trajs) / n,
            "length/tool_tokens_mean": sum(t.num_tool_tokens for t in trajs) / n,
            **aggregate_tool_stats([tool_stats(t) for t in trajs]),
        }

    # ------------------------------------------------------------------ the update
    def update(self, trajs: list[Trajectory], max_tokens: int) -> dict:
        cfg = self.cfg
        rewards = self.rewards_of(trajs, max_tokens)
        groups = torch.tensor([t.meta["task"] for t in trajs])
        batch = collate(trajs, self.pad_id, cfg.mask_tool_output).to(self.device)
        token_adv = token_advantages(
            cfg.advantage, rewards, groups, batch.loss_mask.cpu(), gamma=cfg.gamma
        ).to(self.device)  # [B, T-1]
        # Every rank scores the whole batch here, so the numbers match one process exactly;
        # the backward passes below are what is sharded.
        old_logprobs = batch_logprobs(self.model, batch, cfg.micro_batch_size)
        ref_logprobs = None
        if self.reference is not None:
            ref_logprobs = batch_logprobs(self.reference, batch, cfg.micro_batch_size)

        self.model.train()
        per_update: list[dict] = []
        order = torch.randperm(len(trajs))
        for rows in order.chunk(cfg.updates_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            m = minibatch_loss_backward(
                self.model, batch, rows.to(self.device), old_logprobs, token_adv,
                ref_logprobs, cfg, self.shard, norm_len=max_tokens,
            )  # fmt: skip
            m = sum_over_ranks(m, self.dist)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            m["actor/grad_norm"] = grad_norm_value(norm)
            self.optimizer.step()
            self.schedule.step()
            per_update.append(m)
        self.model.eval()
        self.sync_rollout_weights()

        mask = batch.loss_mask
        gap = ((old_logprobs - batch.sampler_logprobs).abs() * mask).sum() / mask.sum().clamp_min(1)
        groups_uniform = uniform_groups(rewards, groups)
        return {
            "train/lr": self.schedule.get_last_lr()[0],
            "train/uniform_group_share": float(groups_uniform.float().mean()),
            "rollout/logprob_gap": float(gap),
            **{k: sum(m[k] for m in per_update) / len(per_update) for k in per_update[0]},
        }

    def sync_rollout_weights(self) -> None:
        """Copy the updated policy into the rollout engine's model when that is a separate
        copy (always under FSDP: every rank samples with a full copy; the shards are gathered,
        a collective every rank calls)."""
        engine_model = getattr(self.rollout.engine, "model", None) if self.rollout else None
        if engine_model is None or engine_model is self.model:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True)
        engine_model.load_state_dict(get_model_state_dict(self.model, options=options))

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

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
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
                "config": dataclasses.asdict(self.cfg),
            }
            tmp = path.with_suffix(".tmp")
            torch.save(payload, tmp)
            tmp.replace(path)  # a run killed while saving keeps the previous checkpoint
        return path

    def load_checkpoint(self, directory: Path) -> None:
        """Restore everything `save_checkpoint` wrote; the next step is the one after it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        path = Path(directory) / "trainer.pt"
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {path}")
        payload = torch.load(path, map_location="cpu", weights_only=False)
        # set_state_dict builds the optimizer's state by a zero step, which it skips when
        # gradients are present (e.g. left by an earlier run of the same model object).
        self.model.zero_grad(set_to_none=True)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
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
        self.sync_rollout_weights()
