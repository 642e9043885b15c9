"""The zygote and session processes behind `tirl.sandbox.local.Sandbox`.

Run as `python -m tirl.sandbox._zygote CONFIG_JSON` by the parent, never imported by users. The
zygote imports the preload modules once, then serves requests on a SOCK_SEQPACKET control socket:

    parent -> zygote   {"op": "spawn", "id": SID} + one fd (SCM_RIGHTS): the session's socket
                       {"op": "signal", "pid": PID, "sig": N, "ack": bool}
                       {"op": "adopt", "pid": PID, "parent": PID, "workdir": DIR}
                       {"op": "shutdown"}   (EOF on the control socket means the same)
    zygote -> parent   {"event": "ready"|"error"|"spawned"|"spawn_failed"|"exit"|"signalled", ...}

Each spawn forks one session child. Signals go through the zygote because only it can tell
whether a pid still belongs to a live session (it reaps them), so a kill can never hit a
recycled pid; with "ack" the zygote answers "signalled" once the signal is sent, so the parent
can start the grace period of a timeout from the moment the interrupt was really delivered.
The session child sets itself up (process group, death signal, network namespace, rlimits,
private cwd, scrubbed environment) and then runs cells sent as length-prefixed JSON frames on
its socket. Per cell it sends two frames: {"event": "started"} as soon as it has read the cell
(the parent's timeout clock starts there, so time the request spent queued does not count),
then the result.

Background processes: with `limits["kill_background"]` the session is a child subreaper, so
every process a cell starts stays its descendant even after a double fork or setsid; after
each cell, before the output is collected, it kills all of them (`_end_background`).

The zygote must stay single-threaded (it forks): nothing here starts threads, and the parent sets
the OpenMP/BLAS thread counts to 1 before the preload imports run.
"""

from __future__ import annotations

import array
import ast
import builtins
import collections
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
import stat
import sys
import tempfile
import time
import traceback
import types

from tirl.sandbox import _isolation as iso
from tirl.sandbox._wire import HEADER, MAX_FRAME, decode, encode
from tirl.sandbox.formatter import truncate_middle, truncation_marker

SESSION_FD = 3
STARTED = encode({"event": "started"})
BACKGROUND_KILL_S = 5.0  # per phase of `_end_background` (stop, then kill)
SESSION_PATH = "/usr/local/bin:/usr/bin:/bin"
EXITS_REMEMBERED = 4096  # exit codes of not-yet-adopted forks the zygote keeps
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

_cell_state = {
    "in_cell": False,
    "interrupted": False,
    "session_pid": 0,
    "zygote_pid": 0,
    "kill_background": False,
}


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    # The parent sends SIGINT on timeout. Outside a cell (between cells, or while the reply is
    # being sent) it is ignored, so a late interrupt can never break the protocol.
    if _cell_state["in_cell"]:
        _cell_state["interrupted"] = True
        raise KeyboardInterrupt


def _on_unraisable(unraisable) -> None:
    # Python swallows an exception raised where it cannot propagate: in an os.register_at_fork
    # hook (logging's lock release runs inside every os.fork()), a __del__, a weakref callback.
    # Our KeyboardInterrupt landing there would be lost, and the cell would run on until it is
    # killed (a fork bomb spends most of its time in fork). Raise it again instead, in the frame
    # it would have reached: the one whose call into C ran the hook (the way pdb stops a
    # running frame: its f_trace, with tracing on, sees its next line).
    caller = sys._getframe().f_back
    if (
        isinstance(unraisable.exc_value, KeyboardInterrupt)
        and _cell_state["in_cell"]
        and _cell_state["interrupted"]
        and caller is not None
    ):
        caller.f_trace = _raise_interrupt_again
        caller.f_trace_lines = True
        sys.settrace(_trace_nothing)  # tracing must be on for f_trace to run
        return
    sys.__unraisablehook__(unraisable)


def _trace_nothing(frame: types.FrameType, event: str, arg: object) -> None:
    return None  # new frames are not traced; only the one given an f_trace above


def _raise_interrupt_again(frame: types.FrameType, event: str, arg: object) -> None:
    sys.settrace(None)
    frame.f_trace = None
    if _cell_state["in_cell"]:
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
    if _cell_state["kill_background"]:
        _end_background()  # before draining fd 1/2: what they wrote is this cell's output
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


def _has_children() -> bool:
    """Reap exited children; True while any child remains (running, or a zombie that
    waitpid could not take yet)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _descendants(root: int) -> dict[int, bytes]:
    """Every process below `root` in the process tree, with its state letter (one pass over
    /proc)."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            state, ppid = fields[0], int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append((int(name), state))
    found: dict[int, bytes] = {}
    todo = [root]
    while todo:
        for pid, state in children.get(todo.pop(), ()):
            found[pid] = state
            todo.append(pid)
    return found


_SETTLED = (b"T", b"t", b"Z", b"X")  # stopped or dead: cannot fork any more


def _end_background() -> int:
    """SIGKILL every descendant of this session process and reap them; returns how many were
    killed. The session is a child subreaper, so orphans (double forks, setsid) are reparented
    to it and "no children left" means "no descendants left": the common case, a cell that
    left nothing behind, costs one waitpid. Descendants are first stopped (SIGSTOP) until a
    pass finds every one of them stopped, and only then killed: killing a fork bomb one pass
    at a time frees process slots for the survivors to fork again, while stopped processes
    neither fork nor free their slots."""
    killed: set[int] = set()
    stop_until = time.monotonic() + BACKGROUND_KILL_S
    # A process in uninterruptible sleep dies only when it wakes: give up on it after this
    # (the zygote kills what is left of the family when its last session ends).
    give_up = stop_until + BACKGROUND_KILL_S
    while _has_children() and time.monotonic() < give_up:
        found = _descendants(os.getpid())
        running = [pid for pid, state in found.items() if state not in _SETTLED]
        if running and time.monotonic() < stop_until:
            for pid in running:
                _signal_quietly(pid, signal.SIGSTOP)
        else:  # all stopped (or out of time: kill what there is)
            for pid in found:
                _signal_quietly(pid, signal.SIGKILL)
            killed.update(found)
        time.sleep(0.0002)  # let the signals land before the next look
    return len(killed)


def _signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _recv_frame(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One frame and the file descriptors sent with it (a fork request carries the branch's
    socket). None at EOF or on a malformed frame."""
    header, fds = _recv_exact(sock, HEADER.size, with_fds=True)
    if header is None:
        return None, fds
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        return None, fds
    body, _ = _recv_exact(sock, n)
    return (None if body is None else decode(body)), fds


def _recv_exact(sock: socket.socket, n: int, with_fds: bool = False) -> tuple[bytes | None, list]:
    buf = bytearray()
    fds: list[int] = []
    while len(buf) < n:
        if with_fds:
            data, anc, _, _ = sock.recvmsg(n - len(buf), socket.CMSG_SPACE(4 * 4))
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(array.array("i", cdata[: len(cdata) - len(cdata) % 4]))
        else:
            data = sock.recv(n - len(buf))
        if not data:
            return None, fds
        buf += data
    return bytes(buf), fds


# ---------------------------------------------------------------------------------------------
# Session child: setup


def _isolate_network() -> bool:
    """Without the zygote's mount namespace: a fresh network namespace, best effort."""
    if iso.unshare(iso.CLONE_NEWNET):
        return True
    try:
        return iso.unshare_with_user_namespace(iso.CLONE_NEWNET)
    except OSError:
        return False


def _close_other_fds(keep: int) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _private_dirs(sid: str, cfg: dict, owner: int) -> str:
    """A private tmpfs on /tmp (and /dev/shm) for this session's mount namespace; returns the
    working directory inside it."""
    size = cfg["limits"]["disk_mb"]
    iso.mount_tmpfs("/tmp", size, owner, owner, "0755")
    try:
        iso.mount_tmpfs("/dev/shm", size, owner, owner, "1777")
    except OSError:
        pass  # no /dev/shm here: multiprocessing's semaphores will not work, nothing else
    workdir = f"/tmp/{sid}"
    os.mkdir(workdir, 0o700)
    os.chown(workdir, owner, owner)
    return workdir


def _isolate(sid: str, cfg: dict, family_uid: int | None, host_dir: str) -> tuple[str, dict]:
    """Everything that runs as root (of the host or of the zygote's user namespace) before the
    session drops its privileges. Returns the working directory and what was isolated."""
    mode = cfg["isolation"]
    if not mode["mount"]:
        return host_dir, {**mode, "net": _isolate_network()}
    flags = iso.CLONE_NEWNS | iso.CLONE_NEWNET | iso.CLONE_NEWIPC | iso.CLONE_NEWUTS
    if family_uid is None:
        # Not root: a user namespace per session, because RLIMIT_NPROC counts per (user
        # namespace, uid) and every session has the caller's uid.
        entered = iso.unshare_with_user_namespace(flags)
    else:
        entered = iso.unshare(flags)
    if not entered:
        raise OSError(f"unshare of the session's namespaces failed: {iso.last_error()}")
    owner = os.getuid() if family_uid is None else family_uid
    workdir = _private_dirs(sid, cfg, owner)
    try:
        socket.sethostname("sandbox")
    except OSError:
        pass
    if family_uid is not None:
        iso.become(family_uid, family_uid)  # clears every capability
        iso.prctl(iso.PR_SET_DUMPABLE, 1)  # keep /proc/self readable by the session itself
    else:
        iso.drop_capabilities()
    return workdir, {**mode, "net": True}


def _set_rlimits(limits: dict) -> None:
    mem = limits["memory_mb"] << 20
    fsize = limits["file_size_mb"] << 20
    for res, value in (
        (resource.RLIMIT_DATA, mem),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, fsize),
        (resource.RLIMIT_NOFILE, limits["max_open_files"]),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
    ):
        resource.setrlimit(res, (value, value))
    if limits["cpu_s"] is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))


def _arm_death_signal(expected_parent: int) -> None:
    """Die with the zygote. Credential changes clear the death signal, so this runs after them;
    the parent check closes the race with a zygote that died before the signal was armed."""
    iso.prctl(iso.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(1)


def _capture_output() -> None:
    """fd 0 reads nothing; fds 1 and 2 go to in-memory files drained after every cell."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    for target, name in ((1, "stdout"), (2, "stderr")):
        fd = os.memfd_create(name)
        os.dup2(fd, target)
        os.close(fd)


def _ensure_capture_fds() -> None:
    """A cell may close or replace fd 1/2; give the next cell working capture files again."""
    for target, name in ((1, "stdout"), (2, "stderr")):
        try:
            ok = stat.S_ISREG(os.fstat(target).st_mode)
        except OSError:
            ok = False
        if not ok:
            fd = os.memfd_create(name)
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)


def _enter_workdir(workdir: str) -> None:
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(PATH=SESSION_PATH, HOME=workdir, LANG="C.UTF-8", TMPDIR=workdir)
    tempfile.tempdir = workdir


def _session_main(sock_fd: int, sid: str, cfg: dict, family_uid: int | None, host_dir: str) -> None:
    zygote_pid = _cell_state["zygote_pid"] = cfg["zygote_pid"]
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setpgid(0, 0)
    _arm_death_signal(zygote_pid)
    if sock_fd != SESSION_FD:
        os.dup2(sock_fd, SESSION_FD)
    _close_other_fds(SESSION_FD)  # the control socket must not be reachable from user code
    sock = socket.socket(fileno=SESSION_FD)

    workdir, isolation = _isolate(sid, cfg, family_uid, host_dir)
    _arm_death_signal(zygote_pid)
    _enter_workdir(workdir)
    _set_rlimits(cfg["limits"])
    if cfg["limits"].get("kill_background"):
        _cell_state["kill_background"] = iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
    _capture_output()
    if cfg["seccomp"] is not None:
        isolation["seccomp"] = iso.install_seccomp(cfg["seccomp"])
    signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = _on_unraisable
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past RLIMIT_FSIZE fail with EFBIG
    _reseed()

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    _cell_state["session_pid"] = os.getpid()
    ready = {"event": "ready", "pid": os.getpid(), "workdir": workdir, "isolation": isolation}
    sock.sendall(encode(ready))
    _serve_cells(sock, main.__dict__, cfg["limits"]["capture_chars"], ready)


def _reseed() -> None:
    """`random` reseeds itself after fork; numpy's global generator does not."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:
            pass


def _serve_cells(sock: socket.socket, ns: dict, cap: int, ready: dict) -> None:
    cell = 0
    while True:
        msg, fds = _recv_frame(sock)
        if msg is None:
            return
        op = msg.get("op")
        if op == "exec":
            cell += 1
            _ensure_capture_fds()
            sock.sendall(STARTED)
            sock.sendall(encode(_run_cell(msg["code"], cell, ns, cap)))
        elif op == "fork":
            branch_sock = _fork_branch(sock, msg["id"], fds, ready)
            if branch_sock is not None:  # this process is the new branch now
                sock = branch_sock
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _fork_branch(sock: socket.socket, sid: str, fds: list[int], ready: dict):
    """Fork this session at a cell boundary. The branch is a grandchild, orphaned at once, so
    it is reparented to the zygote (a child subreaper), which reaps it like any session. Returns
    the branch's socket in the branch, None in the original session (which has replied)."""
    if not fds:
        sock.sendall(encode({"status": "error", "error": "no socket came with the fork"}))
        return None
    # The branch must be orphaned to the zygote, not to this session: stop being a subreaper
    # until the middle process is gone (the setting is not inherited by children).
    subreaper = _cell_state["kill_background"]
    if subreaper:
        iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 0)
    try:
        middle = os.fork()
    except OSError as e:
        if subreaper:
            iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
        sock.sendall(encode({"status": "error", "error": f"fork failed: {e}"}))
        return None
    if middle:
        os.waitpid(middle, 0)
        if subreaper:
            iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
        sock.sendall(encode({"status": "forked"}))
        return None
    try:
        middle = os.getpid()
        if os.fork():
            os._exit(0)
        # the branch
        os.setpgid(0, 0)
        while os.getppid() == middle:  # until the middle process is gone and we are adopted
            time.sleep(0.0005)
        _arm_death_signal(_cell_state["zygote_pid"])
        if subreaper:
            iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
        branch_fd = fds.pop(0)
        sock.detach()  # fd 3 is about to become the branch's socket: the old object must not close it
        os.dup2(branch_fd, SESSION_FD)
        os.close(branch_fd)
        for fd in fds:
            os.close(fd)
        fds.clear()
        old = os.getcwd()
        workdir = os.path.join(
            os.path.dirname(old), sid if ready["isolation"]["mount"] else f"s-{sid}"
        )
        shutil.copytree(old, workdir, symlinks=True)
        _enter_workdir(workdir)
        _cell_state["session_pid"] = os.getpid()
        branch_sock = socket.socket(fileno=SESSION_FD)
        ready.update(pid=os.getpid(), workdir=workdir)
        branch_sock.sendall(encode(ready))
        return branch_sock
    except BaseException:
        traceback.print_exc()
        os._exit(1)


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
                _session_main(sock_fd, sid, self.cfg, family_uid, host_dir)
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
