"""Drive trajectories: generate -> detect a closed code block -> execute -> append -> go on.

Every trajectory is its own asyncio task, so one that waits on the sandbox frees its place in
the sampler's batch for the others (request-level scheduling, AgentMath §3). A trajectory
keeps one stateful sandbox session for all its code blocks, opened at its first block.

What the trajectory holds is exactly what the model saw: the prompt ids, the ids the sampler
returned, and the ids of each tool output tokenized on its own (DESIGN.md invariant 1).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from tirl.backends.hf import HFEngine
from tirl.protocol.fences import CIR_FENCES, Protocol
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.sandbox import Sandbox, format_result

BUDGET_SPENT_MESSAGE = "Tool-call budget spent: this code was not run."


@dataclass(frozen=True)
class RolloutSettings:
    """How one trajectory is generated.

    `tool_budget` is the most code blocks that run per trajectory (CIR's interaction budget);
    a block closed after that is answered with `budget_spent_message` (rendered as tool output)
    instead of being run. With `use_tools` False the model is a plain text generator (the
    text-only baseline). `protocol` says how code blocks are written and detected and how tool
    output is rendered: CIR's markdown fences with exact-match boundaries by default
    (`tirl.protocol`).
    """

    max_model_tokens: int = 96
    tool_budget: int = 2
    temperature: float = 1.0
    use_tools: bool = True
    max_output_chars: int = 512
    protocol: Protocol = CIR_FENCES
    budget_spent_message: str = BUDGET_SPENT_MESSAGE


@dataclass(frozen=True)
class BlockClosed:
    """The rollout's stop function: True once the new ids finish a code block.

    `server_stop` is for engines that ask a server to stop early and then call this function
    (`OpenAIEngine`): the strings at which such a stop can be a boundary under the protocol.
    """

    decode: Callable[[list[int]], str]
    protocol: Protocol

    @property
    def server_stop(self) -> tuple[str, ...]:
        return self.protocol.server_stop

    def __call__(self, new_ids: list[int]) -> bool:
        return self.protocol.closed_block(self.decode(new_ids)) is not None


class Rollout:
    """Generates trajectories with one engine, one tokenizer and one sandbox."""

    _keys = itertools.count()

    def __init__(self, engine: HFEngine, tokenizer, sandbox: Sandbox | None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.sandbox = sandbox

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def run(
        self, prompt: str, settings: RolloutSettings, meta: dict | None = None
    ) -> Trajectory:
        key = next(self._keys)
        prompt_ids = self.encode(prompt)
        traj = Trajectory(
            segments=[Segment(SegmentKind.PROMPT, prompt_ids, prompt)], meta=dict(meta or {})
        )
        protocol = settings.protocol
        stop = BlockClosed(self.decode, protocol) if settings.use_tools else None
        feed, session, model_tokens = prompt_ids, None, 0
        try:
            while True:
                out = await self.engine.generate(
                    key,
                    feed,
                    max_new_tokens=settings.max_model_tokens - model_tokens,
                    temperature=settings.temperature,
                    stop=stop,
                )
                model_tokens += len(out.ids)
                text = self.decode(out.ids)
                if out.ids:
                    traj.segments.append(Segment(SegmentKind.MODEL, out.ids, text, out.logprobs))
                if out.finish_reason != "boundary":
                    traj.finish_reason = out.finish_reason
                    break
                code = protocol.closed_block(text)
                executed = [c for c in traj.tool_calls if c.status != "skipped"]
                if len(executed) >= settings.tool_budget:
                    call = ToolCall(code, "skipped", settings.budget_spent_message)
                else:
                    if session is None:
                        session = await self.sandbox.session()
                    result = await session.run(code)
                    call = ToolCall(
                        code,
                        result.status.value,
                        format_result(result, max_chars=settings.max_output_chars),
                        result.duration_s,
                    )
                traj.tool_calls.append(call)
                tool_text = protocol.render_output(call.output_text)
                feed = self.encode(tool_text)
                traj.segments.append(Segment(SegmentKind.TOOL, feed, tool_text))
                if model_tokens >= settings.max_model_tokens:
                    traj.finish_reason = "length"
                    break
        finally:
            self.engine.release(key)
            if session is not None:
                await session.close()
        return traj

    async def run_many(
        self,
        prompts: Sequence[str],
        settings: RolloutSettings,
        metas: Sequence[dict] | None = None,
        progress: str | None = None,
    ) -> list[Trajectory]:
        """All prompts at once, results in input order."""
        metas = metas or [{} for _ in prompts]
        bar = tqdm(total=len(prompts), desc=progress, leave=False, disable=progress is None)

        async def one(prompt: str, meta: dict) -> Trajectory:
            traj = await self.run(prompt, settings, meta)
            bar.update()
            return traj

        try:
            return list(await asyncio.gather(*(one(p, m) for p, m in zip(prompts, metas))))
        finally:
            bar.close()
