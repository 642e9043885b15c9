"""One episode of a tirl task as an OpenEnv `Environment` (openenv-core 0.3.0).

An episode is one task and the model's messages about it:

- `reset(seed=i)` picks task i (mod the `tasks` setting) of the source's split
  (`TaskSource.item(split, i)`: the same seed gives the same task, so every sample of a GRPO
  group can ask for the same episode; without a seed the server hands out the next index). Its observation carries the problem
  and the system prompt that explains the run's protocol (`tirl.tasks.prompts`).
- `step(TirlAction(message=...))` with closed code blocks in the message (the protocol's,
  by default CIR's ```` ```python ````; ```` ```bash ```` too with `tools: [python, shell]`)
  runs each with its tool (`tirl.tools`, the rollout's own path), in order, in the episode's
  sandbox session (opened at the first block and kept, so a variable of one step is there in
  the next) and returns what the model would see: each result through tirl's one formatter,
  rendered by the protocol (```` ```output ```` fences). A block for a tool the settings do
  not enable gets one line and is not run. The episode goes on, reward None.
- A message without a closed block is the final answer: the task's own scorer reads the prose
  of all the episode's messages, exactly as tirl scores a trajectory (`prose_text`: no tool
  output, not the inside of code blocks), and the episode ends with reward = the scorer's
  reward in [0, 1] (partial credit where the RACES operator gives it).
- More code blocks in an episode than `max_tool_calls` end it at once with reward 0 (none of
  that message's blocks runs).

Each WebSocket session of the OpenEnv server gets its own `TirlEnvironment` (so its own
episode and sandbox session); they share the server's one task source and one sandbox.
The sandbox session closes when the episode ends, on the next reset and on `close`, and at
once when the client disconnects mid-step (the step is cut: one line on stderr).

OpenEnv 0.3.0 sends only an observation's own fields over the wire (not `metadata`), so the
score is in fields (`correct`, `reason`, `predicted`) as well as in `metadata`. Its HTTP
`/reset` and `/step` make a fresh environment per request: episodes need the WebSocket
(`TirlEnvClient`).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

from tirl.integrations.openenv.settings import (
    CLIENT_GONE,
    ClientGone,
    EpisodeError,
    OpenEnvSettings,
)
from tirl.protocol import Protocol, get_protocol
from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.rewards.answer import prose_text
from tirl.sandbox import SandboxClient, SessionBase
from tirl.sandbox.config import make_sandbox
from tirl.tasks.base import SPLITS, Score, Task, TaskSource
from tirl.tasks.prompts import default_system_prompt
from tirl.tools import TOOLS, ToolContext, disabled_message, toolset_protocol


class TirlAction(Action):
    """The model's message: text, with or without code blocks."""

    message: str = Field(..., description="the model's message (code blocks, or the answer)")


class TirlObservation(Observation):
    """What the model is shown next, and how the episode stands."""

    text: str = Field("", description="the text to show the model: the problem, or tool output")
    system_prompt: str = Field("", description="how to write code and the answer (at reset)")
    task_id: str = Field("", description="the task of the episode")
    outputs: list[str] = Field(default_factory=list, description="each block's formatted output")
    statuses: list[str] = Field(default_factory=list, description="each block's sandbox status")
    tool_calls: int = Field(0, description="code blocks run in the episode so far")
    correct: bool | None = Field(None, description="the scorer's verdict (at the end)")
    reason: str = Field("", description="why the episode ended as it did")
    predicted: str | None = Field(None, description="the answer the scorer read")


class TirlState(State):
    """The episode's id and step count (OpenEnv's), its task and its tool calls."""

    task_id: str = ""
    split: str = ""
    tool_calls: int = 0
    done: bool = False


class Shared:
    """What every session of one server shares: the task source, the settings, one sandbox
    (started on the first code block, in the server's event loop) and the next unseeded index."""

    def __init__(self, source: TaskSource, settings: OpenEnvSettings) -> None:
        self.source = source
        self.settings = settings
        self.protocol: Protocol = toolset_protocol(get_protocol(settings.protocol), settings.tools)
        self.system_prompt = default_system_prompt(self.protocol)
        self._sandbox: SandboxClient | None = None
        self._starting: asyncio.Lock | None = None
        self._next_index = itertools.count()

    def next_index(self) -> int:
        return next(self._next_index)

    async def session(self) -> SessionBase:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._sandbox is None:
                sandbox = make_sandbox(self.settings.sandbox)
                await sandbox.start()
                self._sandbox = sandbox
        return await self._sandbox.session()

    async def close(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()


def closed_calls(protocol: Protocol, message: str) -> list[tuple[str, str]]:
    """(tool, code) of every closed block of `message`, in order (the protocol's exact match)."""
    calls, rest = [], message
    while (call := protocol.closed_call(rest)) is not None:
        calls.append(call)
        b = protocol.block_for(call[0])
        block = b.open + call[1] + b.close
        rest = rest[rest.index(block) + len(block) :]
    return calls


def _seed_index(seed: Any) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EpisodeError(f"reset: seed must be an integer >= 0 (the task's index), got {seed!r}")
    return seed


class TirlEnvironment(Environment[TirlAction, TirlObservation, TirlState]):
    """One session's episodes (see the module doc). Async: every call runs in the server's
    event loop, where the sandbox lives; the RACES search must run in the main thread (it times
    its steps with SIGALRM), which the server's loop is."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, shared: Shared) -> None:
        super().__init__()
        self.shared = shared
        self._task: Task | None = None
        self._messages: list[str] = []
        self._session: SessionBase | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = TirlState()

    # ------------------------------------------------------------------ OpenEnv's interface

    def reset(self, seed=None, episode_id=None, **kwargs) -> TirlObservation:
        raise EpisodeError("this environment is asynchronous: the server calls reset_async")

    def step(self, action, timeout_s=None, **kwargs) -> TirlObservation:
        raise EpisodeError("this environment is asynchronous: the server calls step_async")

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        split: str | None = None,
        **kwargs: Any,
    ) -> TirlObservation:
        """A new episode on task `seed` of `split` (default: the settings' split)."""
        if kwargs:
            raise EpisodeError(
                f"reset: unknown parameter {sorted(kwargs)[0]!r}; reset takes seed, episode_id"
                " and split"
            )
        split = self.shared.settings.split if split is None else split
        if split not in SPLITS:
            raise EpisodeError(f"reset: split must be one of {', '.join(SPLITS)}, got {split!r}")
        index = _seed_index(seed)
        if episode_id is not None and not isinstance(episode_id, str):
            raise EpisodeError(f"reset: episode_id must be a string, got {episode_id!r}")
        await self._end_session()
        index = self.shared.next_index() if index is None else index
        index %= self.shared.settings.tasks
        task = self.shared.source.item(split, index)
        self._task, self._messages = task, []
        self._state = TirlState(
            episode_id=episode_id or str(uuid.uuid4()), task_id=task.id, split=split
        )
        return TirlObservation(
            text=task.problem,
            system_prompt=self.shared.system_prompt,
            task_id=task.id,
            metadata={"index": index, "split": split, "source": task.source},
        )

    async def step_async(
        self, action: TirlAction, timeout_s: float | None = None, **kwargs: Any
    ) -> TirlObservation:
        """Run the message's code blocks, or score it as the final answer."""
        if self._task is None:
            raise EpisodeError("step: no episode yet; call reset first")
        if self._state.done:
            raise EpisodeError(f"step: episode {self._state.episode_id} is over; call reset")
        protocol = self.shared.protocol
        blocks = closed_calls(protocol, action.message)
        limit = self.shared.settings.max_tool_calls
        if not blocks or self._state.tool_calls + len(blocks) > limit:
            self._state.step_count += 1
            self._messages.append(action.message)
        if not blocks:
            return await self._finish(self._score())
        if self._state.tool_calls + len(blocks) > limit:
            reason = (
                f"tool-call limit: this message has {len(blocks)} code block(s) after"
                f" {self._state.tool_calls} run, and an episode may run {limit}"
            )
            return await self._finish(Score(0.0, False, reason))
        outputs, statuses = [], []
        ctx = ToolContext(self._open_session, self.shared.settings.sandbox.max_output_chars)
        for tool, code in blocks:
            if tool not in protocol.enabled_tools:  # answered in one line, not run or counted
                outputs.append(disabled_message(tool, protocol.enabled_tools))
                statuses.append("disabled")
                continue
            # the rollout's own path (tirl.tools)
            result = await self._unless_client_goes(TOOLS[tool].run(code, ctx))
            outputs.append(result.output)
            statuses.append(result.status)
            self._state.tool_calls += 1
        # Counted once its blocks have run: a sandbox that fails to start leaves the episode as
        # it was, so the same message can be sent again.
        self._state.step_count += 1
        self._messages.append(action.message)
        return TirlObservation(
            text="".join(protocol.render_output(out) for out in outputs),
            task_id=self._task.id,
            outputs=outputs,
            statuses=statuses,
            tool_calls=self._state.tool_calls,
        )

    async def _unless_client_goes(self, work):
        """Await `work`, or, if the connection's client disconnects first, cut it, close the
        episode's sandbox session at once and raise ClientGone. Without this the step would
        run to its end (a cell up to its timeout) for nobody, holding the session's slot."""
        gone = CLIENT_GONE.get()
        if gone is None:  # not under the server's middleware (a test, HTTP)
            return await work
        running, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone.wait())
        try:
            done, _ = await asyncio.wait({running, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not running.done():
                running.cancel()  # the client went (or this step itself was cancelled)
        if running in done:
            return running.result()
        await asyncio.wait({running})  # its cancellation ends before the session closes
        await self._end_session()
        print(
            f"tirl openenv: the client of episode {self._state.episode_id} went away mid-step;"
            " the step was cut and its sandbox session closed",
            file=sys.stderr,
            flush=True,
        )
        raise ClientGone("the client went away mid-step")

    async def _open_session(self) -> SessionBase:
        """The episode's sandbox session, opened at its first block."""
        if self._session is None:
            self._session = await self.shared.session()
            self._loop = asyncio.get_running_loop()
        return self._session

    @property
    def state(self) -> TirlState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        source = getattr(self.shared.source, "name", type(self.shared.source).__name__)
        return EnvironmentMetadata(
            name=f"tirl-{source}",
            description=f"tirl task source {source!r}: code blocks run in a tirl sandbox session",
        )

    def close(self) -> None:
        """End the episode's sandbox session. OpenEnv calls this from a worker thread (or, for
        its one-request HTTP environments, from the event loop itself), so the close is handed
        to the loop the session lives in."""
        session, loop, self._session = self._session, self._loop, None
        if session is None or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(session.close())
        else:
            asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=30)

    # ------------------------------------------------------------------ helpers

    def _score(self) -> Score:
        """The task's scorer on the prose of all the episode's messages, as tirl scores a
        trajectory (`tirl.tasks.scoring`)."""
        model = [Segment(SegmentKind.MODEL, [], text=m) for m in self._messages]
        return self._task.score(prose_text(Trajectory(segments=model)))

    async def _finish(self, score: Score) -> TirlObservation:
        self._state.done = True
        await self._end_session()
        reward = float(score.reward)
        return TirlObservation(
            done=True,
            reward=reward,
            task_id=self._task.id,
            tool_calls=self._state.tool_calls,
            correct=bool(score.correct),
            reason=score.reason,
            predicted=score.predicted,
            metadata={"correct": bool(score.correct), "reason": score.reason},
        )

    async def _end_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
