"""The one session interface every sandbox transport offers.

A rollout holds a `SandboxClient` and never needs to know which transport is behind it:

- `tirl.sandbox.local.Sandbox`: sessions in processes on this machine (the fast path);
- `tirl.sandbox.http.HTTPSandbox`: sessions on a `tirl sandbox serve` server;
- `tirl.sandbox.ray_pool.RaySandboxPool`: sessions on a pool of Ray actors across a cluster.

Each transport subclasses `SessionBase`, which keeps the history of cells that ran to
completion on the caller's side. That history is what `restore` replays, so a session whose
process, server or actor was lost can be rebuilt wherever the transport can still start one.
"""

from __future__ import annotations

import abc
from typing import Any

from tirl.sandbox.result import ExecResult, Status


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start a session, lost its server): not the cell."""


class RestoreError(SandboxError):
    """A replayed cell did not run to completion the second time, so the state is not the same."""


class SessionBase(abc.ABC):
    """One stateful interpreter session. `run` never raises for anything the cell does.

    `history` holds, in order, the cells that returned Status.OK; `restore` replays them into a
    fresh interpreter. Cells that failed are not replayed: whatever they changed before failing
    is lost, and a cell that is not deterministic (random numbers, clocks, files it appends to)
    may leave different state behind. That is why restore is explicit and never automatic.
    """

    id: str
    history: list[str]

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """False once the interpreter is gone (closed, killed, or its worker died)."""

    @abc.abstractmethod
    async def _execute(self, code: str, timeout_s: float | None) -> ExecResult:
        """Run one cell on the transport."""

    @abc.abstractmethod
    async def _branch(self) -> SessionBase:
        """A new session whose interpreter is a copy of this one's (see `fork`)."""

    @abc.abstractmethod
    async def _replace(self) -> None:
        """Swap the (dead) interpreter behind this session for a fresh one, keeping `id`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session and free everything it holds. Idempotent."""

    async def run(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Execute one cell; variables, imports and definitions persist to the next one."""
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        result = await self._execute(code, timeout_s)
        if result.status is Status.OK:
            self.history.append(code)
        return result

    async def fork(self) -> SessionBase:
        """A copy-on-write branch: a new session that starts with exactly this session's
        variables, imports and files, and from then on evolves independently. Use it for the
        samples of a group that continue one shared prefix. The branch has its own id and its
        own copy of `history`. Raises SandboxError if this session is not alive."""
        if not self.alive:
            raise SandboxError(f"session {self.id} is not alive, so it cannot be forked")
        child = await self._branch()
        child.history = list(self.history)
        return child

    async def restore(self) -> int:
        """Rebuild a lost session by replaying `history` into a fresh interpreter.

        Returns the number of cells replayed. The session keeps its id. Raises RestoreError
        naming the first replayed cell that did not return Status.OK (the session is then alive
        with the state of the cells before it)."""
        await self._replace()
        total = len(self.history)
        for i, code in enumerate(self.history):
            result = await self._execute(code, None)
            if result.status is not Status.OK:
                self.history = self.history[:i]
                last_line = ((result.traceback or "").strip().splitlines() or [""])[-1]
                reason = result.detail or last_line
                raise RestoreError(
                    f"session {self.id}: replayed cell {i + 1} of {total} returned"
                    f" {result.status.value} ({reason or 'no detail'})"
                )
        return total

    async def __aenter__(self) -> SessionBase:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SandboxClient(abc.ABC):
    """A source of sessions. Use as `async with client:` (start on enter, close on exit)."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def session(self) -> SessionBase:
        """A new stateful session."""

    async def run_once(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Run `code` in a fresh session that is closed afterwards (stateless call)."""
        s = await self.session()
        try:
            return await s.run(code, timeout_s)
        finally:
            await s.close()

    async def stats(self) -> dict[str, Any]:
        """Counters for health and metrics endpoints; transports add their own."""
        return {}

    async def __aenter__(self) -> SandboxClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
