"""RL through an agent program: `rollout.agent.command` run once per trajectory against the
training gateway (`tirl.apps.gateway`), its calls assembled into the trajectories RL trains on.

`AgentRollout` stands where tirl's own `Rollout` stands in RL's feed (`tirl.train.feed`): it
has the same `run_many(prompts, settings, metas)` and the same `engine`, so the trainer pushes
weights into, pauses and closes the engine as before. For each task of a batch it serves the
gateway over that engine, runs the program `group_size` times (each in a session of its own,
the task's question in TIRL_TASK_PROMPT) and returns one trajectory per run, in the order the
feed asked for them. The feed then scores each by its task (the answer in the model's own
text, as everywhere) unless the program posted a reward, which then counts
(`tirl.train.feed.RolloutFeed.score`); a run that failed (the program exited non-zero or ran
past `rollout.agent.timeout_s`, or its session was refused for leaving its own history) is a
trajectory with finish_reason "error", counted in the step's record and never trained on.

The gateway samples at `settings.temperature` (RL's), whatever the program asks, so the
sampler's log-probs are the policy's at the temperature RL corrects for; `max_tokens` and the
tool budget are the program's own business. The prompt ids the feed rendered are not used:
the program writes its own prompt. Evaluation still samples with tirl's own rollout.

`agent_rollout(rollout, task_at, cfg)` is what `tirl train` hands the pipeline
(`tirl.train.pipeline.Pipeline(agents=...)`): tirl.train does not import apps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tirl.apps.gateway import Gateway, run_agents
from tirl.backends.hf import HFEngine
from tirl.config import ConfigError
from tirl.protocol.segments import Trajectory
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.run.config import RunConfig
from tirl.tasks import Task


class AgentRollout:
    """`Rollout.run_many` by an agent program through the gateway (module doc)."""

    def __init__(
        self,
        rollout: Rollout,
        task_at: Callable[[int], Task],
        command: Sequence[str],
        timeout_s: float,
        concurrency: int,
    ) -> None:
        if not isinstance(rollout.engine, HFEngine):
            raise ConfigError(
                "rollout.agent.command: the gateway serves the hf engine's live policy, not"
                f" {type(rollout.engine).__name__}; set rollout.engine: hf",
                "rollout.agent.command",
            )
        self.rollout = rollout
        self.engine = rollout.engine
        self.tokenizer = rollout.tokenizer
        self.task_at = task_at
        self.command = list(command)
        self.timeout_s = timeout_s
        self.concurrency = concurrency

    async def run_many(
        self, prompts: Sequence[Any], settings: RolloutSettings, metas: Sequence[dict]
    ) -> list[Trajectory]:
        """One trajectory per meta (the feed's task index and seed), by one run of the
        program each; `prompts` are ignored (the program writes its own)."""
        gateway = Gateway(self.engine, self.tokenizer, temperature=settings.temperature)
        tasks = [self.task_at(meta["task"]) for meta in metas]
        async with gateway.serving():
            trajs = await run_agents(
                gateway,
                self.command,
                tasks,
                concurrency=self.concurrency,
                timeout_s=self.timeout_s,
                score=lambda traj, task: 0.0,  # the feed rewards it (a posted reward first)
            )
        for traj, meta in zip(trajs, metas):  # the feed groups and seeds by its own metas
            traj.meta.update(meta)
        return trajs


def agent_rollout(rollout: Rollout, task_at: Callable[[int], Task], cfg: RunConfig):
    """RL's rollout for `cfg.rollout.agent` (module doc)."""
    agent = cfg.rollout.agent
    return AgentRollout(rollout, task_at, agent.command, agent.timeout_s, agent.concurrency)
