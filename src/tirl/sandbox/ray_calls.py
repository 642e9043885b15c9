"""How the pool calls one sandbox actor: `ActorSlot`, the caller's side of `SandboxActor`.

A slot holds the actor's handle, what its `ready` said (pid, node, endpoint), the sessions
placed on it, and why it died. Its `call` sends a method the cheapest way the data path allows:
- `run` and `run_once` on the "socket" data path go over the actor's WebSocket
  (`tirl.sandbox.ray_socket.ActorSocket`); when the socket fails, one `ready` call asks Ray
  whether the actor lives, restarted or not ("Failures" in `tirl.sandbox.ray_pool`);
- the calls of a session (`MAILBOX_METHODS`) travel in `exchange` actor calls that carry many
  at once (`_Mailbox`; "Calls over Ray" in `tirl.sandbox.ray_pool`);
- the rest (ready, stats, shutdown) are plain actor calls.
Every call is bounded, and an actor that is gone raises `ActorGone`, so a session on it returns
KILLED instead of waiting. The actor itself (`SandboxActor`) is in `tirl.sandbox.ray_pool`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import secrets
import time
from typing import Any

import ray
import ray.exceptions

from tirl.sandbox.api import SandboxError
from tirl.sandbox.channel import Unreachable
from tirl.sandbox.local import EXIT_WAIT_S, START_TIMEOUT_S
from tirl.sandbox.ray_socket import ActorSocket

MAILBOX_METHODS = frozenset({"create", "run", "fork", "close", "run_once"})  # through `exchange`
SOCKET_METHODS = frozenset({"run", "run_once"})  # over the actor's socket (data_path "socket")
POLL_WAIT_S = 10.0  # an exchange waits this long for a reply before it returns empty
RPC_MARGIN_S = 30.0  # added to every remote call's own bound before it counts as lost
ACTOR_START_S = 60.0  # a Ray worker process start, on top of the zygote's START_TIMEOUT_S
PROBE_RETRY_S = 0.2  # asking Ray about an actor it calls unavailable (restarting): again after


class ActorGone(SandboxError):
    """The actor behind a slot died or stopped answering; its sessions are lost."""


# Lines of Ray's error messages that identify the actor, which the slot's label already does.
_RAY_ID_LINE = re.compile(r"^(class_name|actor_id|pid|name|namespace|ip):")


def short_error(error: BaseException, limit: int = 300) -> str:
    """Ray's messages span many lines; keep one short line for `ExecResult.detail`."""
    lines = (line.strip() for line in str(error).splitlines())
    text = " ".join(line for line in lines if line and not _RAY_ID_LINE.match(line))
    text = text or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _await_ref(ref: ray.ObjectRef, timeout: float, cancel: bool) -> Any:
    """Await a Ray result from whichever event loop is running. With `cancel`, a timeout or a
    cancelled caller also cancels the remote call (for a cell: interrupts it, killing its
    session); without, the remote call finishes on its own (bounded on the actor's side)."""
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        if cancel:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        raise


class _Mailbox:
    """The calls of one event loop to one actor, carried by `exchange` (module docstring).

    Requests made in the same turn of the event loop go out in one actor call; replies come
    back in whichever exchange call returns next. One exchange is kept in flight while any
    request waits for its reply, and none when nothing does."""

    def __init__(self, slot: ActorSlot, box_id: tuple[str, int]) -> None:
        self.slot = slot
        self.box_id = box_id
        self.loop = asyncio.get_running_loop()
        self.pending: dict[int, asyncio.Future] = {}  # request id -> (ok, value)
        self.outbox: list[tuple[int, str, tuple]] = []
        self.cancels: list[int] = []
        self.next_id = 0
        self.in_flight = 0  # exchange calls sent and not returned
        self.flush_due = False

    async def call(self, method: str, args: tuple, timeout: float, cancel: bool) -> Any:
        rid = self.next_id
        self.next_id += 1
        reply = self.loop.create_future()
        self.pending[rid] = reply
        self.outbox.append((rid, method, args))
        self._schedule()
        timer = self.loop.call_later(timeout, _expire, reply)
        try:
            found = await reply
        except asyncio.CancelledError:
            if cancel:
                self.cancel(rid)
            raise
        finally:
            timer.cancel()
            self.pending.pop(rid, None)
        if found is None:  # the timer
            if cancel:
                self.cancel(rid)
            raise asyncio.TimeoutError
        ok, value = found
        if not ok:
            raise SandboxError(f"the {self.slot.label} failed: {value}")
        return value

    def cancel(self, rid: int) -> None:
        """Cancel a request on the actor (a cell then kills its session, as a cancelled run
        does locally)."""
        if any(queued[0] == rid for queued in self.outbox):
            self.outbox = [q for q in self.outbox if q[0] != rid]  # never sent
        else:
            self.cancels.append(rid)
            self._schedule()

    def fail_all(self, error: BaseException) -> None:
        for reply in self.pending.values():
            if not reply.done():
                reply.set_exception(error)
        self.pending.clear()
        self.outbox, self.cancels = [], []

    def _schedule(self) -> None:
        if not self.flush_due:
            self.flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_due = False
        if self.slot.dead_reason is not None:
            self.fail_all(ActorGone(f"the {self.slot.label} died: {self.slot.dead_reason}"))
            return
        if not (self.outbox or self.cancels or (self.pending and self.in_flight == 0)):
            return
        calls, cancels, self.outbox, self.cancels = self.outbox, self.cancels, [], []
        self.in_flight += 1
        try:
            ref = self.slot.handle.exchange.remote(self.box_id, calls, cancels, POLL_WAIT_S)
            future = asyncio.wrap_future(ref.future(), loop=self.loop)
        except Exception as e:  # the handle itself is unusable
            self.in_flight -= 1
            self._actor_failed(e)
            return
        future.add_done_callback(self._returned)

    def _returned(self, future: asyncio.Future) -> None:
        self.in_flight -= 1
        if future.cancelled():
            return  # the loop is closing
        error = future.exception()
        if error is not None:
            self._actor_failed(error)
            return
        for rid, ok, value in future.result():
            reply = self.pending.get(rid)
            if reply is not None and not reply.done():
                reply.set_result((ok, value))
        if self.pending and self.in_flight == 0:
            self._schedule()  # keep one exchange waiting for the replies still to come

    def _actor_failed(self, error: BaseException) -> None:
        if isinstance(error, ray.exceptions.RayTaskError):  # exchange itself raised: a bug
            self.fail_all(SandboxError(f"the {self.slot.label} failed: {short_error(error)}"))
            return
        if self.slot.dead_reason is None:
            self.slot.dead_reason = short_error(error)
        self.fail_all(ActorGone(f"the {self.slot.label} died: {self.slot.dead_reason}"))


def _expire(reply: asyncio.Future) -> None:
    if not reply.done():
        reply.set_result(None)


class ActorSlot:
    """One sandbox actor as the pool sees it: its handle, where it runs, and its sessions.

    The only asyncio objects it holds are in its `_Mailbox` and `ActorSocket`, which it
    replaces when called from another event loop, so a pool can be used from one event loop
    after another."""

    def __init__(self, index: int, handle: ray.actor.ActorHandle, data_path: str) -> None:
        self.index = index
        self.handle = handle
        self.data_path = data_path
        self.ready_ref = handle.ready.remote()
        self.info: dict[str, Any] | None = None  # what `ready` returned (again after a restart)
        self.dead_reason: str | None = None
        self.session_ids: set[str] = set()  # sessions placed here (and run_once calls running)
        self._token = secrets.token_hex(4)  # names this caller's mailboxes on the actor
        self._mailbox: _Mailbox | None = None
        self._generation = 0
        self._socket: ActorSocket | None = None
        # A `ready` call asking after a socket failed, and a future that says when it answered.
        self._probe: tuple[ray.ObjectRef, concurrent.futures.Future] | None = None
        self._background: set[asyncio.Task] = set()

    @property
    def label(self) -> str:
        if self.info is None:
            return f"sandbox actor {self.index}"
        node = self.info["node_id"][:8]
        return f"sandbox actor {self.index} (pid {self.info['pid']} on node {node})"

    async def wait_ready(self) -> None:
        """Wait until the actor runs its sandbox; one that does not start in time is dead."""
        if self.info is not None:
            return
        bound = START_TIMEOUT_S + ACTOR_START_S
        try:
            self.info = await self._call_ref(self.ready_ref, bound, cancel=False)
        except asyncio.TimeoutError as e:
            if self.dead_reason is None:
                self.dead_reason = f"it did not start its sandbox within {bound:.0f} s"
                self.kill()
            raise ActorGone(f"the {self.label} died: {self.dead_reason}") from e

    async def call(
        self,
        method: str,
        *args: Any,
        timeout: float,
        cancel: bool = False,
        boot: str | None = None,
    ) -> Any:
        """One remote call. Raises ActorGone if the actor is (or turns out to be) dead, or no
        longer the process `boot` of a session, SandboxError if the method raised,
        asyncio.TimeoutError if it did not answer in time."""
        if self.dead_reason is not None:
            raise ActorGone(f"the {self.label} died: {self.dead_reason}")
        await self.wait_ready()
        if method in SOCKET_METHODS and self.data_path == "socket":
            return await self._over_socket(method, args, timeout, cancel, boot)
        if method in MAILBOX_METHODS:
            return await self._box().call(method, args, timeout, cancel)
        ref = getattr(self.handle, method).remote(*args)
        return await self._call_ref(ref, timeout, cancel)

    def same_process(self, boot: str | None) -> bool:
        """Whether the actor is still the process that made a session (`create`'s `boot`)."""
        return boot is None or self.info is None or self.info["boot"] == boot

    # -- the socket data path (tirl.sandbox.ray_socket) -----------------------------------

    async def _over_socket(
        self, method: str, args: tuple, timeout: float, cancel: bool, boot: str | None
    ) -> dict[str, Any]:
        """`run` or `run_once` over the actor's socket, as `call` answers them. When the socket
        fails, Ray says whether the actor lives (see "Failures" in the module docstring)."""
        if method == "run":
            sid, code, timeout_s = args
            msg = {"op": "run", "session": sid, "code": code, "timeout_s": timeout_s}
        else:
            sid, (code, timeout_s) = None, args
            msg = {"op": "run_once", "code": code, "timeout_s": timeout_s}
        deadline = time.monotonic() + timeout  # for the whole call, reconnecting included
        for attempt in range(2):
            self._check_process(boot)
            left = max(deadline - time.monotonic(), 0.0)
            try:
                status, body, alive = await self._current_socket().request(msg, left)
            except Unreachable as e:
                lost = e
            except asyncio.CancelledError:
                if cancel and sid is not None:
                    self._close_later(sid)  # ends a running cell, as a cancelled local run does
                raise
            else:
                if status != 200:
                    raise SandboxError(f"the {self.label} answered {status}: {body.get('error')}")
                if method == "run":
                    body["alive"] = alive
                return body
            try:
                if lost.timed_out:
                    raise asyncio.TimeoutError
                # ActorGone if the actor is dead; TimeoutError if Ray does not answer in time
                await self.refresh(deadline - time.monotonic())
            except asyncio.TimeoutError:
                if cancel and sid is not None:
                    self._close_later(sid)
                raise asyncio.TimeoutError from None
            self._check_process(boot)
            if lost.sent or attempt:  # the cell may have run; its reply is lost
                if sid is not None:
                    self._close_later(sid)
                raise SandboxError(f"lost the socket to the {self.label} ({lost})")
            # The actor lives and the request did not leave: send it again.
        raise AssertionError("unreachable")

    def _check_process(self, boot: str | None) -> None:
        if not self.same_process(boot):
            raise ActorGone(
                f"the {self.label} died and Ray restarted it; the sessions of its old process"
                " died with it"
            )

    def _current_socket(self) -> ActorSocket:
        assert self.info is not None
        loop = asyncio.get_running_loop()
        sock = self._socket
        if sock is None or sock.loop is not loop or sock.url != self.info["url"]:
            if sock is not None and sock.loop is loop:  # the actor restarted elsewhere
                self._spawn(sock.close())
            sock = self._socket = ActorSocket(self.info["url"], self.info["key"])
        return sock

    async def refresh(self, within_s: float) -> None:
        """After the socket failed: ask Ray whether the actor lives and where its endpoint is
        now (a restarted actor has a new one). Raises ActorGone if the actor is dead, and
        asyncio.TimeoutError if Ray has no answer within `within_s` (the actor may be stopped
        or busy; the question stays asked for the next caller). One `ready` call answers every
        session that asks while it is pending."""
        deadline = time.monotonic() + within_s
        while True:
            if self.dead_reason is not None:
                raise ActorGone(f"the {self.label} died: {self.dead_reason}")
            if self._probe is None or self._probe[1].done():
                ref = self.handle.ready.remote()
                self._probe = (ref, ref.future())
            ref = self._probe[0]
            try:
                # Not the shared future itself: a caller that times out cancels what it awaits.
                info = await _await_ref(ref, max(deadline - time.monotonic(), 0.0), False)
            except ray.exceptions.ActorUnavailableError:  # restarting: ask again
                await asyncio.sleep(PROBE_RETRY_S)
                continue
            except ray.exceptions.RayTaskError as e:
                raise SandboxError(f"the {self.label} failed: {short_error(e.cause or e)}") from e
            except ray.exceptions.RayError as e:  # the actor, its worker or its node is gone
                if self.dead_reason is None:
                    self.dead_reason = short_error(e)
                continue
            self.info = info
            return

    def _close_later(self, sid: str) -> None:
        """End session `sid` on the actor without waiting (its cell's reply will not come)."""

        async def close() -> None:
            with contextlib.suppress(SandboxError, asyncio.TimeoutError):
                await self.call("close", sid, timeout=EXIT_WAIT_S + RPC_MARGIN_S)

        self._spawn(close())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close_socket(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None and sock.loop is asyncio.get_running_loop():
            await sock.close()

    def _box(self) -> _Mailbox:
        loop = asyncio.get_running_loop()
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._generation += 1
            self._mailbox = _Mailbox(self, (self._token, self._generation))
        return self._mailbox

    async def _call_ref(self, ref: ray.ObjectRef, timeout: float, cancel: bool) -> Any:
        try:
            return await _await_ref(ref, timeout, cancel)
        except ray.exceptions.RayTaskError as e:  # the method raised; the actor lives on
            if ref is self.ready_ref:
                self.dead_reason = f"it failed to start its sandbox: {short_error(e.cause or e)}"
                raise ActorGone(f"the {self.label} died: {self.dead_reason}") from e
            raise SandboxError(f"the {self.label} failed: {short_error(e.cause or e)}") from e
        except ray.exceptions.RayError as e:  # the actor, its worker or its node is gone
            if self.dead_reason is None:
                self.dead_reason = short_error(e)
            raise ActorGone(f"the {self.label} died: {self.dead_reason}") from e

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            ray.kill(self.handle, no_restart=True)
