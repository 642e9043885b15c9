"""The zygote and session processes behind `tirl.sandbox.local.Sandbox`.

Run as `python -m tirl.sandbox._zygote CONFIG_JSON` by the parent, never imported by users. The
zygote imports the preload modules once, then serves requests on a SOCK_SEQPACKET control socket:

    parent -> zygote   {"op": "spawn", "id": SID} + one fd (SCM_RIGHTS): the session's socket
                       {"op": "signal", "pid": PID, "sig": N}
                       {"op": "shutdown"}   (EOF on the control socket means the same)
    zygote -> parent   {"event": "ready"|"error"|"spawned"|"spawn_failed"|"exit", ...}

Each spawn forks one session child. Signals go through the zygote because only it can tell
whether a pid still belongs to a live session (it reaps them), so a kill can never hit a
recycled pid. The session child sets itself up (process group, death signal, network namespace,
rlimits, private cwd, scrubbed environment) and then runs cells sent as length-prefixed JSON
frames on its socket, replying with one frame per cell.

The zygote must stay single-threaded (it forks): nothing here starts threads, and the parent sets
the OpenMP/BLAS thread counts to 1 before the preload imports run.
"""

from __future__ import annotations

import array
import ast
import builtins
import ctypes
import gc
import importlib
import io
import json
import linecache
import os
import resource
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import types

from tirl.sandbox._wire import HEADER, MAX_FRAME, decode, encode
from tirl.sandbox.formatter import truncate_middle, truncation_marker

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SESSION_FD = 3
SESSION_PATH = "/usr/local/bin:/usr/bin:/bin"

_libc = ctypes.CDLL(None, use_errno=True)
_GLOBALS = globals()  # frames whose globals are these belong to the sandbox and are hidden


# ---------------------------------------------------------------------------------------------
# Session child: output capture


class _BoundedWriter(io.TextIOBase):
    """A text stream that keeps only the first ceil(cap/2) and last floor(cap/2) characters
    written to it and counts the rest, so a cell printing gigabytes costs O(cap) memory."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, cap: int) -> None:
        self._head_cap, self._tail_cap = (cap + 1) // 2, cap // 2
        self._head: list[str] = []
        self._head_len = 0
        self._tail: list[str] = []
        self._tail_len = 0
        self.total = 0
        self.buffer = _BinaryAdapter(self)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        n = len(s)
        self.total += n
        room = self._head_cap - self._head_len
        if room > 0:
            part = s[:room]
            self._head.append(part)
            self._head_len += len(part)
            s = s[room:]
        if s and self._tail_cap:
            if len(s) >= self._tail_cap:
                self._tail, self._tail_len = [s[-self._tail_cap :]], self._tail_cap
            else:
                self._tail.append(s)
                self._tail_len += len(s)
                if self._tail_len > 2 * self._tail_cap:
                    joined = "".join(self._tail)[-self._tail_cap :]
                    self._tail, self._tail_len = [joined], len(joined)
        return n

    def skip(self, n: int) -> None:
        """Account for `n` characters that were never read (the middle of a huge fd output)."""
        self.total += n
        self._tail, self._tail_len = [], 0  # what came before the gap is no longer the tail

    def getvalue(self) -> tuple[str, bool]:
        head = "".join(self._head)
        tail = "".join(self._tail)[-self._tail_cap :] if self._tail_cap else ""
        dropped = self.total - len(head) - len(tail)
        if dropped <= 0:
            return head + tail, False
        return head + truncation_marker(dropped) + tail, True


class _BinaryAdapter:
    """`sys.stdout.buffer` for code that writes bytes."""

    def __init__(self, text: _BoundedWriter) -> None:
        self._text = text

    def write(self, b: bytes) -> int:
        self._text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)

    def flush(self) -> None:
        pass


def _drain_fd(fd: int, writer: _BoundedWriter, cap_bytes: int) -> None:
    """Move what was written to fd 1 or 2 (C extensions, subprocesses) into `writer`."""
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return
        if size <= 2 * cap_bytes:
            writer.write(os.pread(fd, size, 0).decode("utf-8", "replace"))
        else:
            writer.write(os.pread(fd, cap_bytes, 0).decode("utf-8", "replace"))
            writer.skip(size - 2 * cap_bytes)
            writer.write(os.pread(fd, cap_bytes, size - cap_bytes).decode("utf-8", "replace"))
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        pass  # the cell closed or replaced the fd; nothing sensible to capture


# ---------------------------------------------------------------------------------------------
# Session child: running cells

_cell_state = {"in_cell": False, "interrupted": False, "session_pid": 0}


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    # The parent sends SIGINT on timeout. Outside a cell (between cells, or while the reply is
    # being sent) it is ignored, so a late interrupt can never break the protocol.
    if _cell_state["in_cell"]:
        _cell_state["interrupted"] = True
        raise KeyboardInterrupt


def _user_traceback(exc: BaseException) -> str:
    """Format `exc` with every frame of this module removed."""
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals is not _GLOBALS:
            kept.append(tb)
        tb = tb.tb_next
    new_tb = None
    for t in reversed(kept):
        new_tb = types.TracebackType(new_tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return "".join(traceback.format_exception(type(exc), exc, new_tb))


def _run_cell(code: str, cell: int, ns: dict, cap: int) -> dict:
    filename = f"<cell {cell}>"
    out, err = _BoundedWriter(cap), _BoundedWriter(cap)
    sys.stdout, sys.stderr = out, err
    status, tb_text, message = "ok", None, ""
    _cell_state["interrupted"] = False
    try:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
            tail = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                expr = ast.Expression(tree.body.pop().value)
                tail = compile(expr, filename, "eval", dont_inherit=True)
            body = compile(tree, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as e:  # ValueError: source contains null bytes
            status, tb_text = "error", "".join(traceback.format_exception_only(type(e), e))
        else:
            _cell_state["in_cell"] = True
            try:
                exec(body, ns)
                if tail is not None:
                    value = eval(tail, ns)
                    if value is not None:
                        print(repr(value))
            finally:
                _cell_state["in_cell"] = False
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the session lives on
        status = "memory" if isinstance(e, MemoryError) else "error"
        message = str(e) if isinstance(e, MemoryError) else ""
        try:
            tb_text = _user_traceback(e)
        except MemoryError:
            tb_text = f"{type(e).__name__}: {e}\n"
    finally:
        _cell_state["in_cell"] = False
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if os.getpid() != _cell_state["session_pid"]:
        # A process the cell forked (os.fork) got here: it must not answer on the session's
        # socket or drain its output. End it like a script would end.
        os._exit(0 if status == "ok" else 1)
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    _drain_fd(1, out, 4 * cap)
    _drain_fd(2, err, 4 * cap)
    stdout, stdout_cut = out.getvalue()
    stderr, stderr_cut = err.getvalue()
    return {
        "status": status,
        "interrupted": _cell_state["interrupted"],
        "stdout": stdout,
        "stderr": stderr,
        "stdout_truncated": stdout_cut,
        "stderr_truncated": stderr_cut,
        "traceback": None if tb_text is None else truncate_middle(tb_text, max(cap, 2000)),
        "message": message[:1000],
        "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _recv_frame(sock: socket.socket) -> dict | None:
    header = _recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        return None
    body = _recv_exact(sock, n)
    return None if body is None else decode(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


# ---------------------------------------------------------------------------------------------
# Session child: setup


def _isolate_network() -> bool:
    """Move into a fresh network namespace (only a down loopback). Best effort."""
    if _libc.unshare(CLONE_NEWNET) == 0:
        return True
    # Without CAP_SYS_ADMIN a user namespace grants it; map our own ids so nothing else changes.
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    for path, text in (
        ("/proc/self/setgroups", "deny"),
        ("/proc/self/uid_map", f"{uid} {uid} 1"),
        ("/proc/self/gid_map", f"{gid} {gid} 1"),
    ):
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            pass
    return True


def _close_other_fds(keep: int) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _session_main(sock_fd: int, workdir: str, cfg: dict, zygote_pid: int) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setpgid(0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != zygote_pid:  # the zygote died before the death signal was armed
        os._exit(1)
    if sock_fd != SESSION_FD:
        os.dup2(sock_fd, SESSION_FD)
    _close_other_fds(SESSION_FD)  # the control socket must not be reachable from user code
    sock = socket.socket(fileno=SESSION_FD)

    net_isolated = _isolate_network()
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(PATH=SESSION_PATH, HOME=workdir, LANG="C.UTF-8", TMPDIR=workdir)
    tempfile.tempdir = workdir

    limits = cfg["limits"]
    mem = limits["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_DATA, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = limits["file_size_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    nofile = limits["max_open_files"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    if limits["cpu_s"] is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))

    # fd 0 reads nothing; fds 1 and 2 go to in-memory files drained after every cell.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    for target, name in ((1, "stdout"), (2, "stderr")):
        fd = os.memfd_create(name)
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past RLIMIT_FSIZE fail with EFBIG

    numpy = sys.modules.get("numpy")
    if numpy is not None:  # `random` reseeds itself after fork; numpy's global generator doesn't
        try:
            numpy.random.seed()
        except Exception:
            pass

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    ns = main.__dict__

    _cell_state["session_pid"] = os.getpid()
    sock.sendall(encode({"event": "ready", "pid": os.getpid(), "net_isolated": net_isolated}))
    cap = limits["max_output_chars"]
    cell = 0
    while True:
        msg = _recv_frame(sock)
        if msg is None:
            return
        if msg.get("op") == "exec":
            cell += 1
            reply = _run_cell(msg["code"], cell, ns, cap)
            sock.sendall(encode(reply))


# ---------------------------------------------------------------------------------------------
# Zygote


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
    def __init__(self, ctrl: socket.socket, base: str, cfg: dict) -> None:
        self.ctrl = ctrl
        self.base = base
        self.cfg = cfg
        self.live: dict[int, str] = {}  # session pid -> its working directory

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
        self.send({"event": "ready", "pid": os.getpid(), "workdir": self.base})
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
            self.signal(int(msg["pid"]), int(msg["sig"]))
        for fd in fds:
            os.close(fd)

    def spawn(self, sid: str, sock_fd: int | None) -> None:
        if sock_fd is None:
            self.send({"event": "spawn_failed", "id": sid, "error": "no socket received"})
            return
        try:
            workdir = tempfile.mkdtemp(prefix=f"s-{sid}-", dir=self.base)
            pid = os.fork()
        except OSError as e:
            os.close(sock_fd)
            self.send({"event": "spawn_failed", "id": sid, "error": str(e)})
            return
        if pid == 0:
            code = 0
            try:
                _session_main(sock_fd, workdir, self.cfg, self.cfg["zygote_pid"])
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
        self.live[pid] = workdir
        self.send({"event": "spawned", "id": sid, "pid": pid})

    def signal(self, pid: int, sig: int) -> None:
        if pid not in self.live:  # already reaped: the pid may belong to someone else now
            return
        try:
            os.killpg(pid, sig)  # the cell's own subprocesses share its process group
            grouped = True
        except OSError:
            grouped = False
        if sig == signal.SIGKILL or not grouped:  # never two SIGINTs: that is two interrupts
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            workdir = self.live.pop(pid, None)
            if workdir is None:
                continue  # an orphan of some session, reparented to us (child subreaper)
            try:
                os.killpg(pid, signal.SIGKILL)  # the cell's leftover subprocesses, if any
            except OSError:
                pass
            shutil.rmtree(workdir, ignore_errors=True)
            self.send({"event": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def shutdown(self) -> None:
        for pid in list(self.live):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
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
        shutil.rmtree(self.base, ignore_errors=True)
        os._exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    ctrl = socket.socket(fileno=cfg["ctrl_fd"])
    ctrl.setblocking(True)
    # SIGTERM, not SIGKILL: the handler installed in serve() kills the sessions' process groups
    # (their subprocesses too) and removes the working directories before exiting.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != cfg["parent_pid"]:
        os._exit(1)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cfg["zygote_pid"] = os.getpid()
    try:
        for name in cfg["preload"]:
            importlib.import_module(name)
    except BaseException as e:
        ctrl.send(json.dumps({"event": "error", "error": f"{type(e).__name__}: {e}"}).encode())
        os._exit(1)
    base = tempfile.mkdtemp(prefix="tirl-sandbox-")
    _Zygote(ctrl, base, cfg).serve()


if __name__ == "__main__":
    main()
