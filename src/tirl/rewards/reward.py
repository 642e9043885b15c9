"""Outcome rewards: map "was the final answer correct" (and, for shaping, the trajectory's tool
statistics) to a scalar.

Every reward is a `Reward`: called as `reward(correct, stats, task_reward=...)` with `stats`
from `tirl.rewards.toolstats.tool_stats` and `task_reward` the task scorer's own reward in
[0, 1] (`tirl.tasks.Score.reward`, when the caller has one). It declares its `range` so
downstream code (normalization, plots, dynamic sampling's "all correct / all wrong" test) need
not hard-code it.
Rewards are registered by name (`@register_reward("binary")` on a class whose constructor
takes the reward's parameters), so the trainer builds one from `rl.reward` and its
parameters (`rl.reward_params`; for `composite`, `rl.composite_alpha/beta/max`), and
`configured_reward` makes it a function of a scored trajectory for the trainer and the verl
plugin alike.

- `binary`: CIR §3.1, +1 if correct else −1.
- `zero_one`: 1 if correct else 0 (most math-RL setups).
- `task`: the task scorer's reward in [0, 1] (partial credit where the task gives it, e.g.
  RACES's SEQUENTIAL and PARALLEL operators); 1 / 0 by correctness when there is none.
- `composite`: AgentMath's R_total = R_acc + 1[R_acc = 1] · R_tool with
  R_tool = min(R_max, α + β · N_code) (papers/002, "复合奖励"), where R_acc ∈ {0, 1} is the
  equivalence verdict and N_code the number of executed code blocks. The bonus applies only to a
  correct answer, so writing code never pays by itself. The write-up gives no values for α, β
  and R_max; the defaults here (0, 0.05, 0.2) are ours, chosen so the bonus stays below the gap
  between a wrong and a right answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tirl.protocol.segments import Trajectory
from tirl.registry import Registry
from tirl.rewards.toolstats import tool_stats


class Reward(Protocol):
    range: tuple[float, float]

    def __call__(
        self,
        correct: bool,
        stats: dict[str, Any] | None = None,
        task_reward: float | None = None,
    ) -> float: ...


# name -> the reward's class; its constructor takes the parameters
REWARDS: Registry[type] = Registry("reward", entry_type=type)

# Class decorator: register a reward class under a name.
register_reward = REWARDS.register


@dataclass(frozen=True)
class _OutcomeReward:
    """range[1] if correct, else range[0]."""

    range: tuple[float, float]

    def __call__(
        self,
        correct: bool,
        stats: dict[str, Any] | None = None,
        task_reward: float | None = None,
    ) -> float:
        return self.range[1] if correct else self.range[0]


@register_reward("binary")
@dataclass(frozen=True)
class BinaryReward(_OutcomeReward):
    """+1.0 if correct, else −1.0 (CIR §3.1)."""

    range: tuple[float, float] = (-1.0, 1.0)


@register_reward("zero_one")
@dataclass(frozen=True)
class ZeroOneReward(_OutcomeReward):
    """1.0 if correct, else 0.0."""

    range: tuple[float, float] = (0.0, 1.0)


@register_reward("task")
@dataclass(frozen=True)
class TaskReward:
    """The task scorer's own reward in [0, 1]; without one, 1.0 if correct, else 0.0."""

    range: tuple[float, float] = (0.0, 1.0)

    def __call__(
        self,
        correct: bool,
        stats: dict[str, Any] | None = None,
        task_reward: float | None = None,
    ) -> float:
        return float(correct) if task_reward is None else float(task_reward)


@register_reward("composite")
@dataclass(frozen=True)
class CompositeReward:
    """R_total = R_acc + 1[R_acc = 1] · min(R_max, α + β · N_code) (AgentMath).

    N_code is `stats["num_calls"]`: the code blocks that were executed (a block refused because
    the tool budget was spent is not a call). β must be non-negative (the bonus grows with code
    use, up to R_max), so R_total lies in {0} ∪ [1 + min(α, R_max), 1 + R_max].
    """

    alpha: float = 0.0
    beta: float = 0.05
    r_max: float = 0.2

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"composite reward: beta must be >= 0, got {self.beta}")

    @property
    def range(self) -> tuple[float, float]:
        low_correct = 1.0 + min(self.alpha, self.r_max)
        return min(0.0, low_correct), 1.0 + self.r_max

    def __call__(
        self,
        correct: bool,
        stats: dict[str, Any] | None = None,
        task_reward: float | None = None,
    ) -> float:
        if not correct:
            return 0.0
        n_code = (stats or {}).get("num_calls", 0)
        return 1.0 + min(self.r_max, self.alpha + self.beta * n_code)


def make_reward(name: str, **params: float) -> Reward:
    """The reward called `name` with its parameters; ValueError naming the valid choices."""
    try:
        cls = REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; valid: {', '.join(sorted(REWARDS))}") from None
    try:
        return cls(**params)
    except TypeError:
        raise ValueError(f"reward {name!r} takes no parameters {sorted(params)}") from None


def configured_reward(name: str, params: Mapping[str, Any]) -> Callable[[Trajectory], float]:
    """The reward called `name` with its parameters `params` (`rl.reward` and what the run's
    config gives it: `tirl.run.config.RLConfig.reward_kwargs`), as a function of a scored
    trajectory: its correctness (`traj.correct`), its tool statistics and its task's own
    reward in [0, 1] (`traj.score.reward`; `task` pays that: partial credit where the task
    gives it). Plain values in, so the trainer and the verl plugin share it without this
    layer reading a training config."""
    reward = make_reward(name, **params)
    return lambda t: reward(t.correct, tool_stats(t), task_reward=_task_reward(t))


def _task_reward(traj: Trajectory) -> float | None:
    return None if traj.score is None else traj.score.reward
