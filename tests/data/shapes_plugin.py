"""A plugin that names no protocol: a tool whose blocks are `sql` blocks in every protocol
shape, and a protocol of the fence shape with answers in ```` ```result ````.

`tests/test_tool_shapes.py` loads it as a config's `plugins:` file and removes what it
registered afterwards."""

from __future__ import annotations

import sqlite3

from tirl.protocol import PROTOCOLS, Protocol, Shape
from tirl.tools.base import Tool, ToolContext, ToolResult, register_tool


@register_tool("query")
class QueryTool(Tool):
    """One SQL statement on an empty in-memory SQLite database; shows the first row."""

    words = {Shape.FENCES: "sql", Shape.TAGS: "sql"}
    aliases = {Shape.FENCES: ("sqlite",)}
    prompt = "You can query SQLite: write one statement between {open} and {close}."
    synth_note = "SQLite is there too: {open}SELECT 6 * 7{close} shows 42."

    async def run(self, code: str, ctx: ToolContext) -> ToolResult:
        try:
            row = sqlite3.connect(":memory:").execute(code).fetchone()
        except sqlite3.Error as exc:
            return ToolResult("error", f"{type(exc).__name__}: {exc}")
        return ToolResult("ok", " ".join(map(str, row or ())))


PROTOCOLS.add(
    "result_fences",
    Protocol(
        name="result_fences",
        code_open="```py\n",
        code_close="\n```",
        output_open="\n```result\n",
        output_close="\n```\n",
        shape=Shape.FENCES,
    ),
)
