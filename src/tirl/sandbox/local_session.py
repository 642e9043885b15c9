"""One local sandbox session, as the calling process sees it: a cell's round trip.

`Session` (made by `tirl.sandbox.local.Sandbox.session()`) talks to its session process over a
Unix socket in length-prefixed JSON frames (`tirl.sandbox._wire`). A cell's life here: send it;
wait for the session's "started" (the timeout counts from there); on timeout ask the sandbox to
interrupt it (through the zygote, which confirms delivery) and wait `grace_s`; if no answer has
begun, kill the session. A session whose socket closes mid-cell asks the zygote how it died
(a CPU limit, the OOM killer, a signal) and says so. What the session process does on its side
is `tirl.sandbox._session_process`.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

from tirl.sandbox._wire import HEADER, MAX_FRAME, decode, encode
from tirl.sandbox.api import SessionBase
from tirl.sandbox.result import ExecResult, Status

if TYPE_CHECKING:  # an annotation only: the sandbox's module imports this one
    from tirl.sandbox.local import Sandbox

# A session between cells only waits for the next one; if it has not even read a cell after
# this long, it is stopped or starved beyond use (not counted against the cell's timeout).
CELL_START_TIMEOUT_S = 30.0
REPLY_WAIT_S = 30.0  # bound on reading a result whose first bytes have arrived
EXIT_WAIT_S = 2.0  # how long to wait for the zygote to report a session's exit status


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds the limit")
    return decode(await reader.readexactly(n))


class Session(SessionBase):
    """One stateful interpreter process. Create with `await sandbox.session()`.

    `run` calls on one session are serialized; run many sessions concurrently instead.
    Cancelling a `run` mid-cell kills the session (its state would be inconsistent).
    """

    def __init__(
        self,
        sandbox: Sandbox,
        sid: str,
        pid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sock: socket.socket,
        isolation: dict[str, Any],
    ) -> None:
        self.id = sid
        self.history: list[str] = []
        self.pid = pid
        self.isolation = isolation  # what the session process could isolate; see the docstring
        self._sandbox = sandbox
        self._generation = sandbox._generation  # which zygote forked it (pids are per zygote)
        self._reader = reader
        self._writer = writer
        self._sock = sock  # the socket under reader/writer: a fork request sends an fd with it
        self._lock = asyncio.Lock()
        self._dead_reason: str | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._dead_reason is None

    @property
    def net_isolated(self) -> bool:
        return bool(self.isolation.get("net"))

    async def _execute(self, code: str, timeout_s: float | None) -> ExecResult:
        timeout = self._sandbox.limits.timeout_s if timeout_s is None else timeout_s
        if not self.alive:
            return ExecResult(Status.KILLED, detail=self._dead_reason or "")
        async with self._lock:
            if not self.alive:
                return ExecResult(Status.KILLED, detail=self._dead_reason or "")
            return await self._run_locked(code, timeout)

    async def _run_locked(self, code: str, timeout: float) -> ExecResult:
        start = time.monotonic()
        loop = asyncio.get_running_loop()
        started, replying = loop.create_future(), loop.create_future()
        read = asyncio.ensure_future(self._exchange(code, started, replying))
        interrupted = False
        try:
            # The timeout counts from the moment the session has read the cell, so a loaded
            # machine's scheduling delay before that is not charged to the cell.
            await asyncio.wait(
                {read, started}, timeout=CELL_START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
            if not read.done() and not started.done():
                read.cancel()
                self._kill("it did not start a cell in time; all variables are lost")
                return ExecResult(
                    Status.TIMEOUT,
                    duration_s=time.monotonic() - start,
                    timeout_s=timeout,
                    detail=f"the session did not start the cell within {CELL_START_TIMEOUT_S:g} s",
                )
            if not read.done():
                await asyncio.wait({read}, timeout=timeout)
            if not read.done():
                interrupted = True
                # The grace period starts once the zygote has delivered the interrupt, not when
                # it was queued: a busy control channel must not turn a timeout into a kill.
                await self._sandbox._interrupt(self)
                await asyncio.wait({read}, timeout=self._sandbox.limits.grace_s)
                if not read.done() and await self._reply_on_its_way(replying):
                    await asyncio.wait({read}, timeout=REPLY_WAIT_S)
            if not read.done():
                read.cancel()
                self._kill(
                    "it was killed after an earlier cell ignored the timeout interrupt;"
                    " all variables are lost"
                )
                return ExecResult(
                    Status.TIMEOUT,
                    duration_s=time.monotonic() - start,
                    timeout_s=timeout,
                    detail="the cell ignored the interrupt and the session was killed",
                )
        except asyncio.CancelledError:
            read.cancel()
            self._kill("a run was cancelled while a cell was executing; all variables are lost")
            raise

        try:
            msg = read.result()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            return await self._died(start)
        duration = time.monotonic() - start
        status = {"ok": Status.OK, "error": Status.ERROR, "memory": Status.MEMORY}[msg["status"]]
        if interrupted and msg.get("interrupted"):
            status = Status.TIMEOUT
        detail = ""
        if status is Status.MEMORY:
            limit = self._sandbox.limits.memory_mb
            detail = msg.get("message") or f"the memory limit of {limit} MB was exceeded"
        return ExecResult(
            status=status,
            stdout=msg.get("stdout", ""),
            stderr=msg.get("stderr", ""),
            traceback=msg.get("traceback"),
            stdout_truncated=bool(msg.get("stdout_truncated")),
            stderr_truncated=bool(msg.get("stderr_truncated")),
            duration_s=duration,
            peak_memory_mb=msg.get("peak_memory_mb"),
            timeout_s=timeout if status is Status.TIMEOUT else None,
            detail=detail,
        )

    async def _exchange(
        self, code: str, started: asyncio.Future, replying: asyncio.Future
    ) -> dict[str, Any]:
        """Send one cell; resolve `started` when the session has read it and `replying` when
        the first bytes of its result arrive; return the result."""
        self._writer.write(encode({"op": "exec", "code": code}))
        await self._writer.drain()
        if (await read_frame(self._reader)).get("event") != "started":
            raise ValueError("the session broke the protocol")
        started.set_result(None)
        (n,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
        replying.set_result(None)
        if n > MAX_FRAME:
            raise ValueError(f"frame of {n} bytes exceeds the limit")
        return decode(await self._reader.readexactly(n))

    async def _reply_on_its_way(self, replying: asyncio.Future) -> bool:
        """After the grace period: has the session begun to answer? A reply that arrived in
        the same event-loop turn as the grace timer is still on its way to the reading task,
        and a slow reader must not get an answering session killed."""
        await asyncio.sleep(0)  # let the reading task take what the loop has already received
        if replying.done():
            return True
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # a byte, or b"" at EOF
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True  # the socket broke: the reading task is about to see it

    async def _died(self, start: float) -> ExecResult:
        """The session's socket closed mid-cell: find out why and mark the session dead."""
        if self._closed:
            reason = self._dead_reason or "the session was closed"
            return ExecResult(Status.KILLED, duration_s=time.monotonic() - start, detail=reason)
        code = await self._sandbox._exit_code(self, EXIT_WAIT_S)
        self._kill(f"it died in an earlier cell ({describe_exit(code)}); all variables are lost")
        duration = time.monotonic() - start
        cpu_s = self._sandbox.limits.cpu_s
        if code == -signal.SIGXCPU and cpu_s is not None:
            detail = f"the CPU time limit of {cpu_s} s was exceeded"
            return ExecResult(Status.TIMEOUT, duration_s=duration, detail=detail)
        return ExecResult(Status.KILLED, duration_s=duration, detail=describe_exit(code))

    def _kill(self, reason: str) -> None:
        if self._dead_reason is None:
            self._dead_reason = reason
        self._sandbox._signal(self, signal.SIGKILL)
        self._writer.close()

    async def close(self) -> None:
        """Kill the session's processes and wait until the zygote has reaped them."""
        if self._closed:
            return
        self._closed = True
        self._kill("the session was closed")
        await self._sandbox._exit_code(self, EXIT_WAIT_S)
        self._sandbox._forget(self)

    async def _branch(self) -> Session:
        async with self._lock:
            return await self._sandbox._fork(self)

    async def _replace(self) -> None:
        await self.close()
        fresh = await self._sandbox._spawn()
        self._sandbox._sessions.discard(fresh)
        self.pid, self.isolation, self._generation = fresh.pid, fresh.isolation, fresh._generation
        self._reader, self._writer, self._sock = fresh._reader, fresh._writer, fresh._sock
        self._dead_reason, self._closed = None, False
        self._sandbox._sessions.add(self)
