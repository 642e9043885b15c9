"""The tool interface: what a tool is, the registry of tools, and how a run's tools are
combined with its protocol.

A tool is one file with one class registered by name (`@register_tool("shell")`). It says

- how its blocks are written in each protocol (`markers`: protocol name -> (open, close); the
  Python tool uses the protocol's own code block, so its markers are the protocol's);
- its line of the system prompt (`prompt`), which tells the model the block exists;
- how a block runs (`run(code, ctx)`): in the trajectory's sandbox session (`ctx.session()`,
  opened on first use and shared by every tool of the trajectory) or anywhere else;
- how its result is shown (`run` returns the text, which the tool formats itself, so
  training, evaluation and synthesis show the model the same text for the same result).

What a tool cannot choose is where the result goes: it is always written inside the protocol's
output block (```` ```output ````, `<interpreter>`) as a tool segment, and tool segments are
masked from the loss (architecture.md invariant 2), whatever the tool.

A run enables some tools (`tools: [python, shell]`, default `[python]`). `toolset_protocol`
gives the protocol that detects the blocks of every registered tool that has markers in it:
the enabled ones run, and a block for a registered tool that is not enabled is answered with
one line (`disabled_message`) instead of being run. Why not let it pass as plain text: the
model would go on as if the block had run and usually write its own "output" after it, which
is then trained on as model tokens; the one-line refusal is what the budget-spent block
already gets, so every closed block is answered the same way. Tools registered by a module
that is not imported are unknown, and their blocks are plain text.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from tirl.config import ConfigError
from tirl.protocol import DEFAULT_TOOL, Protocol, ToolBlock
from tirl.registry import Registry
from tirl.sandbox import SessionBase

DEFAULT_TOOLS = (DEFAULT_TOOL,)  # what a run enables unless its config says otherwise


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may use: the trajectory's sandbox session (`await ctx.session()`
    opens it on first use; every tool of the trajectory shares it), and how many characters
    of output the model may be shown."""

    session: Callable[[], Awaitable[SessionBase]]
    max_output_chars: int


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer: `status` ("ok", "error", "timeout", ... as the sandbox's statuses),
    `output` (exactly the text shown to the model, inside the output block), `duration_s`."""

    status: str
    output: str
    duration_s: float = 0.0


class Tool(abc.ABC):
    """One tool. Subclasses set `markers` and `prompt` and implement `run`; the registry sets
    `name`. Tools hold no state: one instance serves every trajectory."""

    name: str = ""
    markers: Mapping[str, tuple[str, str]] = {}  # protocol name -> (open, close)
    # the system prompt's line about this tool; {open} and {close} are its markers
    prompt: str = ""

    def block(self, protocol: Protocol) -> ToolBlock | None:
        """How this tool's blocks are written in `protocol`, or None if it has no markers."""
        pair = self.markers.get(protocol.name)
        return None if pair is None else ToolBlock(self.name, *pair)

    def prompt_line(self, protocol: Protocol) -> str:
        """This tool's line of the system prompt, with its markers as `protocol` writes them."""
        block = self.block(protocol)
        if block is None or not self.prompt:
            return ""
        return self.prompt.format(open=block.open.strip(), close=block.close.strip())

    @abc.abstractmethod
    async def run(self, code: str, ctx: ToolContext) -> ToolResult:
        """Run one block; never raises for anything the block does."""


def _check(name: str, entry: Tool) -> None:
    if not isinstance(entry, Tool):
        raise TypeError(f"tool {name!r} must be a tirl.tools.Tool, got {type(entry).__name__}")


TOOLS: Registry[Tool] = Registry("tool", builtins="tirl.tools.builtins", check=_check)


def register_tool(name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Class decorator: register one instance of the decorated `Tool` subclass as `name`."""

    def add(cls: type[Tool]) -> type[Tool]:
        cls.name = name
        TOOLS.add(name, cls())
        return cls

    return add


def tools_problem(names: Sequence[str]) -> str | None:
    """Why `names` is not a valid tool set (a config field's check), or None."""
    if not names:
        return f"must enable at least one tool (registered: {', '.join(TOOLS)})"
    if len(set(names)) != len(names):
        return f"must not repeat a tool, got {list(names)}"
    for name in names:
        if name not in TOOLS:
            return f"must list registered tools; {name!r} is not one ({', '.join(TOOLS)})"
    return None


def toolset_protocol(protocol: Protocol, enabled: Sequence[str] = DEFAULT_TOOLS) -> Protocol:
    """`protocol` detecting the blocks of the enabled tools (in their order) and then of every
    other registered tool that has markers in it (`enabled` False: refused, not run). The
    result is what a run writes and reads in: its `enabled_tools` are the run's tools.

    ConfigError (one line) for an unknown tool, or an enabled tool without markers here."""
    problem = tools_problem(enabled)
    if problem:
        raise ConfigError(f"tools {problem}", "tools")
    base = protocol.with_blocks(())  # the protocol's own code block is the Python tool's
    blocks = []
    for name in [*enabled, *(n for n in TOOLS if n not in enabled)]:
        block = TOOLS[name].block(base)
        if block is None and name in enabled:
            raise ConfigError(
                f"tools: {name!r} has no block markers for protocol {protocol.name!r}"
                f" (it has: {', '.join(TOOLS[name].markers) or 'none'})",
                "tools",
            )
        if block is not None:
            blocks.append(dataclasses.replace(block, enabled=name in enabled))
    return protocol.with_blocks(tuple(blocks))


def disabled_message(tool: str, enabled: Sequence[str]) -> str:
    """The one line a block for a registered tool that the run did not enable gets."""
    return f"Tool {tool!r} is not enabled in this run (enabled: {', '.join(enabled)}): not run."


def tools_prompt(protocol: Protocol, enabled: Sequence[str]) -> str:
    """The system-prompt lines of the enabled tools other than Python, joined by spaces: what
    a protocol's default system prompt (which explains the Python block) is followed by."""
    lines = [TOOLS[n].prompt_line(protocol.with_blocks(())) for n in enabled if n != DEFAULT_TOOL]
    return " ".join(line for line in lines if line)
