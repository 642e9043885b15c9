"""The zygote process behind `tirl.sandbox.local.Sandbox`: it forks the sessions.

Run as `python -m tirl.sandbox._zygote CONFIG_JSON` by the parent, never imported by users. The
zygote imports the preload modules once, then serves requests on a SOCK_SEQPACKET control socket:

    parent -> zygote   {"op": "spawn", "id": SID} + one fd (SCM_RIGHTS): the session's socket
                       {"op": "signal", "pid": PID, "sig": N, "ack": bool}
                       {"op": "adopt", "pid": PID, "parent": PID, "workdir": DIR}
                       {"op": "shutdown"}   (EOF on the control socket means the same)
    zygote -> parent   {"event": "ready"|"error"|"spawned"|"spawn_failed"|"exit"|"signalled", ...}

Each spawn forks one session child (`tirl.sandbox._session_process`: it sets itself up and runs
cells, `tirl.sandbox._cells`). Signals go through the zygote because only it can tell whether a
pid still belongs to a live session (it reaps them), so a kill can never hit a recycled pid;
with "ack" the zygote answers "signalled" once the signal is sent, so the parent can start the
grace period of a timeout from the moment the interrupt was really delivered. When the last
session of a family ends, the zygote kills every process of the family's uid.

Every session inherits what the zygote has imported, so it imports little on purpose: the
standard library, `tirl.sandbox._isolation`, `_wire`, `formatter`, `result` and the session and
cell modules (never asyncio or tirl's other modules; the `tirl.sandbox` package imports its
parts lazily), then the preload modules the parent asks for.

The zygote must stay single-threaded (it forks): nothing here starts threads, and the parent sets
the OpenMP/BLAS thread counts to 1 before the preload imports run.
"""

from __future__ import annotations

import array
import collections
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import types

from tirl.sandbox import _isolation as iso
from tirl.sandbox._session_process import session_main

EXITS_REMEMBERED = 4096  # exit codes of not-yet-adopted forks the zygote keeps

# ---------------------------------------------------------------------------------------------
# The zygote


def _children(pid: int) -> list[int]:
    """Pids whose parent is `pid` (orphans of sessions are reparented to the zygote)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(b")", 1)[1].split()[1]) == pid:
            found.append(int(name))
    return found


class _Zygote:
    def __init__(self, ctrl: socket.socket, cfg: dict, uids: iso.UidBlock | None) -> None:
        self.ctrl = ctrl
        self.cfg = cfg
        self.base = cfg["base"]
        self.uids = uids
        self.live: dict[int, str] = {}  # session pid -> its working directory
        self.family_of: dict[int, int] = {}  # session pid -> its family's uid (as root)
        self.families: dict[int, set[int]] = {}  # family uid -> its live session pids
        # exit codes of forks reaped before their adoption was announced, oldest first
        self.unclaimed: collections.OrderedDict[int, int] = collections.OrderedDict()

    def send(self, msg: dict) -> None:
        try:
            self.ctrl.send(json.dumps(msg).encode())
        except OSError:
            pass  # the parent is gone; EOF on the next poll shuts us down

    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        gc.collect()
        gc.freeze()  # keep the preloaded heap out of later collections: fewer copy-on-write pages
        self.send(
            {
                "event": "ready",
                "pid": os.getpid(),
                "workdir": self.base,
                "isolation": self.cfg["isolation"],
            }
        )
        poller = select.poll()
        poller.register(self.ctrl, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    self.reap()
                else:
                    msg, fds = self.recv()
                    if msg is None or msg.get("op") == "shutdown":
                        self.shutdown()
                    self.handle(msg, fds)

    def _on_sigterm(self, signum: int, frame: types.FrameType | None) -> None:
        if os.getpid() != self.cfg["zygote_pid"]:  # a session child before it reset handlers
            os._exit(1)
        self.shutdown()

    def recv(self) -> tuple[dict | None, list[int]]:
        try:
            data, anc, _, _ = self.ctrl.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
        except OSError:
            return None, []
        fds: list[int] = []
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", cdata[: len(cdata) - len(cdata) % 4]))
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        return json.loads(data), fds

    def handle(self, msg: dict, fds: list[int]) -> None:
        op = msg.get("op")
        if op == "spawn":
            self.spawn(msg["id"], fds[0] if fds else None)
            fds = fds[1:]
        elif op == "signal":
            delivered = self.signal(int(msg["pid"]), int(msg["sig"]))
            if msg.get("ack"):
                self.send({"event": "signalled", "pid": msg["pid"], "delivered": delivered})
        elif op == "adopt":
            self.adopt(int(msg["pid"]), int(msg["parent"]), str(msg["workdir"]))
        for fd in fds:
            os.close(fd)

    def spawn(self, sid: str, sock_fd: int | None) -> None:
        if sock_fd is None:
            self.send({"event": "spawn_failed", "id": sid, "error": "no socket received"})
            return
        family_uid = None
        host_dir = ""  # without a mount namespace, the session's directory is on the host
        try:
            if self.uids is not None:
                family_uid = self.uids.take()
            if self.base:
                host_dir = tempfile.mkdtemp(prefix=f"s-{sid}-", dir=self.base)
            pid = os.fork()
        except OSError as e:
            os.close(sock_fd)
            if family_uid is not None:
                self.uids.give_back(family_uid)
            self.send({"event": "spawn_failed", "id": sid, "error": str(e)})
            return
        if pid == 0:
            code = 0
            try:
                session_main(sock_fd, sid, self.cfg, family_uid, host_dir)
            except BaseException:
                code = 1
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(sock_fd)
        try:
            os.setpgid(pid, pid)  # also done in the child; whichever runs first wins the race
        except OSError:
            pass
        self.live[pid] = host_dir
        if family_uid is not None:
            self.family_of[pid] = family_uid
            self.families[family_uid] = {pid}
        self.send({"event": "spawned", "id": sid, "pid": pid})

    def adopt(self, pid: int, parent: int, workdir: str) -> None:
        """A session forked a branch (now our child, as a subreaper): track it like a session."""
        on_host = self.base and workdir.startswith(self.base + "/")
        self.live[pid] = workdir if on_host else ""
        family_uid = self.family_of.get(parent)
        if family_uid is not None and family_uid in self.families:
            self.family_of[pid] = family_uid
            self.families[family_uid].add(pid)
        if pid in self.unclaimed:  # it died before we heard of it
            self.finished(pid, self.unclaimed.pop(pid))

    def signal(self, pid: int, sig: int) -> bool:
        """Signal a live session's process group (its own process if the group is gone);
        False if the pid is no session of ours any more."""
        if pid not in self.live:  # already reaped: the pid may belong to someone else now
            return False
        try:
            os.killpg(pid, sig)  # the cell's own subprocesses share its process group
            grouped = True
        except OSError:
            grouped = False
        if sig == signal.SIGKILL or not grouped:  # never two SIGINTs: that is two interrupts
            try:
                os.kill(pid, sig)
            except OSError:
                return grouped
        return True

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            if pid in self.live:
                self.finished(pid, code)
            else:  # an orphan of some session, or a fork whose adoption is still on its way
                self.unclaimed[pid] = code
                while len(self.unclaimed) > EXITS_REMEMBERED:
                    self.unclaimed.popitem(last=False)

    def finished(self, pid: int, code: int) -> None:
        workdir = self.live.pop(pid)
        try:
            os.killpg(pid, signal.SIGKILL)  # the cell's leftover subprocesses, if any
        except OSError:
            pass
        family_uid = self.family_of.pop(pid, None)
        if family_uid is not None:
            members = self.families[family_uid]
            members.discard(pid)
            if not members:  # the last of the family: nothing of its uid may outlive it
                del self.families[family_uid]
                _kill_uid(family_uid)
                self.uids.give_back(family_uid)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        self.send({"event": "exit", "pid": pid, "code": code})

    def shutdown(self) -> None:
        for pid in list(self.live):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for family_uid in self.families:
            _kill_uid(family_uid)
        # Processes that left their session's group are reparented to us (child subreaper) once
        # their parent dies, which may be after this loop starts: keep killing until none is left.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            for pid in _children(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                break
            time.sleep(0.002)
        if self.base:
            shutil.rmtree(self.base, ignore_errors=True)
        if self.uids is not None:
            self.uids.release()
        os._exit(0)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process running as `uid` (orphans that left their session's process group
    included), by a short-lived child that becomes `uid` and signals everything it may signal.
    Twice, in case a process was forking during the first pass."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            for _ in range(2):
                try:
                    os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass  # ESRCH: nothing of that uid was left
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _prepare_isolation(enabled: bool) -> tuple[dict, iso.UidBlock | None]:
    """Put the zygote in its own mount namespace (and, when not root, its own user namespace)
    whose root is read-only, so that sessions only have to add their private /tmp. Degrades to
    what works; the returned dict says what does."""
    is_root = os.geteuid() == 0
    mode = {"mount": False, "readonly_root": False, "uid": "caller"}
    if not enabled:
        return mode, None
    # As root, claim the uid block while still in the host's mount namespace: see UidBlock.
    uids = iso.UidBlock() if is_root else None
    try:
        if is_root:
            entered = iso.unshare(iso.CLONE_NEWNS)
        else:
            entered = iso.unshare_with_user_namespace(iso.CLONE_NEWNS)
        if not entered:
            if uids is not None:
                uids.release()
            return mode, None
        iso.make_mounts_private()
        if uids is not None:
            # Sessions will run as unprivileged uids, which must still reach Python's files.
            needed = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]
            needed.append(os.path.dirname(os.path.dirname(os.path.abspath(iso.__file__))))
            mode["exposed"] = iso.expose_paths(needed)
            mode["uid"] = "family"
            mode["uid_range"] = [uids.first, uids.first + uids.SIZE]
        mode["mount"] = True
        mode["readonly_root"] = iso.make_root_readonly()
    except BaseException:
        if uids is not None:
            uids.release()
        raise
    return mode, uids


def main() -> None:
    cfg = json.loads(sys.argv[1])
    ctrl = socket.socket(fileno=cfg["ctrl_fd"])
    ctrl.setblocking(True)
    # SIGTERM, not SIGKILL: the handler installed in serve() kills the sessions' process groups
    # (their subprocesses too) and removes the working directories before exiting.
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != cfg["parent_pid"]:
        os._exit(1)
    iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
    # A caller that starts the sandbox from a thread (a Ray actor's event loop, say) may have
    # signals blocked, and exec keeps the mask: sessions must get their timeout interrupt.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg["zygote_pid"] = os.getpid()
    uids = None
    try:
        for name in cfg["preload"]:
            importlib.import_module(name)
        if cfg["warmup"]:
            exec(compile(cfg["warmup"], "<warmup>", "exec"), {"__name__": "__warmup__"})
        # What zygotes that were SIGKILLed left in the temporary directory (see _isolation).
        iso.remove_stale_dirs()
        cfg["isolation"], uids = _prepare_isolation(cfg["isolate"])
        # Without a mount namespace, session directories live on the host, under `base`; its
        # name carries our pid so that a later start can remove it if we are killed.
        cfg["base"] = (
            ""
            if cfg["isolation"]["mount"]
            else tempfile.mkdtemp(prefix=f"{iso.HOST_DIR_PREFIX}{os.getpid()}-")
        )
        program = iso.seccomp_program() if cfg["isolate"] else None
        cfg["seccomp"] = program
        cfg["isolation"]["seccomp"] = program is not None
    except BaseException as e:
        if uids is not None:
            uids.release()
        ctrl.send(json.dumps({"event": "error", "error": f"{type(e).__name__}: {e}"}).encode())
        os._exit(1)
    _Zygote(ctrl, cfg, uids).serve()


if __name__ == "__main__":
    main()
