"""A run's tools: which are enabled, and the protocol that detects every registered tool's
blocks.

A run enables some tools (`tools: [python, shell]`, default `[python]`). `toolset_protocol`
gives the protocol that detects the blocks of every registered tool that has a block in it (a
word for the protocol's shape, `tirl.tools.base.Tool.block`): the enabled ones run, and a block
for a registered tool that is not enabled is answered with one line (`disabled_message`)
instead of being run. Why not let it pass as plain text: the
model would go on as if the block had run and usually write its own "output" after it, which
is then trained on as model tokens; the one-line refusal is what the budget-spent block
already gets, so every closed block is answered the same way. Tools registered by a module
that is not imported are unknown, and their blocks are plain text.

This module reads the registry (`tirl.tools.base.TOOLS`), so it imports the built-in tools
(`tirl.tools.builtins`), which import only `tirl.tools.base`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tirl.tools.builtins  # noqa: F401  (registers the built-in tools)
from tirl.config import ConfigError
from tirl.protocol import DEFAULT_TOOL, Protocol, Shape
from tirl.tools.base import TOOLS

DEFAULT_TOOLS = (DEFAULT_TOOL,)  # what a run enables unless its config says otherwise


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
    other registered tool that has a block in it (`enabled` False: refused, not run). The
    result is what a run writes and reads in: its `enabled_tools` are the run's tools.

    ConfigError (one line) for an unknown tool, or an enabled tool without a block here."""
    problem = tools_problem(enabled)
    if problem:
        raise ConfigError(f"tools {problem}", "tools")
    base = protocol.with_blocks(())  # the protocol's own code block is the Python tool's
    blocks = []
    for name in [*enabled, *(n for n in TOOLS if n not in enabled)]:
        block = TOOLS[name].block(base)
        if block is None and name in enabled:
            shape = protocol.shape.value if protocol.shape is not None else "no shape"
            words = ", ".join(Shape(s).value for s in TOOLS[name].words) or "none"
            has = f"the tool has words for: {words}"
            if protocol.shape is Shape.CALLS:
                has = "the tool declares no function (code_arguments)"
            raise ConfigError(
                f"tools: {name!r} has no block in protocol {protocol.name!r} ({shape}; {has})",
                "tools",
            )
        if block is not None:
            blocks.append(dataclasses.replace(block, enabled=name in enabled))
    return protocol.with_blocks(tuple(blocks))


def disabled_message(tool: str, enabled: Sequence[str]) -> str:
    """The one line a block for a registered tool that the run did not enable gets."""
    return f"Tool {tool!r} is not enabled in this run (enabled: {', '.join(enabled)}): not run."


def function_schemas(protocol: Protocol) -> list[dict]:
    """The OpenAI function definitions of `protocol`'s enabled tools, in order: a call
    protocol's `tools=` for the chat template (`tirl.tools.base.Tool.function_schema`)."""
    return [TOOLS[name].function_schema() for name in protocol.enabled_tools]


def tools_prompt(protocol: Protocol, enabled: Sequence[str]) -> str:
    """The system-prompt lines of the enabled tools other than Python, joined by spaces: what
    a protocol's default system prompt (which explains the Python block) is followed by. None
    in a call protocol: there the tools are the functions listed with it."""
    if protocol.shape is Shape.CALLS:
        return ""
    lines = [TOOLS[n].prompt_line(protocol.with_blocks(())) for n in enabled if n != DEFAULT_TOOL]
    return " ".join(line for line in lines if line)
