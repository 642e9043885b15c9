"""Stateful Python sessions for tool-integrated reasoning, on the local machine.

How it works. `Sandbox.start()` launches one *zygote* process (`python -m tirl.sandbox._zygote`)
that imports the preload modules once. Each `Sandbox.session()` asks the zygote to fork a child
(a few ms; nothing is re-imported) that becomes one interpreter session with its own namespace,
talking to this process over a Unix socket pair in length-prefixed JSON. Sessions are never
forked from the calling process, which may hold OpenMP/CUDA threads. Everything on this side is
asyncio; many sessions run concurrently.

Concurrency. Any number of coroutines may call `session()` at once: at most `max_starting`
sessions are starting at a time and the others wait their turn (back-pressure inside the
sandbox; the caller needs no semaphore of its own). Requests to the zygote (forks, signals) go
through one queue drained by one writer, signals first, so none is lost or overtaken by a burst
of forks when the zygote's socket is full. A cell's timeout counts from the moment its session
has read it, and the grace period of an interrupt from the moment the zygote has delivered it,
so waiting for a fork slot, the control socket or a busy CPU is not charged to the cell.

Per cell: stdout/stderr are captured by bounded writers (head + tail kept, a marker in between;
output written to fds 1/2 by C code or subprocesses is captured too, appended after the Python
output). The last expression's repr is echoed as in Jupyter. Exceptions become Status.ERROR with
a traceback of user frames (`<cell N>`), SystemExit included. On timeout the session's process
group gets SIGINT (KeyboardInterrupt in the cell; the namespace survives); if it has not
answered `grace_s` after the interrupt was delivered, its process group is killed and the
session is dead (later runs return KILLED at once). An interrupt that lands where Python
swallows exceptions (a __del__, an os.register_at_fork hook inside every os.fork) is raised
again in the frame it would have reached, so it still ends the cell. MemoryError, typically
from the memory rlimit, gives Status.MEMORY. When a cell returns, every process it started and
left running is killed (`SandboxLimits.kill_background`, on by default; see "processes" below).

Forks. `session.fork()` asks the session process to fork itself between cells: the branch
starts with the same variables (copy-on-write, nothing re-executed) and a copy of the working
directory, and is then an independent session. A session and its forks form a *family*.

What is isolated, when the sandbox runs as root (`Sandbox.isolation` and `Session.isolation`
report what was set up):
- users: each family runs as its own uid, from a block of 65,536 uids above 2**31 that this
  sandbox holds a lock on (so two sandboxes on one machine never share one). Families therefore
  cannot signal, ptrace or read the /proc files of each other, of the zygote, or of anything
  else on the machine; RLIMIT_NPROC (`max_processes`) binds per family; the kernel refuses to
  raise hard rlimits. The session has no capabilities and no_new_privs is set.
- filesystem: the zygote lives in its own mount namespace whose whole tree is read-only
  (mount_setattr, Linux 5.12+); each session adds a private tmpfs on /tmp (size `disk_mb`,
  its working directory is /tmp/<session id>) and on /dev/shm. Nothing a cell writes reaches
  the host, and it all vanishes with the family. Directories on the way to Python's files
  that others may not enter (pyenv under /root) are covered by an empty tmpfs holding bind
  mounts of just those files, so the sessions can import but see nothing else there.
- network: a network namespace per session: a loopback interface that is down, no routes, no
  way to the host's loopback or its abstract Unix sockets. A seccomp filter also refuses
  sockets of any family but AF_UNIX.
- IPC and host name: own IPC and UTS namespaces.
- syscalls: a seccomp filter (x86_64 and aarch64) refuses ptrace, mount, unshare/setns,
  namespace flags on clone, keyctl, bpf, perf_event_open, io_uring, kexec/modules, clock and
  host-name changes, kill(-1), and setting rlimits (see `_isolation.seccomp_program`).
- processes: each session is its own process group; it dies with the zygote
  (PR_SET_PDEATHSIG), which dies with this process. With `kill_background` (the default) the
  session is a child subreaper, so everything a cell starts stays its descendant even after a
  double fork or setsid, and when the cell returns (before its output is collected) the
  session kills all of it: a background `sleep` or a busy subprocess cannot outlive its cell or
  use CPU between cells, and other sessions are not touched. When the last session of a family
  ends, the zygote kills every process of the family's uid, so nothing that escaped the process
  group outlives the family either. On timeout the whole process group gets the interrupt.
- environment: sessions see only PATH, HOME, LANG and TMPDIR (set by us); the zygote starts
  from a short allowlist of the caller's variables.
- resources: rlimits on data memory (RLIMIT_DATA, counting what is inherited from the zygote),
  processes, core dumps (0), file size, open files and, optionally, CPU seconds.

How it degrades:
- not root: the zygote makes its own user namespace (if the kernel allows unprivileged ones)
  and every session another one nested in it, so the mount, network, IPC and UTS isolation,
  seccomp and a per-session RLIMIT_NPROC all still hold; but sessions keep the caller's uid,
  so they can signal the caller's other processes (seccomp only refuses kill(-1)) and read
  what the caller can read under the read-only root.
- no user namespaces for unprivileged users, or `isolate=False`: sessions run as the caller,
  with the host's filesystem (the working directory is a host directory removed at the end)
  and network (unless a network namespace alone can be made); rlimits and the scrubbed
  environment stay, nothing else.
- kernels before 5.12 (no mount_setattr): the root stays writable to the uid the session runs
  as (`isolation["readonly_root"]` is False).
- other architectures: no seccomp filter (`isolation["seccomp"]` is False).
What is never isolated: the CPU (no cgroup quota here: a busy cell slows its neighbours while it
runs; `timeout_s` bounds a cell, `kill_background` ends what it leaves behind, and `cpu_s` caps
a session's CPU seconds over its lifetime, per process), memory across a family's processes
(each is limited alone), the kernel itself (a kernel exploit escapes everything above), and
processes are visible in /proc (no pid namespace). cgroups are not used, because this machine's
controllers are v1 and a writable v2 hierarchy is rarely delegated to training jobs; that is the
next step for memory and CPU limits per family. For hostile multi-tenant use, run the whole
sandbox in a VM or gVisor as well.

Files it leaves: none, also after failures. As root, the zygote exposes Python's directories to
the family uids with detached bind mounts (open_tree; older kernels stage them in a
`tirl-expose-<pid>-*` directory of the temporary directory, removed at once), and claims its uid
block with a lock file in /run/tirl-sandbox-uids, unlinked on exit. Without a mount namespace
the sessions' directories live under `tirl-sandbox-<pid>-*` in the temporary directory, removed
on close. The zygote removes all of that on any exit but SIGKILL (it gets SIGTERM when this
process dies, even by SIGKILL); what a SIGKILLed zygote left behind is removed by the next
start on the machine: directories whose pid is gone, lock files nobody holds (checked against
the race with a process taking the same file), and processes still running with a uid of those
blocks.

Determinism: the zygote runs with PYTHONHASHSEED=0; `random` (and numpy's global generator, if
numpy is preloaded) are reseeded from OS entropy in every session, so sessions do not share a
random stream. Output a cell writes to fd 1/2 directly comes after its Python-level output. A
process a cell forks with os.fork() ends when it reaches the end of the cell (its output is
discarded), or is killed when the cell returns (`kill_background`).
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tirl.sandbox._wire import encode
from tirl.sandbox.api import SandboxClient, SandboxError
from tirl.sandbox.limits import MATH_PRELOAD, SYMPY_WARMUP, SandboxLimits
from tirl.sandbox.local_session import EXIT_WAIT_S, Session, describe_exit, read_frame

ZYGOTE_ENV_ALLOWLIST = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "LD_LIBRARY_PATH")
START_TIMEOUT_S = 120.0  # zygote start, including preload imports
SESSION_START_TIMEOUT_S = 30.0  # from the fork request leaving the queue to the session's ready
SIGNAL_ACK_S = 30.0  # bound on waiting for the zygote to confirm it delivered an interrupt
# Sessions starting at once (fork requests in flight until the session says it is ready). The
# zygote forks one at a time anyway; each child then sets up its namespaces and mounts, which
# is kernel work on the machine's cores, so a few per core keep them busy without a backlog.
DEFAULT_MAX_STARTING = max(4, 2 * (os.cpu_count() or 1))


class _Outgoing:
    """One control record waiting for the zygote's socket to take it."""

    __slots__ = ("data", "fds", "done")

    def __init__(self, data: bytes, fds: tuple[int, ...], done: asyncio.Future | None) -> None:
        self.data, self.fds, self.done = data, fds, done


class Sandbox(SandboxClient):
    """Factory of sessions, backed by one zygote process. Use as `async with Sandbox() as sb:`.

    preload: modules the zygote imports once, so sessions start with them already in memory
        (cells still `import` them, at no cost). Heavy ones such as sympy pay off most here.
    pool_size: sessions forked ahead of time, so `session()` and `run_once()` need no fork.
    isolate: False turns off the namespaces, per-family uids and seccomp (for debugging, or
        where even trying them is unwelcome); rlimits and the scrubbed environment stay.
    warmup: code the zygote runs once after the preloads (default: SYMPY_WARMUP when sympy is
        preloaded); a failure in it stops the sandbox from starting.
    max_starting: how many sessions (and forks of sessions) may be starting at once; further
        `session()` calls wait their turn (back-pressure), so any number of concurrent callers
        is safe. Default: DEFAULT_MAX_STARTING.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        preload: tuple[str, ...] = MATH_PRELOAD,
        pool_size: int = 0,
        isolate: bool = True,
        warmup: str | None = None,
        max_starting: int | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.preload = tuple(preload)
        self.pool_size = pool_size
        self.isolate = isolate
        if warmup is None and "sympy" in self.preload:
            warmup = SYMPY_WARMUP
        self.warmup = warmup or ""
        self.max_starting = DEFAULT_MAX_STARTING if max_starting is None else max_starting
        if isinstance(self.max_starting, bool) or not isinstance(self.max_starting, int):
            raise ValueError(f"max_starting must be a positive int, got {max_starting!r}")
        if self.max_starting < 1:
            raise ValueError(f"max_starting must be a positive int, got {max_starting!r}")
        self.isolation: dict[str, Any] = {}  # what the zygote could set up; see the docstring
        self.zygote_pid: int | None = None
        self.workdir: str | None = None  # parent of the sessions' private directories
        self._proc: asyncio.subprocess.Process | None = None
        self._ctrl: socket.socket | None = None
        self._control_task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self._spawns: dict[str, asyncio.Future] = {}
        self._exits: dict[int, asyncio.Future] = {}  # pid -> exit code, for this zygote
        self._acks: dict[int, asyncio.Future] = {}  # pid -> "the interrupt was delivered"
        # Records for the zygote, written by _flush alone: signals first, then the rest in order.
        self._urgent: collections.deque[_Outgoing] = collections.deque()
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._writer_armed = False  # _flush is registered as the control socket's writer
        self._starting: asyncio.Semaphore | None = None  # made on first use, in the caller's loop
        self._starting_now = self._starting_peak = 0
        self._generation = 0  # bumped at every zygote start
        self._sessions: set[Session] = set()
        self._pool: list[Session] = []
        self._refill_task: asyncio.Task | None = None
        self._start_lock = asyncio.Lock()
        self._running = False
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._running:
                return
            if self._closed:
                raise SandboxError("this Sandbox was closed; create a new one")
            if self._proc is not None:  # the zygote died: its sessions are dead, start afresh
                await self._stop_zygote()
                self._abandon_sessions("the sandbox's zygote process died")
            await self._start_zygote()
        if self.pool_size:
            self._schedule_refill()
            if self._refill_task is not None:
                await self._refill_task

    async def _start_zygote(self) -> None:
        loop = asyncio.get_running_loop()
        self._generation += 1
        self._exits = {}
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent_end.setblocking(False)
        self._ctrl = parent_end
        self._ready = loop.create_future()
        cfg = {
            "ctrl_fd": child_end.fileno(),
            "parent_pid": os.getpid(),
            "preload": list(self.preload),
            "limits": asdict(self.limits),
            "isolate": self.isolate,
            "warmup": self.warmup,
        }
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tirl.sandbox._zygote",
                json.dumps(cfg),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                pass_fds=(child_end.fileno(),),
                env=_zygote_env(),
                cwd="/",  # so no stray module in the caller's cwd shadows a preload
                start_new_session=True,  # a Ctrl-C in the terminal is the caller's to handle
            )
        finally:
            child_end.close()
        self._control_task = loop.create_task(self._read_control())
        try:
            msg = await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except BaseException:
            await self._stop_zygote()
            raise
        if msg.get("event") != "ready":
            await self._stop_zygote()
            raise SandboxError(f"sandbox zygote failed to start: {msg.get('error')}")
        self.zygote_pid = msg["pid"]
        self.workdir = msg["workdir"] or None
        self.isolation = msg["isolation"]
        self._running = True

    async def close(self) -> None:
        """Kill every session and the zygote; leaves no process or directory behind."""
        self._closed = True
        if self._refill_task is not None:
            self._refill_task.cancel()
        self._abandon_sessions("the sandbox was closed")
        await self._stop_zygote()

    def _abandon_sessions(self, reason: str) -> None:
        """Mark every session dead; the zygote's shutdown (or death) takes their processes."""
        for s in list(self._sessions):
            s._closed = True
            if s._dead_reason is None:
                s._dead_reason = reason
            s._writer.close()
        self._sessions.clear()
        self._pool.clear()

    async def _stop_zygote(self) -> None:
        self._running = False
        if self._proc is not None:
            self._send_nowait({"op": "shutdown"})  # kills and reaps every session, then exits
            try:
                await asyncio.wait_for(self._proc.wait(), 10.0)
            except asyncio.TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        self._fail_outgoing()
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None
        if self._control_task is not None:
            self._control_task.cancel()
            try:
                await self._control_task
            except (asyncio.CancelledError, Exception):
                pass
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)  # in case the zygote was killed
        self._proc = self._control_task = None

    # -- sessions ---------------------------------------------------------------------------

    async def session(self) -> Session:
        """A new stateful session (from the pool when one is ready). Waits while
        `max_starting` sessions are already starting."""
        if not self._running:
            await self.start()
        while self._pool:
            s = self._pool.pop()
            self._schedule_refill()
            if s.alive:
                return s
        return await self._spawn()

    def _start_slots(self) -> asyncio.Semaphore:
        if self._starting is None:
            self._starting = asyncio.Semaphore(self.max_starting)
        return self._starting

    async def _spawn(self) -> Session:
        async with self._start_slots(), self._counting_start():
            return await self._spawn_now()

    @contextlib.asynccontextmanager
    async def _counting_start(self):
        self._starting_now += 1
        self._starting_peak = max(self._starting_peak, self._starting_now)
        try:
            yield
        finally:
            self._starting_now -= 1

    async def stats(self) -> dict[str, Any]:
        """sessions_live: open sessions (pooled ones included); sessions_starting: forks in
        flight now, never more than max_starting; sessions_starting_peak: the most there were
        at once since the sandbox was made."""
        return {
            "sessions_live": len(self._sessions),
            "sessions_starting": self._starting_now,
            "sessions_starting_peak": self._starting_peak,
            "max_starting": self.max_starting,
        }

    async def _spawn_now(self) -> Session:
        if not self._running:
            raise SandboxError("the sandbox is not running")
        loop = asyncio.get_running_loop()
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sid = secrets.token_hex(6)
        spawned = loop.create_future()
        self._spawns[sid] = spawned
        pid: int | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            try:
                await self._send({"op": "spawn", "id": sid}, fds=(child_end.fileno(),))
            finally:
                child_end.close()  # sent (the kernel holds a copy) or taken back from the queue
            msg = await spawned
            if msg["event"] != "spawned":
                raise SandboxError(f"could not create a session: {msg.get('error')}")
            pid = msg["pid"]
            reader, writer = await asyncio.open_unix_connection(sock=parent_end)
            ready = await asyncio.wait_for(read_frame(reader), SESSION_START_TIMEOUT_S)
        except BaseException as e:
            self._spawns.pop(sid, None)
            if writer is not None:
                writer.close()
            else:
                parent_end.close()
            if pid is None:
                raise
            # The session process exists: end it, and say how it ended when that is the news.
            self._send_nowait({"op": "signal", "pid": pid, "sig": int(signal.SIGKILL)}, True)
            exited = self._exits.pop(pid, None)
            failed = (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError, ValueError)
            if not isinstance(e, failed) or exited is None:
                raise
            try:
                code = await asyncio.wait_for(exited, EXIT_WAIT_S)
            except asyncio.TimeoutError:
                code = None
            raise SandboxError(f"session process failed to start ({describe_exit(code)})") from e
        s = Session(self, sid, pid, reader, writer, parent_end, ready["isolation"])
        self._sessions.add(s)
        return s

    async def _fork(self, parent: Session) -> Session:
        """Ask `parent`'s process to fork itself (see `SessionBase.fork`). Called with the
        parent's lock held, so no cell is running in it."""
        async with self._start_slots(), self._counting_start():
            return await self._fork_now(parent)

    async def _fork_now(self, parent: Session) -> Session:
        if not self._running or parent._generation != self._generation:
            raise SandboxError(f"session {parent.id} belongs to a sandbox that is not running")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sid = secrets.token_hex(6)
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))]
        try:
            # The stream is idle (lock held, last reply read), so this small write cannot
            # interleave with anything asyncio has buffered.
            parent._sock.sendmsg([encode({"op": "fork", "id": sid})], fds)
            reply = await asyncio.wait_for(read_frame(parent._reader), SESSION_START_TIMEOUT_S)
            if reply.get("status") != "forked":
                raise SandboxError(f"session {parent.id} could not fork: {reply.get('error')}")
            reader, writer = await asyncio.open_unix_connection(sock=mine)
            ready = await asyncio.wait_for(read_frame(reader), SESSION_START_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError, ValueError) as e:
            mine.close()
            parent._kill(f"it died while forking ({type(e).__name__}); all variables are lost")
            raise SandboxError(f"session {parent.id} died while forking") from e
        finally:
            theirs.close()
        pid = ready["pid"]
        self._exits[pid] = asyncio.get_running_loop().create_future()
        msg = {"op": "adopt", "pid": pid, "parent": parent.pid, "workdir": ready["workdir"]}
        await self._send(msg)
        branch = Session(self, sid, pid, reader, writer, mine, ready["isolation"])
        self._sessions.add(branch)
        return branch

    def _schedule_refill(self) -> None:
        if self.pool_size and not self._closed:
            if self._refill_task is None or self._refill_task.done():
                self._refill_task = asyncio.get_running_loop().create_task(self._refill())

    async def _refill(self) -> None:
        try:
            while self._running and len(self._pool) < self.pool_size:
                self._pool.append(await self._spawn())
        except (RuntimeError, OSError):
            pass  # the zygote is gone; session() restarts it and refills

    def _forget(self, s: Session) -> None:
        self._sessions.discard(s)
        if s._generation == self._generation:
            self._exits.pop(s.pid, None)

    # -- control channel --------------------------------------------------------------------

    async def _read_control(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._ctrl is not None
        try:
            while True:
                data = await loop.sock_recv(self._ctrl, 65536)
                if not data:
                    break
                msg = json.loads(data)
                event = msg.get("event")
                if event in ("ready", "error"):
                    if self._ready is not None and not self._ready.done():
                        self._ready.set_result(msg)
                elif event in ("spawned", "spawn_failed"):
                    fut = self._spawns.pop(msg["id"], None)
                    if fut is not None and not fut.done():
                        if event == "spawned":  # before anyone awaits it, so no exit is missed
                            self._exits[msg["pid"]] = loop.create_future()
                        fut.set_result(msg)
                    # else its caller gave up: the session finds its socket closed and exits
                elif event == "exit":
                    fut = self._exits.get(msg["pid"])
                    if fut is not None and not fut.done():
                        fut.set_result(msg["code"])
                elif event == "signalled":
                    fut = self._acks.pop(msg["pid"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg.get("delivered"))
        except (OSError, ValueError):
            pass
        finally:
            self._running = False
            gone = SandboxError("the sandbox zygote exited")
            if self._ready is not None and not self._ready.done():
                self._ready.set_result({"event": "error", "error": "zygote exited during start"})
            for fut in self._spawns.values():
                if not fut.done():
                    fut.set_exception(gone)
            self._spawns.clear()
            for futures in (self._exits, self._acks):
                for fut in futures.values():
                    if not fut.done():
                        fut.set_result(None)
            self._acks.clear()
            self._fail_outgoing()

    async def _exit_code(self, s: Session, timeout: float) -> int | None:
        fut = self._exits.get(s.pid) if s._generation == self._generation else None
        if fut is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            return None

    def _signal(self, s: Session, sig: int) -> None:
        if s._generation == self._generation:  # else its zygote is gone, and so is it
            self._send_nowait({"op": "signal", "pid": s.pid, "sig": int(sig)}, urgent=True)

    async def _interrupt(self, s: Session) -> None:
        """SIGINT to the session's process group; returns once the zygote has sent it (or
        could not, or SIGNAL_ACK_S passed)."""
        if s._generation != self._generation or not self._running:
            return
        ack = asyncio.get_running_loop().create_future()
        self._acks[s.pid] = ack
        msg = {"op": "signal", "pid": s.pid, "sig": int(signal.SIGINT), "ack": True}
        self._send_nowait(msg, urgent=True)
        try:
            await asyncio.wait_for(asyncio.shield(ack), SIGNAL_ACK_S)
        except asyncio.TimeoutError:
            pass
        finally:
            if self._acks.get(s.pid) is ack:
                del self._acks[s.pid]

    def _send_nowait(self, msg: dict[str, Any], urgent: bool = False) -> None:
        """Queue a control record without awaiting (safe in cancellation paths). `urgent`
        records (signals) go out before anything not yet sent."""
        self._post(_Outgoing(json.dumps(msg).encode(), (), None), urgent)

    async def _send(self, msg: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        """Send a control record (with fds) and return once the socket has taken it. If the
        caller is cancelled first, the record is taken back, so an fd that the caller closes
        afterwards is never sent."""
        item = _Outgoing(json.dumps(msg).encode(), fds, asyncio.get_running_loop().create_future())
        self._post(item, urgent=False)
        try:
            await item.done
        except asyncio.CancelledError:
            for queue in (self._urgent, self._outbox):
                for i, queued in enumerate(queue):
                    if queued is item:
                        del queue[i]
                        break
            raise

    def _post(self, item: _Outgoing, urgent: bool) -> None:
        (self._urgent if urgent else self._outbox).append(item)
        self._flush()

    def _flush(self) -> None:
        """Write queued records until the socket would block; then wait for it to be writable
        with one registration owned by this method. (The zygote's receive queue holds only
        net.unix.max_dgram_qlen records, 10 by default, so a burst of requests fills it at
        once. One reader/writer callback per fd is all asyncio keeps: when every waiting
        sender registered its own, a later one silently replaced an earlier one, whose
        request then never went out and whose caller hung.)"""
        ctrl = self._ctrl
        if ctrl is None or ctrl.fileno() < 0:
            self._fail_outgoing()
            return
        while self._urgent or self._outbox:
            queue = self._urgent or self._outbox
            item = queue[0]
            anc = []
            if item.fds:
                anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", item.fds))]
            try:
                ctrl.sendmsg([item.data], anc)
            except BlockingIOError:
                if not self._writer_armed:
                    asyncio.get_running_loop().add_writer(ctrl.fileno(), self._flush)
                    self._writer_armed = True
                return
            except OSError as e:  # the zygote is gone, and with it (PDEATHSIG) every session
                queue.popleft()
                if item.done is not None and not item.done.done():
                    item.done.set_exception(SandboxError(f"the sandbox zygote is gone ({e})"))
                continue
            queue.popleft()
            if item.done is not None and not item.done.done():
                item.done.set_result(None)
        self._disarm_writer()

    def _disarm_writer(self) -> None:
        if self._writer_armed:
            self._writer_armed = False
            if self._ctrl is not None and self._ctrl.fileno() >= 0:
                asyncio.get_running_loop().remove_writer(self._ctrl.fileno())

    def _fail_outgoing(self) -> None:
        """The control socket is closing: nothing queued will be sent."""
        self._disarm_writer()
        gone = SandboxError("the sandbox zygote exited")
        for queue in (self._urgent, self._outbox):
            while queue:
                item = queue.popleft()
                if item.done is not None and not item.done.done():
                    item.done.set_exception(gone)


def _zygote_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in ZYGOTE_ENV_ALLOWLIST if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    # The zygote runs with cwd "/", so make the import path absolute and make sure it finds
    # this very copy of tirl first.
    package_root = str(Path(__file__).resolve().parents[2])
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([package_root, *extra])
    env.update(
        PYTHONHASHSEED="0",  # same str hashes (set order) in every session and every run
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",  # the zygote forks: its preload imports must not start threads
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


def __getattr__(name: str) -> Any:
    """`DEFAULT_PRELOAD`, this module's old name for `MATH_PRELOAD` (the default of `Sandbox`),
    still importable from here; the `sandbox.preload` setting's default is
    `tirl.sandbox.limits.DEFAULT_PRELOAD`, a different, smaller set."""
    if name == "DEFAULT_PRELOAD":
        warnings.warn(
            "tirl.sandbox.local.DEFAULT_PRELOAD is now tirl.sandbox.limits.MATH_PRELOAD",
            DeprecationWarning,
            stacklevel=2,
        )
        return MATH_PRELOAD
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
