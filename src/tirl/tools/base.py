"""The tool interface: what a tool is, and the registry of tools with its decorator.

A tool is one file with one class registered by name (`@register_tool("shell")`). It says

- the word its blocks are named by, per protocol shape (`words`: `{Shape.FENCES: "bash",
  Shape.TAGS: "bash"}`); the protocol writes the block from it (```` ```bash ````, `<bash>`:
  `Protocol.tool_markers`), so a tool names no protocol and a new protocol of either shape
  needs no tool edited. The Python tool uses the protocol's own code block instead
  (`PythonTool.block`); its words are what a teacher writes (below);
- its line of the system prompt (`prompt`), which tells the model the block exists;
- for call protocols (`Shape.CALLS`, `tirl.protocol.calls`: the model calls tools as functions
  in its chat template's format), its function: a `description`, the JSON-schema `parameters`
  and which argument carries the code (`code_arguments`); `function_schema()` is the OpenAI
  function definition that goes into the chat template's `tools=`. A tool without
  `code_arguments` has no block in a call protocol;
- for synthesis (`tirl.synth`): other words a teacher may write for its blocks (`aliases`,
  ```` ```sh ```` for ```` ```bash ````), whether its code is Python source (`code_is_python`:
  the AST-depth filter measures it), and a note for the teacher's system prompt (`synth_note`);
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
from typing import Any

from tirl.protocol import Protocol, Shape, ToolBlock
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
    """One tool. Subclasses set `words` and `prompt` and implement `run`; the registry sets
    `name`. Tools hold no state: one instance serves every trajectory."""

    name: str = ""
    words: Mapping[Shape, str] = {}  # protocol shape -> the word its blocks are named by
    # the system prompt's line about this tool; {open} and {close} are its markers
    prompt: str = ""
    # Synthesis only. Words a teacher may also write for this tool's blocks (read, never written).
    aliases: Mapping[Shape, tuple[str, ...]] = {}
    code_is_python: bool = False  # its blocks are Python source (AST limits apply)
    # appended to the teacher's system prompt when a synth run enables the tool; {open} and
    # {close} are its markers in the teacher's protocol (AgentMath's tags)
    synth_note: str = ""
    # Call protocols. The function's description and JSON-schema parameters, and the
    # arguments that may carry the code (the first is the one `parameters` declares).
    description: str = ""
    parameters: Mapping[str, Any] = {}
    code_arguments: tuple[str, ...] = ()

    def block(self, protocol: Protocol) -> ToolBlock | None:
        """How this tool's blocks are written in `protocol` (from its word for the protocol's
        shape; in a call protocol, the one call block if the tool is a function), or None if
        it has none there."""
        if protocol.shape is Shape.CALLS:
            if not self.code_arguments:
                return None
            open_, close = protocol.code_open, protocol.code_close
            return ToolBlock(self.name, open_, close, arguments=tuple(self.code_arguments))
        word = self.words.get(protocol.shape) if protocol.shape is not None else None
        pair = None if word is None else protocol.tool_markers(word)
        return None if pair is None else ToolBlock(self.name, *pair)

    def function_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function definition (a chat template's `tools=` entry)."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": dict(self.parameters)}}

    def with_markers(self, text: str, protocol: Protocol) -> str:
        """`text` with {open} and {close} replaced by this tool's markers in `protocol` (their
        surrounding newlines removed); "" for no text or no block in `protocol`."""
        block = self.block(protocol)
        if block is None or not text:
            return ""
        return text.format(open=block.open.strip(), close=block.close.strip())

    def prompt_line(self, protocol: Protocol) -> str:
        """This tool's line of the system prompt, with its markers as `protocol` writes them."""
        return self.with_markers(self.prompt, protocol)

    @abc.abstractmethod
    async def run(self, code: str, ctx: ToolContext) -> ToolResult:
        """Run one block; never raises for anything the block does."""


def _check(name: str, entry: Tool) -> None:
    if not isinstance(entry, Tool):
        raise TypeError(f"tool {name!r} must be a tirl.tools.Tool, got {type(entry).__name__}")
    # Checked here so a plugin's slip is one error when it registers, not a bad regex later.
    if any(isinstance(words, str) for words in entry.aliases.values()):
        raise TypeError(f"tool {name!r}: aliases map a shape to a tuple of words")
    pairs = [*entry.words.items(), *((s, w) for s, ws in entry.aliases.items() for w in ws)]
    for shape, word in pairs:
        if shape not in set(Shape):  # a str-valued Enum: "tags" is Shape.TAGS
            shapes = ", ".join(s.value for s in Shape)
            raise TypeError(f"tool {name!r}: {shape!r} is not a protocol shape ({shapes})")
        if not isinstance(word, str) or not word or word != word.strip():
            raise TypeError(f"tool {name!r}: {word!r} is not a word for its blocks")


TOOLS: Registry[Tool] = Registry("tool", check=_check)


def register_tool(name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Class decorator: register one instance of the decorated `Tool` subclass as `name`."""

    def add(cls: type[Tool]) -> type[Tool]:
        cls.name = name
        TOOLS.add(name, cls())
        return cls

    return add
