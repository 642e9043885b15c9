"""Tools the model calls from its text: Python (the default) and shell, each one registered file.

See `tirl.tools.base` for the interface; `docs/extending.md` ("A tool") for adding one.
"""

from __future__ import annotations

from tirl.tools.base import (
    DEFAULT_TOOLS,
    TOOLS,
    Tool,
    ToolContext,
    ToolResult,
    disabled_message,
    register_tool,
    tools_problem,
    tools_prompt,
    toolset_protocol,
)

__all__ = [
    "DEFAULT_TOOLS",
    "TOOLS",
    "Tool",
    "ToolContext",
    "ToolResult",
    "disabled_message",
    "register_tool",
    "tools_problem",
    "tools_prompt",
    "toolset_protocol",
]
