"""Stateful Python sessions on a pool of Ray actors, for rollouts spread over a cluster.

How it works. Each `SandboxActor` is an async Ray actor that owns one local `Sandbox` (a zygote
process and its forked sessions, see `tirl.sandbox.local`). `RaySandboxPool` starts
`num_actors` of them with Ray's SPREAD strategy, so on a cluster they land on different nodes
(one per CPU node is the intended layout, see ../shared/research/sandboxes.md 7.4). A new
session goes to the actor with the fewest live sessions and stays pinned there: the pool keeps
the session id -> actor map on the caller's side. Session ids are made by the caller, so a session
keeps its id when `restore()` rebuilds it on another actor.

Data path. A Ray actor call costs about 1.6 ms round trip even idle, more than the 1 ms a cell
may add, so by default (`data_path="socket"`) cells (`run`, `run_once`) do not travel as Ray
calls: each actor serves the channel endpoint of `tirl sandbox serve` on its node, `ready()`
gives the pool its address and key, and the pool sends cells over one WebSocket per actor and
event loop (tirl.sandbox.ray_socket; +0.3 ms a cell instead of +2.7 ms, BENCHMARKS.md). Ray
carries the rest (ready, create, fork, close, stats, shutdown) as below, and keeps placement,
restarts and node failures. `data_path="ray"` sends cells as Ray calls too.

Calls over Ray. An actor call costs about a millisecond of CPU on each side (more on a loaded
machine), more than a small cell, so the calls of a session (create, fork, close, and run and
run_once on the "ray" data path) travel in
`exchange` calls that carry many at once, the way the HTTP transport's channel does
(tirl.sandbox.channel): everything the caller's event loop asks of one actor in one turn goes
out in one exchange, and an exchange returns every reply that is ready, waiting in line for
one when there is none (up to POLL_WAIT_S; each reply wakes the first exchange in line, the
last running request all of them), so a reply leaves as soon as it is ready. While any reply
is outstanding at least one exchange stays in flight; when none is, nothing is polled. When
COALESCE_MIN_RUNNING or more
requests are running on the actor (the cells queue for the CPU anyway), an exchange that has
replies waits COALESCE_S for more before it returns. Idle, a cell costs one actor call, as a
direct call would; saturated, one call carries many cells. A request the caller stops waiting
for (timeout, cancelled) is cancelled on the actor by the next exchange, which kills a running
cell's session as a cancelled local run does.

Resources. The actor reserves `num_cpus=0` by default. A math cell spends most of its life idle
while the model writes the next turn, so reserving a CPU per actor (or per session) would keep
training tasks from being scheduled for no gain. CPU use is bounded per session by
`SandboxLimits.cpu_s` if needed. Pass `num_cpus=` (or `actor_options`) to reserve more when cells
are CPU-heavy and the cluster's CPUs are oversubscribed.

Failures. Every remote call is bounded by `asyncio.wait_for` (cell timeout + grace + margin), so
nothing waits forever on a lost actor. When an actor dies (node lost, OOM killer, `ray.kill`),
every call on its sessions returns `Status.KILLED` with `detail` "the sandbox actor ... died:
...", and `alive` turns False for all of them; the pool starts a fresh actor in its place for new
sessions. `restore()` recreates such a session on a live actor and replays its client-side
history (see `tirl.sandbox.api.SessionBase`). A stateless `run_once` whose actor dies returns
KILLED and is not retried: the cell itself may be what killed it.
On the socket, an actor's death shows as the connection closing (its process is gone, so the
kernel closes its end): the calls waiting on it fail, and the pool asks Ray (one `ready` call
per actor, whoever asks) whether the actor lives. Dead: as above. Restarted by Ray (with
`actor_options={"max_restarts": n}`): `ready` starts the new process's sandbox and endpoint and
gives its new address, which new sessions then use; the sessions of the old process (each knows
which, from `create`) return KILLED "... died and Ray restarted it". Alive and the same process
(only the connection was lost): a request that had not left is sent again on a new connection;
one that had may have run, so its session is closed and reported KILLED. A cell with no reply
within its bound, or cancelled, closes its session on the actor (through Ray), as a cancelled
local run kills it. A malformed request on the socket gets an error for itself alone.

Network safety on one machine. `init_local_ray()` starts a single-machine cluster that only ever
talks over loopback (`RaySandboxPool.start()` calls it when Ray is not initialized yet). Plain
`ray.init()` is not loopback-only, even with `_node_ip_address="127.0.0.1"` (checked in Ray
2.60's source and with strace in an isolated network namespace):
- `ray.init` passes that address through `resolve_ip_for_localhost`, which turns a loopback
  address into `node_ip_address_from_perspective()`: a UDP `connect()` to 8.8.8.8:53 (or
  [2001:4860:4860::8888]:53) to learn the outgoing interface's address, which then becomes the
  node address, so GCS, raylet and workers talk over the external interface. We make Ray's
  `get_node_ip_address` return the loopback address instead (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  for Ray's processes, the same constant patched in this process for the duration of `ray.init`).
- even with `include_dashboard=False`, Ray starts a minimal dashboard process for its usage-stats
  module, which probes cloud metadata services (http://169.254.169.254, a DNS lookup of
  metadata.google.internal) whether or not usage stats are enabled. Ray's processes get an HTTP
  proxy on a closed loopback port, with loopback itself exempt, so those requests fail locally.
- RAY_USAGE_STATS_ENABLED=0 keeps Ray from reporting usage to usage-stats.ray.io, and
  RAY_USAGE_STATS_REPORT_URL points at the closed loopback port in case a report is sent anyway
  (a cluster started by `ray start` sends one "disabled" report even when usage stats are off).
The result was checked by tracing every process's connect/sendto calls while this module's tests
ran: only 127.0.0.1 appeared.
A local cluster ends with the process that started it, kill -9 included: Ray's GCS and raylet
die with it on their own, and `tirl.sandbox._ray_reaper` ends the raylet's agents and workers,
which would otherwise linger for minutes.
Sessions inherit none of this: the zygote starts from an allowlist of variables, and each
session has its own network namespace where that works (see `tirl.sandbox.local`).

On a real cluster. Start Ray on every node first (`ray start --head --disable-usage-stats`, then
`ray start --address=HEAD:6379` on the others; tirl must be importable on every node), then in
the trainer::

    ray.init(address="auto")
    async with RaySandboxPool(num_actors=len(ray.nodes()), limits=SandboxLimits(...)) as pool:
        session = await pool.session()

Ray then uses the nodes' real addresses, by design: the loopback-only rule above is for the
single-machine setup. Do not give a multi-node cluster the proxy variables (gRPC honours them
too, and the nodes would not reach each other). Its dashboard probes the cloud metadata service
and sends one "usage stats disabled" report, unless RAY_USAGE_STATS_REPORT_URL points elsewhere.
Each actor's socket endpoint binds its node's address as Ray knows it (or `endpoint_host`) on a
port the OS picks, so the trainer must reach the nodes on any port, as Ray's own workers do; it
wants a random key per actor process, and has no TLS (cells and output cross the network in
clear text: use `data_path="ray"` where that matters more than 2 ms a cell).

Not covered: back-pressure (an actor starts every request it is sent; opens wait inside its
sandbox's `max_starting`, cells on the CPU); fork across actors (a fork always lives on its
parent's actor).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import ray.exceptions

from tirl.sandbox.api import SandboxClient, SandboxError, SessionBase
from tirl.sandbox.channel import Unreachable, result_from_wire, result_to_wire
from tirl.sandbox.local import (
    DEFAULT_PRELOAD,
    EXIT_WAIT_S,
    START_TIMEOUT_S,
    Sandbox,
    SandboxLimits,
    Session,
)
from tirl.sandbox.ray_socket import ActorEndpoint, ActorSocket
from tirl.sandbox.result import ExecResult, Status

MAX_CONCURRENCY = 1000  # concurrent calls per actor: cells mostly wait, so many can be in flight
MAILBOX_METHODS = frozenset({"create", "run", "fork", "close", "run_once"})  # through `exchange`
SOCKET_METHODS = frozenset({"run", "run_once"})  # over the actor's socket (data_path "socket")
DATA_PATHS = ("socket", "ray")
POLL_WAIT_S = 10.0  # an exchange waits this long for a reply before it returns empty
MAX_WAITING = 64  # exchanges waiting on one actor (each holds one of its MAX_CONCURRENCY slots)
COALESCE_S = 0.005  # with COALESCE_MIN_RUNNING requests running, an exchange waits this long
COALESCE_MIN_RUNNING = 16  # for more replies before it returns (one actor call carries them all)
RPC_MARGIN_S = 30.0  # added to every remote call's own bound before it counts as lost
ACTOR_START_S = 60.0  # a Ray worker process start, on top of the zygote's START_TIMEOUT_S
PROBE_RETRY_S = 0.2  # asking Ray about an actor it calls unavailable (restarting): again after
# A proxy on a loopback port where nothing listens: HTTP requests by Ray's own processes fail
# there instead of reaching cloud metadata services. Port 9 is "discard".
DEAD_PROXY = "http://127.0.0.1:9"
LOOPBACK_NAMES = "127.0.0.1,localhost,::1"


# -- a loopback-only local cluster -------------------------------------------------------------


def _loopback_env() -> dict[str, str]:
    """Variables that keep Ray's own processes (GCS, raylet, dashboard, workers) on loopback.

    Only for a single-machine cluster: gRPC honours the proxy variables as well, and goes
    direct only to the loopback names in no_proxy."""
    env = {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_USAGE_STATS_REPORT_URL": DEAD_PROXY + "/",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # get_node_ip_address -> loopback, no 8.8.8.8
        "no_proxy": LOOPBACK_NAMES,
        "NO_PROXY": LOOPBACK_NAMES,
    }
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = DEAD_PROXY
    return env


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Set `_loopback_env()` and Ray's ENABLE_RAY_CLUSTER constant, and put both back after.

    The processes `ray.init` starts inherit the variables; this process keeps its own. The
    constant is patched too because Ray read the variable when it was first imported."""
    from ray._private import ray_constants

    saved_env = {k: os.environ.get(k) for k in _loopback_env()}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(_loopback_env())
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_REAPERS: list[subprocess.Popen] = []  # kept: their stdin pipes must stay open while we live


def _raylet_pid() -> int | None:
    """The pid of the raylet `ray.init` started here (None if Ray's internals changed)."""
    from ray._private import ray_constants

    try:
        node = ray._private.worker._global_node
        return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    except (AttributeError, KeyError, IndexError):
        return None


def _reap_when_gone(raylet_pid: int | None) -> None:
    """Start `tirl.sandbox._ray_reaper`: when this process ends, however it ends, the agents
    and workers of the local cluster end too, not minutes later (see that module)."""
    if raylet_pid is None or not sys.platform.startswith("linux"):
        return
    script = Path(__file__).with_name("_ray_reaper.py")
    _REAPERS.append(
        subprocess.Popen(
            [sys.executable, "-I", str(script), str(raylet_pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is not for it
        )
    )


def init_local_ray(num_cpus: int | None = None, **ray_init_kwargs: Any) -> None:
    """Start a single-machine Ray cluster that sends nothing outside 127.0.0.0/8.

    Extra keyword arguments go to `ray.init`. Raises SandboxError (after shutting Ray down) if
    Ray still chose a non-loopback node address, which would mean its internals changed."""
    with _loopback_only():
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            **ray_init_kwargs,
        )
    _reap_when_gone(_raylet_pid())
    address = ray.util.get_node_ip_address()
    if not address.startswith("127."):
        ray.shutdown()
        raise SandboxError(
            f"Ray chose the node address {address} instead of a loopback one; refusing to run"
            " a local cluster that is reachable from the network"
        )


# -- the actor ---------------------------------------------------------------------------------


@ray.remote
class SandboxActor:
    """One local `Sandbox` inside a Ray actor; sessions are addressed by ids the caller makes.

    Runs as an async actor: every method is a coroutine on the actor's event loop, where the
    sandbox is started (lazily, by `ready`). Results cross the wire as `ExecResult.to_dict()`.
    """

    def __init__(
        self,
        limits: SandboxLimits,
        preload: tuple[str, ...],
        pool_size: int,
        endpoint_host: str | None = None,
        serve_socket: bool = True,
    ) -> None:
        self._sandbox = Sandbox(limits, preload=preload, pool_size=pool_size)
        self._sessions: dict[str, Session] = {}
        self._cells: Counter[str] = Counter()
        self._boxes: dict[tuple[str, int], _Box] = {}
        self._boot = secrets.token_hex(8)  # this process of the actor (Ray may restart it)
        self._endpoint = ActorEndpoint(self, limits.timeout_s) if serve_socket else None
        self._endpoint_host = endpoint_host
        self._starting = asyncio.Lock()
        self._exchanged = 0  # requests that came through `exchange` (the Ray data path)

    async def exchange(
        self,
        box_id: tuple[str, int],
        calls: list[tuple[int, str, tuple]],
        cancels: list[int],
        wait_s: float,
    ) -> list[tuple[int, bool, Any]]:
        """Many calls in one actor call (see "Calls" in the module docstring): start `calls`
        (request id, method, args), cancel the requests in `cancels`, and return the replies
        that are ready as (request id, True, value) or (request id, False, error). With none
        ready, waits up to `wait_s` for one, in line behind the exchanges already waiting (each
        reply wakes the first in line), so a reply finds an exchange to carry it at once."""
        box = self._boxes.get(box_id)
        if box is None:  # a caller's new event loop: the old loop's replies have no reader
            for old in [k for k in self._boxes if k[0] == box_id[0] and k[1] < box_id[1]]:
                del self._boxes[old]
            box = self._boxes[box_id] = _Box()
        for rid in cancels:
            task = box.tasks.pop(rid, None)
            if task is not None:
                task.cancel()
        loop = asyncio.get_running_loop()
        self._exchanged += len(calls)
        for rid, method, args in calls:
            box.tasks[rid] = loop.create_task(self._serve(box, rid, method, args))
        if not box.ready and wait_s > 0 and len(box.waiters) < MAX_WAITING:
            waiter = loop.create_future()
            box.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, wait_s)
            except asyncio.TimeoutError:
                pass
            finally:
                with contextlib.suppress(ValueError):
                    box.waiters.remove(waiter)
        if box.ready and len(box.tasks) >= COALESCE_MIN_RUNNING:
            # Saturated: cells queue for the CPU far longer than this, and each actor call costs
            # about a millisecond of CPU on either side, so gather a few more replies first.
            await asyncio.sleep(COALESCE_S)
        replies, box.ready = box.ready, []
        return replies

    async def _serve(self, box: _Box, rid: int, method: str, args: tuple) -> None:
        try:
            if method not in MAILBOX_METHODS:
                raise SandboxError(f"{method!r} cannot be called through exchange")
            reply = (rid, True, await getattr(self, method)(*args))
        except asyncio.CancelledError:
            box.tasks.pop(rid, None)  # the caller gave up on it
            return
        except Exception as e:
            reply = (rid, False, _short(e))
        box.tasks.pop(rid, None)
        box.ready.append(reply)
        # The first reply since the last collection wakes the first exchange in line; the last
        # request running wakes them all (none is left holding an actor slot for nothing).
        wake = len(box.waiters) if not box.tasks else int(len(box.ready) == 1)
        while wake and box.waiters:
            waiter = box.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                wake -= 1

    async def ready(self) -> dict[str, Any]:
        """Start the sandbox (zygote and preloads) and the socket endpoint, and say where this
        actor runs: its pid, node, zygote, `boot` (names this process of the actor), and the
        endpoint's `url` and `key` (None without one). Called again, says the same."""
        async with self._starting:
            # Ray runs this loop in a thread that blocks SIGINT; the zygote clears the mask it
            # inherits, so cells still get their timeout interrupt.
            await self._sandbox.start()
            endpoint = self._endpoint
            if endpoint is not None and endpoint.url is None:
                # On a worker, Ray's node address comes from its raylet (no network lookup).
                await endpoint.start(self._endpoint_host or ray.util.get_node_ip_address())
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "zygote_pid": self._sandbox.zygote_pid,
            "boot": self._boot,
            "url": endpoint.url if endpoint else None,
            "key": endpoint.key if endpoint else None,
        }

    async def create(self, sid: str) -> str:
        """Open session `sid`; returns `boot` (which process of the actor holds it)."""
        if sid in self._sessions:
            raise SandboxError(f"session id {sid} is already in use on this sandbox actor")
        self._sessions[sid] = await self._sandbox.session()
        return self._boot

    async def run(self, sid: str, code: str, timeout_s: float | None) -> dict[str, Any]:
        """`ExecResult.to_dict()` plus "alive": whether the session survived the cell."""
        session = self._sessions.get(sid)
        if session is None:
            detail = f"there is no session {sid} on this sandbox actor (closed or never created)"
            result, alive = ExecResult(Status.KILLED, detail=detail), False
        else:
            # `_execute`, not `run`: the caller validated the arguments and keeps the history.
            result, alive = await session._execute(code, timeout_s), session.alive
        self._cells[result.status.value] += 1
        return {**result_to_wire(result), "alive": alive}

    async def fork(self, sid: str, child_sid: str) -> str:
        parent = self._sessions.get(sid)
        if parent is None:
            raise SandboxError(f"there is no session {sid} on this sandbox actor to fork")
        if child_sid in self._sessions:
            raise SandboxError(f"session id {child_sid} is already in use on this sandbox actor")
        self._sessions[child_sid] = await parent.fork()
        return child_sid

    async def close(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None:
            await session.close()

    async def run_once(self, code: str, timeout_s: float | None) -> dict[str, Any]:
        result = await self._sandbox.run_once(code, timeout_s)
        self._cells[result.status.value] += 1
        return result_to_wire(result)

    async def stats(self) -> dict[str, Any]:
        live = {sid: s for sid, s in self._sessions.items() if s.alive}
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "zygote_pid": self._sandbox.zygote_pid,
            "sessions": len(live),
            "session_pids": {sid: s.pid for sid, s in live.items()},
            "pool_ready": len(self._sandbox._pool),  # forked, waiting for a create
            "cells": dict(self._cells),
            "requests": {  # by data path
                "ray": self._exchanged,
                "socket": self._endpoint.requests if self._endpoint else 0,
            },
        }

    async def shutdown(self) -> None:
        """Kill every session and the zygote before the actor itself is killed."""
        self._sessions.clear()
        await self._sandbox.close()
        if self._endpoint is not None:
            await self._endpoint.close()


class _Box:
    """One caller event loop's requests on an actor: replies not yet collected, the tasks
    answering requests, and the exchange calls waiting for the next reply, first in line first."""

    def __init__(self) -> None:
        self.ready: list[tuple[int, bool, Any]] = []
        self.tasks: dict[int, asyncio.Task] = {}
        self.waiters: collections.deque[asyncio.Future] = collections.deque()


# -- the caller's side -------------------------------------------------------------------------


class _ActorGone(SandboxError):
    """The actor behind a slot died or stopped answering; its sessions are lost."""


# Lines of Ray's error messages that identify the actor, which the slot's label already does.
_RAY_ID_LINE = re.compile(r"^(class_name|actor_id|pid|name|namespace|ip):")


def _short(error: BaseException, limit: int = 300) -> str:
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

    def __init__(self, slot: _ActorSlot, box_id: tuple[str, int]) -> None:
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
            self.fail_all(_ActorGone(f"the {self.slot.label} died: {self.slot.dead_reason}"))
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
            self.fail_all(SandboxError(f"the {self.slot.label} failed: {_short(error)}"))
            return
        if self.slot.dead_reason is None:
            self.slot.dead_reason = _short(error)
        self.fail_all(_ActorGone(f"the {self.slot.label} died: {self.slot.dead_reason}"))


def _expire(reply: asyncio.Future) -> None:
    if not reply.done():
        reply.set_result(None)


class _ActorSlot:
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
            raise _ActorGone(f"the {self.label} died: {self.dead_reason}") from e

    async def call(
        self,
        method: str,
        *args: Any,
        timeout: float,
        cancel: bool = False,
        boot: str | None = None,
    ) -> Any:
        """One remote call. Raises _ActorGone if the actor is (or turns out to be) dead, or no
        longer the process `boot` of a session, SandboxError if the method raised,
        asyncio.TimeoutError if it did not answer in time."""
        if self.dead_reason is not None:
            raise _ActorGone(f"the {self.label} died: {self.dead_reason}")
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
                # _ActorGone if the actor is dead; TimeoutError if Ray does not answer in time
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
            raise _ActorGone(
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
        now (a restarted actor has a new one). Raises _ActorGone if the actor is dead, and
        asyncio.TimeoutError if Ray has no answer within `within_s` (the actor may be stopped
        or busy; the question stays asked for the next caller). One `ready` call answers every
        session that asks while it is pending."""
        deadline = time.monotonic() + within_s
        while True:
            if self.dead_reason is not None:
                raise _ActorGone(f"the {self.label} died: {self.dead_reason}")
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
                raise SandboxError(f"the {self.label} failed: {_short(e.cause or e)}") from e
            except ray.exceptions.RayError as e:  # the actor, its worker or its node is gone
                if self.dead_reason is None:
                    self.dead_reason = _short(e)
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
                self.dead_reason = f"it failed to start its sandbox: {_short(e.cause or e)}"
                raise _ActorGone(f"the {self.label} died: {self.dead_reason}") from e
            raise SandboxError(f"the {self.label} failed: {_short(e.cause or e)}") from e
        except ray.exceptions.RayError as e:  # the actor, its worker or its node is gone
            if self.dead_reason is None:
                self.dead_reason = _short(e)
            raise _ActorGone(f"the {self.label} died: {self.dead_reason}") from e

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            ray.kill(self.handle, no_restart=True)


class RaySession(SessionBase):
    """A session pinned to one sandbox actor. Create with `await pool.session()`.

    `id` is stable across `restore()`, which may move the session to another actor."""

    def __init__(self, pool: RaySandboxPool, sid: str, slot: _ActorSlot, boot: str) -> None:
        self.id = sid
        self.history: list[str] = []
        self._pool = pool
        self._slot = slot
        self._boot = boot  # the process of the actor that holds it (`create` says which)
        self._dead_reason: str | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        slot = self._slot
        return (
            self._dead_reason is None and slot.dead_reason is None and slot.same_process(self._boot)
        )

    @property
    def actor(self) -> ray.actor.ActorHandle:
        """The Ray actor this session lives on (another one after a restore)."""
        return self._slot.handle

    def _mark_dead(self, reason: str) -> None:
        """Remember why; a dead session no longer counts as load on its actor."""
        if self._dead_reason is None:
            self._dead_reason = reason
        self._slot.session_ids.discard(self.id)

    def _killed(self, reason: str, started: float) -> ExecResult:
        self._mark_dead(reason)
        return ExecResult(Status.KILLED, duration_s=time.monotonic() - started, detail=reason)

    async def _execute(self, code: str, timeout_s: float | None) -> ExecResult:
        started = time.monotonic()
        if not self.alive:
            slot = self._slot
            reason = self._dead_reason or (
                f"the {slot.label} died: {slot.dead_reason}"
                if slot.dead_reason is not None
                else f"the {slot.label} died and Ray restarted it; the sessions of its old"
                " process died with it"
            )
            return self._killed(reason, started)
        bound = self._pool._run_bound(timeout_s)
        try:
            d = await self._slot.call(
                "run", self.id, code, timeout_s, timeout=bound, cancel=True, boot=self._boot
            )
        except _ActorGone as e:
            return self._killed(str(e), started)
        except SandboxError as e:
            return self._killed(f"{e}; the session's state is unknown", started)
        except asyncio.TimeoutError:
            return self._killed(
                f"the {self._slot.label} did not answer within {bound:.0f} s", started
            )
        except asyncio.CancelledError:
            self._mark_dead("a run was cancelled while a cell was executing")
            raise
        if not d.pop("alive"):
            self._mark_dead(d.get("detail") or "the session died in its sandbox actor")
        # duration_s is the caller's wall clock, round trip included.
        return result_from_wire(d, time.monotonic() - started)

    async def _branch(self) -> RaySession:
        child_id = secrets.token_hex(6)
        self._slot.session_ids.add(child_id)
        try:
            await self._slot.call("fork", self.id, child_id, timeout=self._pool._slow_bound())
        except BaseException as e:
            self._slot.session_ids.discard(child_id)
            if isinstance(e, asyncio.TimeoutError):
                raise SandboxError(f"the {self._slot.label} did not finish a fork in time") from e
            raise
        return RaySession(self._pool, child_id, self._slot, self._boot)

    async def _replace(self) -> None:
        await self.close()
        self._slot, self._boot = await self._pool._create_remote(self.id)
        self._dead_reason, self._closed = None, False

    async def close(self) -> None:
        """End the session on its actor (if the actor still lives). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._mark_dead("the session was closed")
        if self._slot.dead_reason is None and self._slot.same_process(self._boot):
            with contextlib.suppress(SandboxError, asyncio.TimeoutError):
                await self._slot.call("close", self.id, timeout=EXIT_WAIT_S + self._pool.margin_s)


class RaySandboxPool(SandboxClient):
    """Sessions on `num_actors` sandbox actors. Use as `async with RaySandboxPool(...) as pool:`.

    limits, preload, pool_size: as for `tirl.sandbox.local.Sandbox`, per actor.
    num_cpus: CPUs each actor reserves (0 by default, see the module docstring).
    actor_options: more `ActorClass.options(...)` for each actor (resources, runtime_env,
        max_restarts, ...).
    rpc_margin_s: slack on top of a call's own bound before the call counts as lost.
    data_path: how cells reach the actors: "socket" (default; each actor's WebSocket endpoint,
        see tirl.sandbox.ray_socket) or "ray" (`exchange` actor calls, about 2 ms more a cell).
    endpoint_host: the address each actor's endpoint binds (default: its node's address as Ray
        knows it).
    If Ray is not initialized, `start()` starts a loopback-only local cluster (`init_local_ray`),
    which stays up after `close()`. The pool works from any event loop, one after another.
    """

    def __init__(
        self,
        num_actors: int = 1,
        limits: SandboxLimits | None = None,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        pool_size: int = 0,
        num_cpus: float = 0,
        actor_options: dict[str, Any] | None = None,
        rpc_margin_s: float = RPC_MARGIN_S,
        data_path: str = "socket",
        endpoint_host: str | None = None,
    ) -> None:
        if num_actors < 1:
            raise ValueError(f"num_actors must be at least 1, got {num_actors}")
        if data_path not in DATA_PATHS:
            raise ValueError(f"data_path must be one of {', '.join(DATA_PATHS)}, got {data_path!r}")
        self.data_path = data_path
        self.endpoint_host = endpoint_host
        self.num_actors = num_actors
        self.limits = limits or SandboxLimits()
        self.preload = tuple(preload)
        self.pool_size = pool_size
        self.margin_s = rpc_margin_s
        self._options = {
            "num_cpus": num_cpus,
            "max_concurrency": MAX_CONCURRENCY,
            "max_restarts": 0,
            "scheduling_strategy": "SPREAD",
            **(actor_options or {}),
        }
        self._slots: list[_ActorSlot] = []
        self._replaced = 0
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the actors and wait until each has its sandbox running."""
        if self._closed:
            raise SandboxError("this RaySandboxPool was closed; create a new one")
        if self._slots:
            return
        if not ray.is_initialized():
            init_local_ray()
        self._slots = [self._new_slot(i) for i in range(self.num_actors)]
        try:
            await asyncio.gather(*(slot.wait_ready() for slot in self._slots))
        except BaseException:  # _ActorGone says which actor and why
            for slot in self._slots:
                slot.kill()
            self._slots = []
            raise

    async def close(self) -> None:
        """Stop every actor's sandbox (killing its sessions), then kill the actors."""
        self._closed = True
        slots, self._slots = self._slots, []
        await asyncio.gather(*(self._stop(slot) for slot in slots))

    async def _stop(self, slot: _ActorSlot) -> None:
        slot.session_ids.clear()
        with contextlib.suppress(Exception):
            await slot.close_socket()
        if slot.dead_reason is None and slot.info is not None:  # else killing it is enough
            with contextlib.suppress(SandboxError, asyncio.TimeoutError):
                await slot.call("shutdown", timeout=10.0 + self.margin_s)
        if slot.dead_reason is None:
            slot.dead_reason = "it was stopped when the sandbox pool closed"
        slot.kill()

    def _new_slot(self, index: int) -> _ActorSlot:
        actor = SandboxActor.options(**self._options)
        handle = actor.remote(
            self.limits,
            self.preload,
            self.pool_size,
            self.endpoint_host,
            self.data_path == "socket",
        )
        return _ActorSlot(index, handle, self.data_path)

    # -- sessions -------------------------------------------------------------------------

    @property
    def actors(self) -> list[ray.actor.ActorHandle]:
        return [slot.handle for slot in self._slots]

    async def session(self) -> RaySession:
        """A new session on the actor with the fewest live sessions."""
        sid = secrets.token_hex(6)
        return RaySession(self, sid, *await self._create_remote(sid))

    async def run_once(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Run `code` in a fresh session on the least-loaded actor, in one round trip."""
        started = time.monotonic()
        slot = await self._live_slot()
        token = "once-" + secrets.token_hex(6)
        slot.session_ids.add(token)  # counts as load while it runs
        bound = self._run_bound(timeout_s)
        try:
            d = await slot.call("run_once", code, timeout_s, timeout=bound, cancel=True)
        except (SandboxError, asyncio.TimeoutError) as e:
            reason = str(e) or f"the {slot.label} did not answer within {bound:.0f} s"
            return ExecResult(Status.KILLED, duration_s=time.monotonic() - started, detail=reason)
        finally:
            slot.session_ids.discard(token)
        return result_from_wire(d, time.monotonic() - started)

    async def _create_remote(self, sid: str) -> tuple[_ActorSlot, str]:
        """Create session `sid` on the least-loaded live actor, moving on if that one is dead;
        returns the actor and its process that holds the session (`create`'s `boot`)."""
        last_error: Exception | None = None
        for _ in range(self.num_actors + 1):
            slot = await self._live_slot()
            slot.session_ids.add(sid)  # before awaiting, so concurrent calls spread out
            try:
                boot = await slot.call("create", sid, timeout=self._slow_bound())
                if not slot.same_process(boot):  # Ray restarted it: learn its new endpoint
                    await slot.refresh(self._slow_bound())
                return slot, boot
            except _ActorGone as e:
                slot.session_ids.discard(sid)
                last_error = e
            except BaseException as e:
                slot.session_ids.discard(sid)
                if isinstance(e, asyncio.TimeoutError):
                    raise SandboxError(f"the {slot.label} did not create a session in time") from e
                raise
        raise SandboxError(f"could not create a session on any sandbox actor: {last_error}")

    async def _live_slot(self) -> _ActorSlot:
        """The least-loaded actor, after replacing dead ones; waits until it is ready."""
        if self._closed or not self._slots:
            raise SandboxError("the sandbox pool is not running (call start() first)")
        for i, slot in enumerate(self._slots):
            if slot.dead_reason is not None:
                slot.kill()
                self._slots[i] = self._new_slot(slot.index)
                self._replaced += 1
        slot = min(self._slots, key=lambda s: len(s.session_ids))
        with contextlib.suppress(_ActorGone):  # a replacement that failed: caller moves on
            await slot.wait_ready()
        return slot

    def _run_bound(self, timeout_s: float | None) -> float:
        """How long a run call may take before the actor counts as not answering."""
        cell = self.limits.timeout_s if timeout_s is None else timeout_s
        return cell + self.limits.grace_s + EXIT_WAIT_S + self.margin_s

    def _slow_bound(self) -> float:
        """Bound for create and fork: a zygote restart, or a fork waiting for a running cell."""
        return START_TIMEOUT_S + self.limits.timeout_s + self.margin_s

    # -- metrics --------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Per-actor stats (pid, node, live sessions, cells by status) and their totals."""
        per_actor = await asyncio.gather(*(self._actor_stats(slot) for slot in self._slots))
        cells: Counter[str] = Counter()
        for entry in per_actor:
            cells.update(entry.get("cells", {}))
        return {
            "actors": per_actor,
            "actors_alive": sum(entry["alive"] for entry in per_actor),
            "actors_replaced": self._replaced,
            "sessions": sum(entry.get("sessions", 0) for entry in per_actor),
            "cells": dict(cells),
        }

    async def _actor_stats(self, slot: _ActorSlot) -> dict[str, Any]:
        try:
            found = await slot.call("stats", timeout=self.margin_s)
        except (SandboxError, asyncio.TimeoutError) as e:
            return {"index": slot.index, "alive": False, "detail": str(e) or "no answer"}
        return {"index": slot.index, "alive": True, **found}
