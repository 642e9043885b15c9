"""The RL trainer's rollout feed: groups sampled from the engine and scored, batched by the
batch rule, with the curriculum, partial rollouts and adaptive batches that decide what is
sampled next. It trains nothing and never touches the weights (`tirl.train.rl` does).

Each trajectory is seeded by its task index and sample number, so what is sampled does not
depend on scheduling or on the number of ranks. It is scored once, as it finishes, by its own
task (`Task.score` on the model's text, `tirl.tasks.scoring`), and rewarded (`rl.reward`: CIR's
+1 / -1, AgentMath's composite, or `task`: the scorer's reward in [0, 1], RACES's partial
credit), minus DAPO's overlong penalty if on; the reward is kept in `meta["reward"]`.

The batch rule: an update trains on exactly `prompts_per_step` usable groups, never fewer
and never more. A group is usable when some member did not fail (finish_reason "error" or
"cancelled": an engine or sandbox failure says nothing about the policy, so failed members
are left out and counted in `rollout/failed`) and, with `adaptive_batch` (AgentMath §3.2),
when its rewards are not all equal (no group-relative signal). A step samples in rounds: the
first, then, with `adaptive_batch`, up to `max_refill_rounds` refill rounds, each starting only
as many new tasks as the batch still lacks (no oversampling, so no surplus group is ever thrown
away). `max_refill_rounds` is thus the cap on extra sampling per step. When the rounds end
short of a full batch the step does not update (`train/updated` 0, `batch/cap_hit` 1): the
usable groups found so far wait for the next step, where the refill starts from them. They are
still exactly on-policy, because the weights did not change (they keep the reward they were
scored with, should the stage or tool budget move meanwhile).

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
grows without bound. Unfinished trajectories cannot be saved mid-sample (their sandbox
sessions die with the process): a checkpoint names them and they restart from their prompts
after a resume, so that resume is not exact.

Curriculum (`rl.curriculum`, `tirl.train.curriculum`): task position i is then the
curriculum's draw rather than the stream's i-th item. Every position a round starts is drawn
when it starts (on every rank alike), and every finished group's pass rate (its correct share,
failed members aside) is fed back as the group completes, so later rounds and steps draw from
the buckets whose rate is in the target band. Off, the stream is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tirl.algos.overlong import overlong_penalty
from tirl.config import ConfigError
from tirl.protocol.segments import Trajectory
from tirl.rewards.reward import configured_reward
from tirl.rollout.limits import is_truncated
from tirl.rollout.partial import PartialRolloutPool
from tirl.rollout.runner import Rollout, RolloutSettings, trajectory_seed
from tirl.run.config import RLConfig
from tirl.tasks.base import Task
from tirl.tasks.prompts import PLAIN_TEMPLATE
from tirl.tasks.scoring import score_trajectory
from tirl.train.curriculum import Curriculum
from tirl.train.distributed import DistContext, gather_in_order
from tirl.train.update import Shard

FAILED = ("error", "cancelled")  # finish reasons of trajectories left out of training
TaskAt = Callable[[int], Task]  # the i-th training task; positions make runs resumable
PromptOf = Callable[[Task], Sequence[int] | str]  # a task's prompt: token ids (or plain text)
Group = list[Trajectory]  # the scored samples of one task


def plain_prompt(task: Task) -> str:
    """The plain prompt text of `task` (no chat template), as `PromptRenderer` writes it."""
    return PLAIN_TEMPLATE.format(problem=task.problem)


def _prompt(prompt: Sequence[int] | str) -> list[int] | str:
    return prompt if isinstance(prompt, str) else list(prompt)


def reward_from_config(cfg: RLConfig) -> Callable[[Trajectory], float]:
    """The reward `rl.reward` names with the parameters the config gives it
    (`tirl.rewards.reward.configured_reward`), as a function of a scored trajectory."""
    return configured_reward(cfg.reward, cfg.reward_kwargs())


def tasks_to_start(prompts_per_step: int, waiting: int, in_flight: int | None) -> int:
    """New tasks for one sampling round (see the module docstring): the batch's shortfall,
    and with partial rollouts (`in_flight` not None) no more than keeps
    2 * `prompts_per_step` groups open (waiting + in flight)."""
    shortfall = max(0, prompts_per_step - waiting)
    if in_flight is None:
        return shortfall
    return max(0, min(shortfall, 2 * prompts_per_step - waiting - in_flight))


class RolloutFeed:
    """Sampled, scored groups for the trainer, `prompts_per_step` at a time (`collect`).

    `task_at(i)` is the i-th training task, asked as `prompt_of(task)` (its prompt ids from
    `tirl.tasks.prompts.PromptRenderer`; default: the plain prompt text). `reward_fn` replaces
    the configured reward (`rl.reward`); it is called once per trajectory, when it finishes
    (failed ones excluded), and trajectories carry `meta["task"]` (the task's index),
    `meta["seed"]`, the task's `task_id` and `score` and their real `finish_reason`."""

    def __init__(
        self,
        rollout: Rollout | None,
        task_at: TaskAt | None,
        cfg: RLConfig,
        *,
        prompt_of: PromptOf | None = None,
        seed: int = 0,
        dist: DistContext | None = None,
        reward_fn: Callable[[Trajectory], float] | None = None,
    ) -> None:
        self.rollout = rollout
        # With `rl.curriculum` on, position i is the curriculum's draw, not the stream's i-th.
        self.curriculum = (
            Curriculum(task_at, cfg.curriculum, seed) if cfg.curriculum.enabled else None
        )
        self.task_at = self.curriculum.task_at if self.curriculum is not None else task_at
        self.prompt_of = prompt_of or plain_prompt
        self.cfg = cfg
        self.seed = seed
        self.dist = dist
        self.shard = dist.shard if dist is not None else Shard()
        self.reward_fn = reward_fn or reward_from_config(cfg)
        self.pool = None  # partial rollouts: unfinished trajectories carried across steps
        if cfg.segment_tokens or cfg.segment_tool_calls:
            if dist is not None:
                raise ConfigError(
                    "rl.segment_tokens / segment_tool_calls (partial rollouts) do not run"
                    " under torch.distributed yet"
                )
            self.pool = PartialRolloutPool(rollout, max_staleness=cfg.max_staleness)
        self.next_task = 0  # position in the task stream
        self.pending: dict[int, Group] = {}  # finished members of unfinished groups
        self.restart: list[dict] = []  # metas of carried trajectories a resume must restart
        # Complete usable groups not trained on yet, oldest task first: a step short of a
        # full batch leaves them here, and with partial rollouts so does a surplus.
        self.ready: list[Group] = []

    async def collect(
        self, settings: RolloutSettings, step: int, policy_version: int
    ) -> tuple[list[Group], dict]:
        """The step's batch by the batch rule of the module docstring: `prompts_per_step`
        usable groups, or none when the sampling rounds end short of them; and the step's
        `batch/` statistics. `step` is the step's number (the partial-rollout pool's version);
        `policy_version` the updates in the engine's weights (`meta["policy_version"]`)."""
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
            groups = await self.sample_groups(n, settings, step, policy_version)
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
        if self.pool is not None:
            stats.update(self.pool.stats())
        return batch, stats

    def new_metas(self, n: int) -> list[dict]:
        """Metas of the next `n` tasks' trajectories (this rank's share of them)."""
        first = self.next_task
        self.next_task += n
        if self.curriculum is not None:  # every rank draws every position, in order
            self.curriculum.assign(first + n)
        return [
            {"task": i, "seed": trajectory_seed(self.seed, i, j)}
            for i in range(first + self.shard.rank, first + n, self.shard.world)
            for j in range(self.cfg.group_size)
        ]

    def score(self, trajs: list[Trajectory], max_tokens: int, policy_version: int) -> None:
        """Correctness and, for those that did not fail, `meta["reward"]`: computed once, as a
        trajectory finishes, under the limit it was sampled with (or the reward an agent
        program posted to the gateway, `meta["posted_reward"]`). The batch rule and the
        update then read the same number, even when a group waits for a later step whose
        limit (and so overlong penalty) differs."""
        for traj in trajs:
            score_trajectory(traj, self.task_at(traj.meta["task"]))
            traj.meta.setdefault("policy_version", policy_version)
        ok = [t for t in trajs if t.finish_reason not in FAILED]
        if ok:
            for traj, reward in zip(ok, self.rewards_of(ok, max_tokens).tolist()):
                # an agent program's own reward, posted to the gateway (tirl.apps.agents)
                traj.meta["reward"] = traj.meta.get("posted_reward", reward)

    def rewards_of(self, trajs: list[Trajectory], max_tokens: int) -> torch.Tensor:
        """[B] rewards of scored trajectories sampled under the model-token limit `max_tokens`."""
        rewards = torch.tensor([self.reward_fn(t) for t in trajs], dtype=torch.float)
        if self.cfg.overlong_buffer > 0:
            lengths = torch.tensor([t.num_model_tokens for t in trajs])
            rewards = rewards + overlong_penalty(
                lengths, max_tokens, self.cfg.overlong_buffer, self.cfg.overlong_penalty
            )
        return rewards

    async def sample_groups(
        self, n: int, settings: RolloutSettings, step: int, policy_version: int
    ) -> list[Group]:
        """`n` fresh tasks, `group_size` scored trajectories each. Under torch.distributed each
        rank samples every world-th group and all ranks get all groups. With partial
        rollouts, the groups whose last member finished in this step, whenever they began."""
        metas = self.new_metas(n)
        prompts = [_prompt(self.prompt_of(self.task_at(m["task"]))) for m in metas]
        if self.pool is not None:
            restart, self.restart = self.restart, []
            prompts += [_prompt(self.prompt_of(self.task_at(m["task"]))) for m in restart]
            finished = await self.pool.step(prompts, settings, step, metas + restart)
            self.score(finished, settings.max_model_tokens, policy_version)
            for traj in finished:
                self.pending.setdefault(traj.meta["task"], []).append(traj)
            size = self.cfg.group_size
            done = sorted(t for t, members in self.pending.items() if len(members) == size)
            return [sorted(self.pending.pop(t), key=lambda x: x.meta["seed"]) for t in done]
        trajs = await self.rollout.run_many(prompts, settings, metas)
        self.score(trajs, settings.max_model_tokens, policy_version)
        g_size = self.cfg.group_size
        groups = [trajs[k : k + g_size] for k in range(0, len(trajs), g_size)]
        return gather_in_order(groups, self.dist, n)

    def carried_metas(self) -> list[dict]:
        """Metas (task, seed) of the trajectories carried to the next step, and of those still
        to restart."""
        carried = self.pool.carried if self.pool is not None else []
        keep = ("task", "seed")
        metas = [{k: c.trajectory.meta[k] for k in keep} for c in carried]
        return metas + self.restart

    def groups_in_flight(self) -> int | None:
        """Groups with a member still sampling (partial rollouts; None without them): carried
        to the next step, to restart after a resume, or finished and waiting for the rest."""
        if self.pool is None:
            return None
        return len({m["task"] for m in self.carried_metas()} | set(self.pending))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The feed's part of the trainer's checkpoint (`tirl.train.checkpoint`)."""
        state = {
            "next_task": self.next_task,
            # Partial rollouts: finished members of open groups are kept; carried ones
            # restart from their prompts after a resume (their sessions die with us).
            "pending": {t: [x.to_dict() for x in xs] for t, xs in self.pending.items()},
            "restart": self.carried_metas(),
            # Usable groups waiting for the next update: on-policy, so a resume trains
            # on exactly what the uninterrupted run would have.
            "ready": [[x.to_dict() for x in group] for group in self.ready],
        }
        if self.curriculum is not None:  # the draws so far and the rates behind the next
            state["curriculum"] = self.curriculum.state_dict()
        return state

    def load_state_dict(self, state: dict, path: Path) -> None:
        """Restore what `state_dict` returned, read from the checkpoint at `path`."""
        self.next_task = state["next_task"]
        self.pending = {
            t: [Trajectory.from_dict(x) for x in xs] for t, xs in state["pending"].items()
        }
        self.restart = state["restart"]
        ready = state.get("ready", [])  # absent from checkpoints written before it was kept
        self.ready = [[Trajectory.from_dict(x) for x in group] for group in ready]
        if self.curriculum is not None:
            if "curriculum" not in state:
                raise ConfigError(
                    f"rl.curriculum.enabled: the checkpoint {path} was written without the"
                    " curriculum; resume with it off, or delete the folder to start RL over",
                    "rl.curriculum.enabled",
                )
            self.curriculum.load_state_dict(state["curriculum"])
