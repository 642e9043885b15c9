"""Run model-written Python in stateful, isolated, resource-limited sessions.

One interface (`tirl.sandbox.api`: `SandboxClient`, `SessionBase`) over three transports:

- `Sandbox` (this machine): sessions forked from a warm zygote; read `tirl.sandbox.local` for
  what is and is not isolated;
- `tirl.sandbox.http.HTTPSandbox`: sessions on `tirl sandbox serve` servers;
- `tirl.sandbox.ray_pool.RaySandboxPool`: sessions on a pool of Ray actors.

`session.run` executes one cell and returns an `ExecResult`; `format_result` turns that into the
exact text the model sees. What a session may use is `SandboxLimits` (`tirl.sandbox.limits`);
the settings a user writes are `tirl.sandbox.config.SandboxConfig`.

`Sandbox` and `Session` are imported on first use: the zygote (`python -m tirl.sandbox._zygote`)
imports this package, and every session inherits what the zygote imported, so the package
itself stays light (no asyncio).
"""

from typing import Any

from tirl.sandbox.api import RestoreError, SandboxClient, SandboxError, SessionBase
from tirl.sandbox.formatter import FORMATTER_VERSION, format_result
from tirl.sandbox.limits import SandboxLimits
from tirl.sandbox.result import ExecResult, Status

__all__ = [
    "FORMATTER_VERSION",
    "ExecResult",
    "RestoreError",
    "Sandbox",
    "SandboxClient",
    "SandboxError",
    "SandboxLimits",
    "Session",
    "SessionBase",
    "Status",
    "format_result",
]


def __getattr__(name: str) -> Any:
    if name in ("Sandbox", "Session"):
        from tirl.sandbox import local

        return getattr(local, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
