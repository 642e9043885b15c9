"""AgentMath's stage expansion (§3.3) inside verl: one stage board shared by every agent loop.

AgentMath raises the context and tool-call limits a stage at a time (48k -> 72k -> 96k tokens,
48 -> 72 -> 96 calls) whenever the truncation rate of a step exceeds 10%. tirl's own trainer
decides it at the end of each step (`tirl.train.rl`, step 6); under verl the trajectories of a
step run in many `AgentLoopWorker` processes, so their counts go to one board:

- every finished training trajectory reports the policy version it started under (verl's
  `global_steps`), whether it was truncated, and its stage; validation rows do not report;
- a trajectory's stage is `stage_at` over the versions older than its own: one stage up for
  each version whose truncation rate exceeded the threshold, and never below a stage the board
  has seen in use (so a late count cannot move a run back).

A trajectory learns its version only from its first reply, so it reads the board when it starts
(`StageView`: the tallies and the floor), asks its first request for the limit of the stage that
counts every version reported so far (the highest its stage can be), and settles its stage when
the reply's version is in (`tirl.rollout.Rollout`'s `max_model_tokens_now`: a reply past the
settled limit is cut there, as if sampled under it). In verl's synchronous trainer this is
tirl's per-step rule exactly: the trajectories of step s start after every trajectory of step s - 1 reported,
and groups that `algorithm.filter_groups` samples again within step s do not count step s's own
partial tally. Under the fully-async trainer a version may still be reporting when newer
trajectories settle their stage, so a decision can rest on a partial count.

The board is a named Ray actor when the worker runs inside Ray (verl's workers always do; the
workers of a job find the same actor by name), an object in this process otherwise. It is not
in verl's checkpoints: a resumed run starts at `tirl.start_stage` (default 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ACTOR_PREFIX = "tirl-stages"


def stage_at(
    tallies: Mapping[int, tuple[int, int]],
    threshold: float,
    num_stages: int,
    start: int = 0,
    before: int | None = None,
) -> int:
    """The stage after the versions in `tallies` ({version: (truncated, sampled)}) older than
    `before` (all of them when None): starting at `start`, each version whose truncation rate
    truncated / sampled exceeds `threshold` moves the stage up one, to at most the last of
    `num_stages` (AgentMath §3.3; `tirl.train.rl`, step 6)."""
    stage = start
    for version, (truncated, sampled) in tallies.items():
        if (before is None or version < before) and sampled and truncated / sampled > threshold:
            stage += 1
    return min(stage, num_stages - 1)


@dataclass(frozen=True)
class StageView:
    """The board as one trajectory read it when it started."""

    tallies: Mapping[int, tuple[int, int]]
    floor: int  # the highest stage in use so far (at least the start stage)
    threshold: float
    num_stages: int
    start: int

    def stage(self, version: int | None) -> int:
        """The stage of a trajectory started under `version` (None: not known yet, so every
        version reported so far counts)."""
        counted = stage_at(self.tallies, self.threshold, self.num_stages, self.start, version)
        return max(self.floor, counted)


class StageBoard:
    """What the run's trajectories reported: the board's state (a Ray actor's, when shared)."""

    def __init__(self, threshold: float, num_stages: int, start: int = 0) -> None:
        self.threshold = threshold
        self.num_stages = num_stages
        self.start = min(start, num_stages - 1)
        self.floor = self.start
        self.tallies: dict[int, tuple[int, int]] = {}

    def report(self, version: int, truncated: bool, stage: int) -> None:
        cut, sampled = self.tallies.get(version, (0, 0))
        self.tallies[version] = (cut + int(truncated), sampled + 1)
        self.floor = max(self.floor, stage)

    def view(self) -> StageView:
        return StageView(
            dict(self.tallies), self.floor, self.threshold, self.num_stages, self.start
        )


class SharedStages:
    """A process's handle on the run's board: `await view()`, `await report(...)`."""

    def __init__(self, board) -> None:
        self._board = board  # a StageBoard, or a Ray actor handle of one
        self._remote = not isinstance(board, StageBoard)

    async def _call(self, method: str, *args):
        if self._remote:
            return await getattr(self._board, method).remote(*args)
        return getattr(self._board, method)(*args)

    async def view(self) -> StageView:
        return await self._call("view")

    async def report(self, version: int, truncated: bool, stage: int) -> None:
        await self._call("report", version, truncated, stage)


_BOARDS: dict[tuple, SharedStages] = {}


def shared_stages(run_name: str, threshold: float, num_stages: int, start: int = 0):
    """The board of run `run_name`: the named Ray actor `tirl-stages:<run_name>` (made by the
    first worker that asks, found by the others) when Ray is initialized, else this process's
    own. Cached per process and Ray job."""
    import ray

    job = ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    key = (run_name, threshold, num_stages, start, job)
    if key not in _BOARDS:
        if job is None:
            board = StageBoard(threshold, num_stages, start)
        else:
            board = (
                ray.remote(StageBoard)
                .options(name=f"{ACTOR_PREFIX}:{run_name}", get_if_exists=True, num_cpus=0)
                .remote(threshold, num_stages, start)
            )
        _BOARDS[key] = SharedStages(board)
    return _BOARDS[key]
