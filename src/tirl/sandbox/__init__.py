"""Run model-written Python in stateful, resource-limited sessions.

`Sandbox` forks sessions from a warm zygote process; `Session.run` executes one cell and returns
an `ExecResult`; `format_result` turns that into the exact text the model sees. Read the
docstring of `tirl.sandbox.local` for what is and is not isolated.
"""

from tirl.sandbox.formatter import FORMATTER_VERSION, format_result
from tirl.sandbox.local import Sandbox, SandboxLimits, Session
from tirl.sandbox.result import ExecResult, Status

__all__ = [
    "FORMATTER_VERSION",
    "ExecResult",
    "Sandbox",
    "SandboxLimits",
    "Session",
    "Status",
    "format_result",
]
