"""Drive trajectories: generate -> detect a closed code block -> execute -> append -> go on.

Tools: the rollout runs a closed block with the tool it is for (`tirl.tools`: which tool's
block closed is what the protocol detects), so Python cells and shell scripts share the one
session of the trajectory. A block for a tool the settings do not enable is not run: the model
gets one line (`tirl.tools.disabled_message`, ToolCall.status "disabled"), and the block does
not count against the tool budget. In a call protocol (`tirl.protocol.calls`: the model
calls tools as functions in its chat template's format) the protocol also says which tool a
closed call names, and a call that cannot run (not JSON, no such tool) is answered with one line
(`Protocol.call_error`, ToolCall status "error"); like a failed cell, it counts against the
budget. The protocol is the one written for the rollout's tokenizer (`Protocol.for_tokenizer`:
a call protocol's tool turn as the chat template writes it) and tokenizes the tool segments
(`Protocol.encode_output`).

Every trajectory is its own asyncio task, so one that waits on the sandbox frees its place in
the sampler's batch for the others (request-level scheduling, AgentMath §3). A trajectory
keeps one stateful sandbox session for all its code blocks, opened at its first block.

What the trajectory holds is exactly what the model saw: the prompt ids, the ids the sampler
returned, and the ids of each tool output tokenized on its own (architecture.md invariant 1).
A prompt is text (tokenized without special tokens added) or ids: a chat prompt is passed as
the exact ids of its template (`tirl.tasks.prompts.PromptRenderer.prompt_ids`). Tool output is
tokenized with special-token spellings kept as text (`Protocol.encode_output`), so
code that prints `<|im_end|>` or `<|endoftext|>` cannot end the model's turn.

Scheduling limits (`Rollout(max_generating=, max_tool_calls=, max_trajectories=)`): at most
`max_generating` trajectories have a request at the engine and at most `max_tool_calls` cells
(or session starts) are in flight at the sandbox. The two are separate semaphores, each held
only around its own await, so a trajectory waiting on the sandbox never holds a generation
slot. `max_trajectories` bounds whole trajectories of `run` (and `run_many`): each holds a
sandbox session from its first code block to its end, so this bounds the sessions open at
once; a seeded trajectory samples the same whatever waits beside it.

Partial rollouts (AgentMath §3, AReaL's interruptible generation): with
`RolloutSettings.segment_tokens` (L_seg) and `segment_tool_calls` (T_seg), `start` and `resume`
run one *segment* of a trajectory: it stops once it has sampled L_seg model tokens or run
T_seg code blocks in this segment, and comes back as a `PartialRollout` holding its tokens
and its live sandbox session. `resume` continues it, usually in the next training step under
new weights. The engine's KV cache is always released at the end of a segment and the resumed
segment feeds the whole history again (a re-prefill): the weights have changed, so that cache
is stale (AReaL discards and recomputes it the same way), and keeping it would hold engine
memory through the training step. `run` / `run_many` ignore segment budgets and always finish.
`tirl.rollout.partial.PartialRolloutPool` carries partials across steps with a staleness bound.

Seeds: a trajectory with `meta["seed"]` samples from its own random streams (one per engine
call, derived from the seed and its progress), so the same seed gives the same trajectory
whatever else is in the batch, when its tools return, or how many processes share the work.

Policy versions: every model segment records `Rollout.policy_version` at the time it was
sampled, in `trajectory.meta["policy_versions"]` (one entry per segment, None for prompt and
tool segments); `token_policy_versions(traj)` expands it to one version per id.

Failure isolation: an exception inside one trajectory (a dead engine replica, a sandbox that
cannot start a session, a prompt longer than the model's context) ends that trajectory with
finish_reason "error" and
`meta["error"]`; `Rollout.cancel(rollout_id)` ends one with finish_reason "cancelled". Either
way the others go on. A session whose process dies mid-cell answers Status.KILLED, which the
model sees as tool output like any other failure (ToolCall.status "killed"). An asyncio
cancellation of the task that awaits `run` propagates as usual (after the engine key is
released and the session closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from tirl.backends.engine import PromptTooLongError
from tirl.protocol.fences import CIR_FENCES, Protocol
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.sandbox import Sandbox, SessionBase
from tirl.sandbox.formatter import SHOWN_OUTPUT_CHARS
from tirl.tools import TOOLS, ToolContext, disabled_message, toolset_protocol

BUDGET_SPENT_MESSAGE = "Tool-call budget spent: this code was not run."
NOT_RUN = ("skipped", "disabled")  # ToolCall statuses of blocks that were answered, not run
VERSIONS_KEY = "policy_versions"  # meta key: one policy version per segment (None if not sampled)

Prompt = str | Sequence[int]  # text, or the exact token ids (a chat template's)


def _call_seed(traj: Trajectory) -> dict:
    """`seed=` for the engine when the trajectory has `meta["seed"]`: a fresh sampling stream
    per call, fixed by the trajectory's seed and how far it has got, so that what it samples
    does not depend on batching, scheduling, segment cuts or the number of processes."""
    seed = traj.meta.get("seed")
    return {} if seed is None else {"seed": seed * 100_003 + traj.num_model_tokens}


def trajectory_seed(seed: int, task_index: int, sample: int) -> int:
    """The sampling seed of one trajectory (its `meta["seed"]`): fixed by what it answers (the
    run's seed, the task's index, the sample's number), not by when it runs."""
    return (seed * 1_000_003 + task_index) * 1_009 + sample


@dataclass(frozen=True)
class RolloutSettings:
    """How one trajectory is generated.

    `tool_budget` is the most code blocks that run per trajectory (CIR's interaction budget);
    a block closed after that is answered with `budget_spent_message` (rendered as tool output)
    instead of being run. With `use_tools` False the model is a plain text generator (the
    text-only baseline). `protocol` says how code blocks are written and detected and how tool
    output is rendered: CIR's markdown fences with exact-match boundaries by default
    (`tirl.protocol`).

    `segment_tokens` (L_seg) and `segment_tool_calls` (T_seg) are the per-segment budgets of
    partial rollouts (`Rollout.start` / `resume`): a segment ends after L_seg model tokens or
    after its T_seg-th code block's output is appended, whichever comes first. None: no limit.

    `tools` are the enabled tools (`tirl.tools.TOOLS` names). The protocol detects exactly
    its `tool_blocks` and runs its `enabled_tools`: a run builds it with
    `tirl.tools.toolset_protocol(protocol, cfg.tools)`, which adds the blocks of the registered
    tools that are not enabled (answered with one line, not run). `tools` None (the default)
    takes the protocol's enabled tools, so the bare `CIR_FENCES` runs and detects
    ```` ```python ```` only, as before tools existed; `tools` given and different from them
    puts the protocol through `toolset_protocol` here. After construction `tools` is always
    `protocol.enabled_tools`.
    """

    max_model_tokens: int = 96
    tool_budget: int = 2
    temperature: float = 1.0
    use_tools: bool = True
    max_output_chars: int = SHOWN_OUTPUT_CHARS
    protocol: Protocol = CIR_FENCES
    budget_spent_message: str = BUDGET_SPENT_MESSAGE
    segment_tokens: int | None = None
    segment_tool_calls: int | None = None
    tools: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.tools is not None and tuple(self.tools) != self.protocol.enabled_tools:
            object.__setattr__(self, "protocol", toolset_protocol(self.protocol, self.tools))
        object.__setattr__(self, "tools", self.protocol.enabled_tools)
        for name in ("segment_tokens", "segment_tool_calls"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")


@dataclass(frozen=True)
class BlockClosed:
    """The rollout's stop function: True once the new ids finish a code block.

    `prefix` holds the model ids sampled since the last tool output in earlier calls (a block
    opened before a segment ended closes in the next one). `server_stop` is for engines that
    ask a server to stop early and then call this function (`OpenAIEngine`): the strings at
    which such a stop can be a boundary under the protocol.
    """

    decode: Callable[[list[int]], str]
    protocol: Protocol
    prefix: tuple[int, ...] = ()

    @property
    def server_stop(self) -> tuple[str, ...]:
        return self.protocol.server_stop

    def __call__(self, new_ids: list[int]) -> bool:
        return self.protocol.closed_block(self.decode([*self.prefix, *new_ids])) is not None


@dataclass
class PartialRollout:
    """A trajectory stopped at its segment budget: its tokens so far and its live session.

    `trajectory.finish_reason` is "partial". `segments_run` counts the segments (training
    steps) it has spanned. Pass it to `Rollout.resume`, or `close()` it to drop it.
    """

    trajectory: Trajectory
    session: SessionBase | None
    segments_run: int = 1

    @property
    def oldest_version(self) -> int | None:
        versions = [v for v in self.trajectory.meta.get(VERSIONS_KEY, []) if v is not None]
        return min(versions) if versions else None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


def token_policy_versions(traj: Trajectory) -> list[int]:
    """One policy version per id of `traj.ids`; -1 on prompt and tool tokens (as AReaL)."""
    versions = traj.meta.get(VERSIONS_KEY) or [None] * len(traj.segments)
    return [-1 if v is None else v for s, v in zip(traj.segments, versions) for _ in s.ids]


@dataclass
class _Run:
    """One trajectory in flight (one segment of it, for partial rollouts)."""

    rollout_id: object
    traj: Trajectory
    session: SessionBase | None
    key: int  # the engine key: new per segment, since a segment ends by releasing it
    feed: list[int]  # ids the engine has not seen yet
    cancel_reason: str | None = None
    task: asyncio.Future | None = field(default=None, repr=False)


class Rollout:
    """Generates trajectories with one engine, one tokenizer and one sandbox."""

    _keys = itertools.count()

    def __init__(
        self,
        engine,
        tokenizer,
        sandbox: Sandbox | None,
        *,
        max_generating: int | None = None,
        max_tool_calls: int | None = None,
        max_trajectories: int | None = None,
        policy_version: int = 0,
        tool_budget_now: Callable[[], int] | None = None,
        max_model_tokens_now: Callable[[], int] | None = None,
    ) -> None:
        """`tool_budget_now()`, when given, is the tool budget at the moment a code block
        closes, in place of `RolloutSettings.tool_budget` (a schedule over policy versions
        that change while a trajectory runs, as under verl's asynchronous trainers).
        `max_model_tokens_now()`, when given, is the model-token limit, read before each
        request and again when its reply is in: a limit that can only shrink once the reply
        reports which policy version sampled it (verl's stage expansion). A reply longer than
        the limit then allows is cut there and ends the trajectory with "length", exactly as
        if it had been sampled under that limit: sampling goes left to right."""
        self.engine = engine
        self.tool_budget_now = tool_budget_now
        self.max_model_tokens_now = max_model_tokens_now
        self.tokenizer = tokenizer
        self.sandbox = sandbox
        self.policy_version = policy_version
        self._gen_slots = _limit(max_generating)
        self._tool_slots = _limit(max_tool_calls)
        self._trajectory_slots = _limit(max_trajectories)
        self._running: dict[object, _Run] = {}
        self._protocols: dict[Protocol, Protocol] = {}  # settings' -> as written for tokenizer

    def encode(self, text: str) -> list[int]:
        """A text prompt's ids (a special token spelt in it stays special, as before)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def protocol_for(self, settings: RolloutSettings) -> Protocol:
        """`settings.protocol` as written for this rollout's tokenizer (`for_tokenizer`)."""
        protocol = self._protocols.get(settings.protocol)
        if protocol is None:
            protocol = settings.protocol.for_tokenizer(self.tokenizer)
            self._protocols[settings.protocol] = protocol
        return protocol

    # ------------------------------------------------------------------ public API
    async def run(
        self, prompt: Prompt, settings: RolloutSettings, meta: dict | None = None
    ) -> Trajectory:
        """One whole trajectory (segment budgets are ignored). `prompt`: text or token ids.
        With `max_trajectories`, it waits for one of that many slots first."""
        async with self._trajectory_slots:
            return await self._go(self._new_run(prompt, meta), settings, segmented=False)

    async def start(
        self, prompt: Prompt, settings: RolloutSettings, meta: dict | None = None
    ) -> Trajectory | PartialRollout:
        """The first segment of a trajectory: finished, or partial at the segment budget."""
        return await self._go(self._new_run(prompt, meta), settings, segmented=True)

    async def resume(
        self, partial: PartialRollout, settings: RolloutSettings
    ) -> Trajectory | PartialRollout:
        """The next segment of `partial`, re-prefilling its whole history under a new key."""
        traj = partial.trajectory
        traj.finish_reason = "stop"
        run = _Run(
            traj.meta.get("rollout_id", next(self._keys)),
            traj,
            partial.session,
            next(self._keys),
            traj.ids,
        )
        partial.session = None  # the run owns it now
        out = await self._go(run, settings, segmented=True)
        if isinstance(out, PartialRollout):
            out.segments_run = partial.segments_run + 1
        return out

    def cancel(self, rollout_id: object, reason: str = "cancelled by Rollout.cancel") -> bool:
        """End one running trajectory now; it returns with finish_reason "cancelled" and
        `meta["error"] = reason`. False if no trajectory of that id is running."""
        run = self._running.get(rollout_id)
        if run is None or run.task is None or run.task.done():
            return False
        run.cancel_reason = reason
        run.task.cancel()
        return True

    def running(self) -> dict[object, Trajectory]:
        """The trajectories in flight, by rollout id (`meta["rollout_id"]` if given)."""
        return {rid: run.traj for rid, run in self._running.items()}

    async def run_many(
        self,
        prompts: Sequence[Prompt],
        settings: RolloutSettings,
        metas: Sequence[dict] | None = None,
        progress: str | None = None,
    ) -> list[Trajectory]:
        """All prompts at once, results in input order."""
        metas = metas or [{} for _ in prompts]
        bar = tqdm(total=len(prompts), desc=progress, leave=False, disable=progress is None)

        async def one(prompt: Prompt, meta: dict) -> Trajectory:
            traj = await self.run(prompt, settings, meta)
            bar.update()
            return traj

        try:
            return list(await asyncio.gather(*(one(p, m) for p, m in zip(prompts, metas))))
        finally:
            bar.close()

    # ------------------------------------------------------------------ one trajectory
    def _new_run(self, prompt: Prompt, meta: dict | None) -> _Run:
        key = next(self._keys)
        meta = dict(meta or {})
        if isinstance(prompt, str):
            prompt_ids = self.encode(prompt)
        else:
            prompt_ids = [int(i) for i in prompt]
            if not prompt_ids:
                raise ValueError("a prompt given as ids needs at least one id")
            prompt = self.tokenizer.decode(prompt_ids)  # shown as is, special tokens included
        traj = Trajectory(segments=[Segment(SegmentKind.PROMPT, prompt_ids, prompt)], meta=meta)
        traj.meta[VERSIONS_KEY] = [None]
        return _Run(meta.get("rollout_id", key), traj, None, key, prompt_ids)

    async def _go(
        self, run: _Run, settings: RolloutSettings, segmented: bool
    ) -> Trajectory | PartialRollout:
        """Drive `run` in its own task (so that `cancel` can end it alone) and report how it
        ended. The engine key is always released; the session is kept only for a partial."""
        traj = run.traj
        traj.meta.setdefault(VERSIONS_KEY, [None] * len(traj.segments))
        run.task = asyncio.ensure_future(self._drive(run, settings, segmented))
        self._running[run.rollout_id] = run
        partial = False
        try:
            partial = await run.task
        except asyncio.CancelledError:
            if run.cancel_reason is None:  # our caller was cancelled: let it propagate
                raise
            traj.finish_reason = "cancelled"
            traj.meta["error"] = run.cancel_reason
        except PromptTooLongError as exc:
            if traj.num_model_tokens:  # a resumed history that fills the context: truncated
                traj.finish_reason = "length"
            else:  # the prompt itself: the sample could not run, a failure
                traj.finish_reason = "error"
                traj.meta["error"] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # one trajectory's failure never takes the others down
            traj.finish_reason = "error"
            traj.meta["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self._running.pop(run.rollout_id, None)
            self.engine.release(run.key)
            if not partial and run.session is not None:
                await run.session.close()
        if partial:
            traj.finish_reason = "partial"
            return PartialRollout(traj, run.session)
        return traj

    async def _drive(self, run: _Run, settings: RolloutSettings, segmented: bool) -> bool:
        """Generate and execute until the trajectory ends (False) or, when `segmented`, until
        the segment budget is spent (True)."""
        traj, protocol = run.traj, self.protocol_for(settings)
        seg_tokens = seg_calls = 0
        seg_token_cap = settings.segment_tokens if segmented else None
        seg_call_cap = settings.segment_tool_calls if segmented else None
        while True:
            left = self._model_token_limit(settings) - traj.num_model_tokens
            max_new = left if seg_token_cap is None else min(left, seg_token_cap - seg_tokens)
            turn = _turn_ids(traj)
            stop = BlockClosed(self.decode, protocol, tuple(turn)) if settings.use_tools else None
            async with self._gen_slots:
                out = await self.engine.generate(
                    run.key,
                    run.feed,
                    max_new_tokens=max_new,
                    temperature=settings.temperature,
                    stop=stop,
                    **_call_seed(traj),
                )
            run.feed = []
            ids, logprobs, finish = out.ids, out.logprobs, out.finish_reason
            limit = self._model_token_limit(settings)
            room = max(0, limit - traj.num_model_tokens)
            if len(ids) > room:  # the limit the reply's policy version allows is smaller
                ids, finish = ids[:room], "length"
                logprobs = None if logprobs is None else logprobs[:room]
            seg_tokens += len(ids)
            if ids:
                self._append(
                    traj,
                    Segment(SegmentKind.MODEL, ids, self.decode(ids), logprobs),
                    self.policy_version,
                )
            if finish != "boundary":
                spent = traj.num_model_tokens >= limit
                seg_spent = seg_token_cap is not None and seg_tokens >= seg_token_cap
                if finish == "length" and seg_spent and not spent:
                    return True  # the segment budget ran out, not the trajectory's
                traj.finish_reason = finish
                return False
            tool, code = protocol.closed_call(self.decode(turn + ids))
            call = await self._tool_call(run, tool, code, settings)
            traj.tool_calls.append(call)
            tool_text = protocol.render_output(call.output_text)
            run.feed = protocol.encode_output(self.tokenizer, call.output_text)
            self._append(traj, Segment(SegmentKind.TOOL, run.feed, tool_text), None)
            seg_calls += 1
            if traj.num_model_tokens >= self._model_token_limit(settings):
                traj.finish_reason = "length"
                return False
            if seg_call_cap is not None and seg_calls >= seg_call_cap:
                return True
            if seg_token_cap is not None and seg_tokens >= seg_token_cap:
                return True

    def _model_token_limit(self, settings: RolloutSettings) -> int:
        if self.max_model_tokens_now is None:
            return settings.max_model_tokens
        return self.max_model_tokens_now()

    async def _tool_call(
        self, run: _Run, tool: str, code: str, settings: RolloutSettings
    ) -> ToolCall:
        """Run the block with its tool, or answer it with one line: a call that cannot run
        ("error"), the tool is not enabled ("disabled"), or the budget of blocks that ran is
        spent ("skipped")."""
        error = settings.protocol.call_error(tool, code)
        if error is not None:
            return ToolCall(code, "error", error, tool=tool)
        if tool not in settings.tools:
            return ToolCall(code, "disabled", disabled_message(tool, settings.tools), tool=tool)
        executed = [c for c in run.traj.tool_calls if c.status not in NOT_RUN]
        budget = settings.tool_budget if self.tool_budget_now is None else self.tool_budget_now()
        if len(executed) >= budget:
            return ToolCall(code, "skipped", settings.budget_spent_message, tool=tool)

        async def session() -> SessionBase:  # opened at the first block that needs it
            if run.session is None:
                if self.sandbox is None:
                    raise RuntimeError(f"tool {tool!r} needs a sandbox; this Rollout has none")
                run.session = await self.sandbox.session()
            return run.session

        async with self._tool_slots:
            result = await TOOLS[tool].run(code, ToolContext(session, settings.max_output_chars))
        return ToolCall(code, result.status, result.output, result.duration_s, tool)

    @staticmethod
    def _append(traj: Trajectory, segment: Segment, version: int | None) -> None:
        traj.segments.append(segment)
        traj.meta[VERSIONS_KEY].append(version)


def _turn_ids(traj: Trajectory) -> list[int]:
    """The model ids sampled since the last tool output (or the prompt)."""
    ids: list[int] = []
    for s in reversed(traj.segments):
        if s.kind is not SegmentKind.MODEL:
            break
        ids[:0] = s.ids
    return ids


def _limit(n: int | None) -> asyncio.Semaphore | contextlib.nullcontext:
    if n is None:
        return contextlib.nullcontext()
    if n < 1:
        raise ValueError(f"a concurrency limit must be >= 1 or None, got {n}")
    return asyncio.Semaphore(n)
