"""Partial rollouts across training steps, with a staleness bound (AgentMath §3, AReaL).

`PartialRolloutPool.step(new_prompts, settings, policy_version)` runs one rollout phase: it
resumes every trajectory carried from earlier steps and starts the new prompts, all at once,
each for one segment (`RolloutSettings.segment_tokens` / `segment_tool_calls`). It returns
the trajectories that finished in this step (carried ones first, then new ones, each group in
order) and keeps the unfinished ones, with their live sandbox sessions, for the next step.

So one trajectory tau = tau^(1) + tau^(2) + ... is sampled by several policy versions; each
model segment records its version (`tirl.rollout.runner.token_policy_versions`), which an
off-policy correction (AReaL's decoupled PPO, TIS) needs.

Staleness rule: at the start of a step under `policy_version` v, a carried trajectory whose
oldest model token was sampled under a version older than v - `max_staleness` is too
off-policy to go on. With `on_stale="restart"` (the default) its session is closed and its
prompt starts again from scratch in this step (same meta, `meta["restarts"]` + 1); with
`on_stale="finish"` it is returned as it is, finish_reason "stale" (truncated, like "length").
Both are counted in `stats()`. `max_staleness=None` disables the bound. A trajectory needs
about ceil(max_model_tokens / segment_tokens) segments, so with "restart" choose
max_staleness >= that number - 1, or long trajectories restart forever.

Each resumed segment re-prefills its whole history (see `tirl.rollout.runner`): the weights
changed, so the engine's KV cache for it is stale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tirl.protocol.segments import Trajectory
from tirl.rollout.runner import PartialRollout, Rollout, RolloutSettings


class PartialRolloutPool:
    """Carries unfinished trajectories of a `Rollout` from one training step to the next."""

    def __init__(
        self, rollout: Rollout, *, max_staleness: int | None = None, on_stale: str = "restart"
    ) -> None:
        if on_stale not in ("restart", "finish"):
            raise ValueError(f'on_stale is "restart" or "finish", not {on_stale!r}')
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        self.rollout = rollout
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.carried: list[PartialRollout] = []
        self._counts = {"started": 0, "resumed": 0, "finished": 0, "restarted": 0, "stale": 0}

    def is_stale(self, partial: PartialRollout, policy_version: int) -> bool:
        oldest = partial.oldest_version
        if self.max_staleness is None or oldest is None:
            return False
        return policy_version - oldest > self.max_staleness

    async def step(
        self,
        prompts: Sequence[str],
        settings: RolloutSettings,
        policy_version: int,
        metas: Sequence[dict] | None = None,
    ) -> list[Trajectory]:
        """One rollout phase under `policy_version`: the finished trajectories, in order."""
        if settings.segment_tokens is None and settings.segment_tool_calls is None:
            raise ValueError("a partial-rollout pool needs segment_tokens or segment_tool_calls")
        self.rollout.policy_version = policy_version
        metas = metas or [{} for _ in prompts]
        carried, self.carried = self.carried, []
        jobs, finished_stale = [], []
        for partial in carried:
            if not self.is_stale(partial, policy_version):
                self._counts["resumed"] += 1
                jobs.append(self.rollout.resume(partial, settings))
                continue
            self._counts["stale"] += 1
            await partial.close()
            traj = partial.trajectory
            if self.on_stale == "finish":
                traj.finish_reason = "stale"
                finished_stale.append(traj)
                continue
            self._counts["restarted"] += 1
            meta = {k: v for k, v in traj.meta.items() if k != "policy_versions"}
            meta["restarts"] = meta.get("restarts", 0) + 1
            jobs.append(self.rollout.start(traj.segments[0].text, settings, meta))
        self._counts["started"] += len(prompts)
        jobs += [self.rollout.start(p, settings, m) for p, m in zip(prompts, metas)]
        results = await asyncio.gather(*jobs)
        self.carried = [r for r in results if isinstance(r, PartialRollout)]
        finished = finished_stale + [r for r in results if isinstance(r, Trajectory)]
        self._counts["finished"] += len(finished)
        return finished

    def stats(self) -> dict[str, int]:
        """Counters since construction, plus how many trajectories are carried now."""
        out = {f"rollout/partial_{k}": v for k, v in self._counts.items()}
        out["rollout/partial_carried"] = len(self.carried)
        return out

    async def aclose(self) -> None:
        """Drop every carried trajectory and close its session."""
        carried, self.carried = self.carried, []
        for partial in carried:
            await partial.close()
