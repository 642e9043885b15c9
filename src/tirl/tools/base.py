"""The tool interface: what a tool is, and the registry of tools with its decorator.

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

This module is what a tool's file imports to register; it imports no tool. How a run's tools
combine with its protocol (`toolset_protocol`, `tools_problem`, ...) is `tirl.tools.toolset`,
which imports the built-in tools (`tirl.tools.builtins`): the dependency runs one way, readers
-> built-in tools -> this module. `tirl.tools` imports both, so `TOOLS` read through any
`tirl.tools` module holds the built-in tools.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from tirl.protocol import Protocol, ToolBlock
from tirl.registry import Registry
from tirl.sandbox import SessionBase


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


TOOLS: Registry[Tool] = Registry("tool", check=_check)


def register_tool(name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Class decorator: register one instance of the decorated `Tool` subclass as `name`."""

    def add(cls: type[Tool]) -> type[Tool]:
        cls.name = name
        TOOLS.add(name, cls())
        return cls

    return add
