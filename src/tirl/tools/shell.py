"""The shell tool: a block is a bash script run inside the trajectory's sandbox session.

Blocks: its word is `bash` in both protocol shapes, so ```` ```bash ```` ... ```` ``` ```` in
fence protocols like CIR's (the same closing fence and the same ```` ```output ```` answer as
Python's) and `<bash>` ... `</bash>` in tag protocols like AgentMath's (its `<code>` is Python; a
tag named after the language, like the fence, is our choice: the paper has only Python). A
teacher's ```` ```sh ```` and ```` ```shell ```` fences are read as shell blocks too (synthesis).

How it runs: the session executes one Python cell that runs `bash -c SCRIPT` as a subprocess
and waits for it. So the script lives wherever the session does: its working directory (files
the Python blocks wrote are there), its network namespace, its rlimits and its wall-clock
timeout, and the sandbox's clean-up of processes a cell left behind. Nothing here adds
isolation of its own, and nothing is weaker than a Python block, which could call `subprocess`
itself. The cell runs in a namespace of its own (`exec(..., {})`), so the session's variables
are untouched; it is a cell like any other in the session's `history` (a `restore` replays it).

What the model sees (the tool's formatter): the script's stdout and stderr interleaved as a
terminal shows them, trailing newlines removed, then `[exit status N]` on a line of its own when
bash exited non-zero (status "error"). A timeout, a memory error or a dead session read as the
sandbox's formatter writes them (`tirl.sandbox.format_result`). The whole is cut in the middle
to `max_output_chars` like Python's output. stdin is empty (`/dev/null`): nothing waits for input.
"""

from __future__ import annotations

import re

from tirl.protocol import Shape
from tirl.sandbox import format_result
from tirl.sandbox.formatter import strip_ansi, truncate_middle
from tirl.sandbox.result import ExecResult, Status
from tirl.tools.base import Tool, ToolContext, ToolResult, register_tool

# Run in the session as exec(_RUNNER, {"SCRIPT": script}). The exit status goes to the cell's
# stderr, which the model never sees; the script's own stderr is merged into its stdout.
_RUNNER = """\
import subprocess, sys
done = subprocess.run(["bash", "-c", SCRIPT], stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
print(f"tirl-shell-exit {done.returncode}", file=sys.stderr)
"""
_EXIT = re.compile(r"tirl-shell-exit (-?\d+)\s*$")


def shell_cell(script: str) -> str:
    """The Python cell that runs `script` with bash in the session."""
    return f"exec({_RUNNER!r}, {{'SCRIPT': {script!r}}})"


def format_shell_result(result: ExecResult, max_chars: int) -> tuple[str, str]:
    """(status, text shown to the model) of a shell cell's result."""
    exit_code = _EXIT.search(result.stderr or "")
    if result.status is not Status.OK or exit_code is None:
        status = result.status.value if result.status is not Status.OK else Status.ERROR.value
        return status, format_result(result, max_chars=max_chars)
    out = strip_ansi(result.stdout).rstrip("\n")
    code = int(exit_code.group(1))
    if code == 0:
        return Status.OK.value, truncate_middle(out, max_chars)
    text = f"{out}\n[exit status {code}]" if out else f"[exit status {code}]"
    return Status.ERROR.value, truncate_middle(text, max_chars)


@register_tool("shell")
class ShellTool(Tool):
    words = {Shape.FENCES: "bash", Shape.TAGS: "bash"}
    prompt = (
        "You can also run bash: write a script between {open} and {close}; it runs in the same"
        " working directory as the Python code, and what it prints (stdout and stderr) comes"
        " back the same way."
    )
    aliases = {Shape.FENCES: ("sh", "shell")}
    synth_note = (
        "A shell is there too: a {open}...{close} block runs as a bash script in the same session"
        " (same\nworking directory), followed like any block by the output you expect in"
        " <interpreter>."
    )

    description = (
        "Run a bash script in the same working directory as the Python code; its stdout and"
        " stderr come back."
    )
    parameters = {
        "type": "object",
        "properties": {"script": {"type": "string", "description": "the bash script"}},
        "required": ["script"],
    }
    code_arguments = ("script", "code")  # a model that writes `code` for it is understood

    async def run(self, code: str, ctx: ToolContext) -> ToolResult:
        session = await ctx.session()
        result = await session.run(shell_cell(code))
        status, text = format_shell_result(result, ctx.max_output_chars)
        return ToolResult(status, text, result.duration_s)
