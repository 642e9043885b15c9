"""The structured outcome of one executed cell.

`ExecResult` is what the sandbox returns; `tirl.sandbox.formatter.format_result` turns it into
the text the model sees. Keep the two apart: the trainer logs and filters on the fields, the
model only ever sees the formatted text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any


class Status(str, Enum):
    OK = "ok"  # the cell ran to completion
    ERROR = "error"  # the cell raised (including SyntaxError, SystemExit, KeyboardInterrupt)
    TIMEOUT = "timeout"  # wall-clock (or CPU) limit hit
    MEMORY = "memory"  # MemoryError, usually the session's memory rlimit
    KILLED = "killed"  # the interpreter process died, or the session was already dead


@dataclass(frozen=True)
class ExecResult:
    """One cell's outcome.

    `stdout`/`stderr` are already bounded: when a stream exceeded the sandbox's
    `capture_chars`, it holds the head, a `…[N chars truncated]…` marker and the tail, and
    the matching `*_truncated` flag is set. `traceback` is the formatted traceback of the user's
    exception with the sandbox's own frames removed; cells are named `<cell N>` (1-based, per
    session). `timeout_s` is the wall-clock limit that applied when `status` is TIMEOUT because
    of it; `detail` is a short human-readable reason for TIMEOUT (CPU limit), MEMORY and KILLED.
    `duration_s` is wall clock measured by the caller, round trip included.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0
    peak_memory_mb: float | None = None
    timeout_s: float | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["status"] = Status(d["status"])
        return cls(**kwargs)
