"""The Python tool: a block is a cell of the trajectory's stateful sandbox session.

Its blocks are the protocol's own code block (```` ```python ```` in CIR's fences, `<code>` in
AgentMath's tags), whatever the protocol's shape, and its output is the sandbox's one formatter
(`tirl.sandbox.format_result`): exactly what the rollout did before tools were an interface. Its
`words` (`python`, `code`) and `aliases` (```` ```py ````, ```` ```python3 ````) are what
synthesis reads in a teacher's text; in a rollout they are the two built-in protocols' own.
"""

from __future__ import annotations

from tirl.protocol import Protocol, Shape, ToolBlock
from tirl.protocol.calls import PYTHON_ARGUMENT
from tirl.sandbox import format_result
from tirl.tools.base import Tool, ToolContext, ToolResult, register_tool


@register_tool("python")
class PythonTool(Tool):
    prompt = (
        "You can run Python: write code between {open} and {close}; it runs in one interpreter"
        " that keeps its variables between blocks, and what it prints comes back."
    )
    words = {Shape.FENCES: "python", Shape.TAGS: "code"}
    aliases = {Shape.FENCES: ("py", "python3")}
    code_is_python = True
    description = (
        "Run Python code in one interpreter that keeps its variables between calls; what it"
        " prints comes back."
    )
    parameters = {
        "type": "object",
        "properties": {PYTHON_ARGUMENT: {"type": "string", "description": "the Python code"}},
        "required": [PYTHON_ARGUMENT],
    }
    code_arguments = (PYTHON_ARGUMENT,)

    def block(self, protocol: Protocol) -> ToolBlock | None:
        if protocol.shape is Shape.CALLS:
            return super().block(protocol)
        return ToolBlock(self.name, protocol.code_open, protocol.code_close)

    async def run(self, code: str, ctx: ToolContext) -> ToolResult:
        session = await ctx.session()
        result = await session.run(code)
        return ToolResult(
            result.status.value,
            format_result(result, max_chars=ctx.max_output_chars),
            result.duration_s,
        )
