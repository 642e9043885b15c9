"""The program a verifiers agent runs for tirl tasks: a chat loop, with tirl's Python sandbox as
the tool when `python` is on.

verifiers 0.4.0 runs a model inside a `Harness` (verifiers/v1/harness.py). Its built-in loops
(`null`, `bash`) are programs it installs into the runtime with `uv sync`, which downloads
packages; tirl's harness instead runs its loop in this process, which the `Harness.launch`
contract allows ("a harness may run its loop in-process ... as long as every model call goes
through `endpoint` + `secret`"): each turn is a chat completion at the rollout's interception
endpoint, so verifiers records every call in the trace exactly as for its own harnesses.

Single-turn (`python` off): one completion; the reply is the answer.

Multi-turn (`python` on): the CIR form of tirl's rollout in chat turns. The system message is
tirl's own for the `cir_fences` protocol; every ```python block of a reply runs, in order, in
one `tirl.sandbox` session that lives for the whole rollout (variables persist between blocks
and turns); the next user message holds each block's result, formatted by tirl's one formatter
(`tirl.sandbox.format_result`) in ```output fences. The rollout ends at a reply without a code
block, or after `max_tool_turns` turns with code (then one last turn asks for the answer
without code). The sandbox is tirl's local one (forked sessions, limits, isolation where the
host allows it; `tirl.sandbox.local`), started on the harness's first use and shared by its
rollouts.

Native tool calls (`python` and `tool_calls` on): Python is a function the request offers
(`tools=[...]`, tirl's python tool's `function_schema()`), as verifiers' own chat harnesses offer
theirs; each of a reply's `tool_calls` runs in the rollout's sandbox session and is answered by a
`role: tool` message with its `tool_call_id`. A call that cannot run (arguments that are not a
JSON object, no `code`, another function) is answered with one line saying why, and the rollout
goes on. The system message is tirl's own for the `hermes_tools` protocol, without the function
list (the server's chat template lists the `tools`); the last turn, past the budget, is asked
with `tool_choice: "none"`.
"""

from __future__ import annotations

import asyncio
import json
import re

import verifiers.v1 as vf
from openai import AsyncOpenAI
from pydantic import Field, model_validator

from tirl.protocol import get_protocol
from tirl.sandbox import SandboxClient, format_result
from tirl.sandbox.config import SandboxConfig, make_sandbox
from tirl.sandbox.limits import MATH_PRELOAD
from tirl.tasks.prompts import default_system_prompt
from tirl.tools import TOOLS

_PROTOCOL = get_protocol("cir_fences")
_CALLS = get_protocol("hermes_tools")
_PYTHON = TOOLS["python"]
_CODE = _PYTHON.code_arguments[0]  # the argument that carries the code: "code"
_BLOCKS = re.compile(
    re.escape(_PROTOCOL.code_open) + "(.*?)" + re.escape(_PROTOCOL.code_close), re.DOTALL
)
FINAL_TURN = "No more code can run now. Give your final answer."


def code_blocks(reply: str) -> list[str]:
    """The ```python blocks of a reply, in order (closed blocks only, as tirl runs them)."""
    return _BLOCKS.findall(reply)


class TirlHarnessConfig(vf.HarnessConfig):
    python: bool = False
    """Give the model tirl's Python sandbox (multi-turn); off: one reply (single-turn)."""
    max_tool_turns: int = Field(4, ge=1)
    """Most turns whose code runs (tirl's interaction budget)."""
    cell_timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit of one code block."""
    tool_calls: bool = False
    """With `python`: Python as a function in the request's `tools`, called natively (the
    server parses the model's calls, e.g. vLLM's `--tool-call-parser hermes`, `tirl serve`);
    off: ```python blocks in the reply's text."""

    @model_validator(mode="after")
    def _calls_need_python(self) -> TirlHarnessConfig:
        if self.tool_calls and not self.python:
            raise ValueError("tool_calls: true needs python: true (the function is Python)")
        return self


class TirlHarness(vf.Harness[TirlHarnessConfig]):
    """See the module doc."""

    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False  # the loop runs here; code runs in tirl's own sandbox
    SUPPORTS_MCP = False

    def __init__(self, config: TirlHarnessConfig) -> None:
        super().__init__(config)
        self._sandbox: SandboxClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    async def _sandbox_started(self) -> SandboxClient:
        """The harness's sandbox, started on first use in this event loop (a sandbox belongs
        to the loop that started it; one left in an earlier loop is abandoned, and its zygote
        dies with this process)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._lock, self._sandbox = loop, asyncio.Lock(), None
        async with self._lock:
            if self._sandbox is None:
                sandbox = make_sandbox(SandboxConfig(preload=list(MATH_PRELOAD)))
                await sandbox.start()
                self._sandbox = sandbox
            return self._sandbox

    async def close_sandbox(self) -> None:
        """Stop the sandbox, from the loop that uses it (else it stops with this process:
        verifiers has no hook for the end of a harness's last rollout)."""
        if self._sandbox is not None:
            await self._sandbox.close()
            self._sandbox = None

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        system, prompt = self.resolve_prompt(data)
        if self.config.python:
            own = (
                default_system_prompt(_CALLS, list_functions=False)
                if self.config.tool_calls
                else default_system_prompt(_PROTOCOL)
            )
            system = "\n\n".join(s for s in (own, system) if s)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            if not self.config.python:
                await self._reply(client, ctx, messages)
            elif self.config.tool_calls:
                await self._solve_with_calls(client, ctx, messages)
            else:
                await self._solve_with_python(client, ctx, messages)
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    async def _reply(self, client: AsyncOpenAI, ctx, messages: list[dict]) -> str:
        completion = await client.chat.completions.create(model=ctx.model, messages=messages)
        reply = completion.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        return reply

    async def _solve_with_python(self, client: AsyncOpenAI, ctx, messages: list[dict]) -> None:
        session = await (await self._sandbox_started()).session()
        try:
            for _ in range(self.config.max_tool_turns):
                blocks = code_blocks(await self._reply(client, ctx, messages))
                if not blocks:
                    return
                outputs = []
                for code in blocks:
                    result = await session.run(code, self.config.cell_timeout_s)
                    outputs.append(_PROTOCOL.render_output(format_result(result)).strip("\n"))
                messages.append({"role": "user", "content": "\n".join(outputs)})
            messages[-1]["content"] += "\n\n" + FINAL_TURN
            await self._reply(client, ctx, messages)
        finally:
            await session.close()

    async def _solve_with_calls(self, client: AsyncOpenAI, ctx, messages: list[dict]) -> None:
        session = await (await self._sandbox_started()).session()
        tools = [_PYTHON.function_schema()]
        try:
            for _ in range(self.config.max_tool_turns):
                completion = await client.chat.completions.create(
                    model=ctx.model, messages=messages, tools=tools
                )
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return
                for call in message.tool_calls:
                    code, problem = _call_code(call.function.name, call.function.arguments)
                    if code is not None:
                        result = await session.run(code, self.config.cell_timeout_s)
                        problem = format_result(result)
                    messages.append(
                        {"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                         "content": problem}
                    )  # fmt: skip
            messages.append({"role": "user", "content": FINAL_TURN})
            completion = await client.chat.completions.create(
                model=ctx.model, messages=messages, tools=tools, tool_choice="none"
            )
            messages.append(completion.choices[0].message.model_dump(exclude_none=True))
        finally:
            await session.close()


def _call_code(name: str, arguments: str | None) -> tuple[str | None, str]:
    """(the code a call runs, "") or (None, why it cannot run, in one line)."""
    if name != _PYTHON.name:
        return None, f"error: unknown function {name!r}; the one function is {_PYTHON.name!r}"
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return None, f"error: the arguments are not JSON ({exc}); send a JSON object"
    if not isinstance(args, dict) or not isinstance(args.get(_CODE), str):
        return None, f"error: the arguments must be a JSON object with a string {_CODE!r}"
    return args[_CODE], ""
