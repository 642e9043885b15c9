"""Tools the model calls from its text: Python (the default) and shell, each one registered file.

See `tirl.tools.base` for the interface and the registry, `tirl.tools.toolset` for a run's tools
(it imports the built-in ones); `docs/extending.md` ("A tool") for adding one.
"""

from __future__ import annotations

from tirl.tools.base import TOOLS, Tool, ToolContext, ToolResult, register_tool
from tirl.tools.toolset import (
    DEFAULT_TOOLS,
    disabled_message,
    function_schemas,
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
    "function_schemas",
    "register_tool",
    "tools_problem",
    "tools_prompt",
    "toolset_protocol",
]
