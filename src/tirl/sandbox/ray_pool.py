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

Network safety on one machine. When Ray is not initialized, `start()` starts a single-machine
cluster that only ever talks over loopback (`init_local_ray`, from tirl.sandbox.ray_cluster,
which says how; it is re-exported here). Sessions inherit none of its settings.

On a real cluster. Start Ray on every node first (`ray start --head --disable-usage-stats`, then
`ray start --address=HEAD:6379` on the others; tirl must be importable on every node), then in
the trainer::

    ray.init(address="auto")
    async with RaySandboxPool(num_actors=len(ray.nodes()), limits=SandboxLimits(...)) as pool:
        session = await pool.session()

Ray then uses the nodes' real addresses, by design: `init_local_ray`'s loopback-only setup is
for one machine, and its proxy variables would keep the nodes from reaching each other. The
cluster's dashboard probes the cloud metadata service and sends one "usage stats disabled"
report, unless RAY_USAGE_STATS_REPORT_URL points elsewhere.
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
import contextlib
import os
import secrets
import time
from collections import Counter
from typing import Any

import ray
import ray.exceptions

from tirl.sandbox.api import SandboxClient, SandboxError, SessionBase
from tirl.sandbox.channel import result_from_wire, result_to_wire
from tirl.sandbox.limits import MATH_PRELOAD, SandboxLimits
from tirl.sandbox.local import EXIT_WAIT_S, START_TIMEOUT_S, Sandbox, Session
from tirl.sandbox.ray_calls import (
    MAILBOX_METHODS,
    RPC_MARGIN_S,
    ActorGone,
    ActorSlot,
    short_error,
)
from tirl.sandbox.ray_cluster import init_local_ray
from tirl.sandbox.ray_socket import ActorEndpoint
from tirl.sandbox.result import ExecResult, Status

__all__ = ["RaySandboxPool", "RaySession", "SandboxActor", "init_local_ray"]

MAX_CONCURRENCY = 1000  # concurrent calls per actor: cells mostly wait, so many can be in flight
DATA_PATHS = ("socket", "ray")
MAX_WAITING = 64  # exchanges waiting on one actor (each holds one of its MAX_CONCURRENCY slots)
COALESCE_S = 0.005  # with COALESCE_MIN_RUNNING requests running, an exchange waits this long
COALESCE_MIN_RUNNING = 16  # for more replies before it returns (one actor call carries them all)


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
            reply = (rid, False, short_error(e))
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


class RaySession(SessionBase):
    """A session pinned to one sandbox actor. Create with `await pool.session()`.

    `id` is stable across `restore()`, which may move the session to another actor."""

    def __init__(self, pool: RaySandboxPool, sid: str, slot: ActorSlot, boot: str) -> None:
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
        except ActorGone as e:
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
        preload: tuple[str, ...] = MATH_PRELOAD,
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
        self._slots: list[ActorSlot] = []
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
        except BaseException:  # ActorGone says which actor and why
            for slot in self._slots:
                slot.kill()
            self._slots = []
            raise

    async def close(self) -> None:
        """Stop every actor's sandbox (killing its sessions), then kill the actors."""
        self._closed = True
        slots, self._slots = self._slots, []
        await asyncio.gather(*(self._stop(slot) for slot in slots))

    async def _stop(self, slot: ActorSlot) -> None:
        slot.session_ids.clear()
        with contextlib.suppress(Exception):
            await slot.close_socket()
        if slot.dead_reason is None and slot.info is not None:  # else killing it is enough
            with contextlib.suppress(SandboxError, asyncio.TimeoutError):
                await slot.call("shutdown", timeout=10.0 + self.margin_s)
        if slot.dead_reason is None:
            slot.dead_reason = "it was stopped when the sandbox pool closed"
        slot.kill()

    def _new_slot(self, index: int) -> ActorSlot:
        actor = SandboxActor.options(**self._options)
        handle = actor.remote(
            self.limits,
            self.preload,
            self.pool_size,
            self.endpoint_host,
            self.data_path == "socket",
        )
        return ActorSlot(index, handle, self.data_path)

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

    async def _create_remote(self, sid: str) -> tuple[ActorSlot, str]:
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
            except ActorGone as e:
                slot.session_ids.discard(sid)
                last_error = e
            except BaseException as e:
                slot.session_ids.discard(sid)
                if isinstance(e, asyncio.TimeoutError):
                    raise SandboxError(f"the {slot.label} did not create a session in time") from e
                raise
        raise SandboxError(f"could not create a session on any sandbox actor: {last_error}")

    async def _live_slot(self) -> ActorSlot:
        """The least-loaded actor, after replacing dead ones; waits until it is ready."""
        if self._closed or not self._slots:
            raise SandboxError("the sandbox pool is not running (call start() first)")
        for i, slot in enumerate(self._slots):
            if slot.dead_reason is not None:
                slot.kill()
                self._slots[i] = self._new_slot(slot.index)
                self._replaced += 1
        slot = min(self._slots, key=lambda s: len(s.session_ids))
        with contextlib.suppress(ActorGone):  # a replacement that failed: caller moves on
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

    async def _actor_stats(self, slot: ActorSlot) -> dict[str, Any]:
        try:
            found = await slot.call("stats", timeout=self.margin_s)
        except (SandboxError, asyncio.TimeoutError) as e:
            return {"index": slot.index, "alive": False, "detail": str(e) or "no answer"}
        return {"index": slot.index, "alive": True, **found}
