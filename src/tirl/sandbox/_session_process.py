"""A session process: forked by the zygote, it sets itself up, then serves cells and forks.

`session_main` runs in the child of the zygote's fork (`tirl.sandbox._zygote`): it puts itself in
its own process group, dies with the zygote, isolates what it can (`_isolate`: namespaces, a
private /tmp, a family uid; see `tirl.sandbox.local` for what that means to users), enters its
working directory with a scrubbed environment, sets its rlimits, installs the seccomp filter and
the cell interrupt, and says "ready" on its socket (fd 3). Then it serves length-prefixed JSON
frames on that socket (`_serve_cells`):

    {"op": "exec", "code": ...}  -> {"event": "started"} once read (the parent's timeout clock
                                    starts there), then the cell's result (`tirl.sandbox._cells`)
    {"op": "fork", "id": SID} + the branch's socket (SCM_RIGHTS)
                                 -> {"status": "forked"}; the branch, a new session with the
                                    same variables, says "ready" on its own socket

Nothing here starts a thread: the process was forked from a single-threaded zygote and forks
again for `fork`.
"""

from __future__ import annotations

import array
import builtins
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import types

from tirl.sandbox import _cells as cells
from tirl.sandbox import _isolation as iso
from tirl.sandbox._wire import HEADER, MAX_FRAME, decode, encode

SESSION_FD = 3
STARTED = encode({"event": "started"})
SESSION_PATH = "/usr/local/bin:/usr/bin:/bin"


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
# Setup


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


def _enter_workdir(workdir: str) -> None:
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(PATH=SESSION_PATH, HOME=workdir, LANG="C.UTF-8", TMPDIR=workdir)
    tempfile.tempdir = workdir


def session_main(sock_fd: int, sid: str, cfg: dict, family_uid: int | None, host_dir: str) -> None:
    zygote_pid = cells.cell_state["zygote_pid"] = cfg["zygote_pid"]
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
        cells.cell_state["kill_background"] = iso.prctl(iso.PR_SET_CHILD_SUBREAPER, 1)
    cells.capture_output()
    if cfg["seccomp"] is not None:
        isolation["seccomp"] = iso.install_seccomp(cfg["seccomp"])
    signal.signal(signal.SIGINT, cells.on_sigint)
    sys.unraisablehook = cells.on_unraisable
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past RLIMIT_FSIZE fail with EFBIG
    _reseed()

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    cells.cell_state["session_pid"] = os.getpid()
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
            cells.ensure_capture_fds()
            sock.sendall(STARTED)
            sock.sendall(encode(cells.run_cell(msg["code"], cell, ns, cap)))
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
    subreaper = cells.cell_state["kill_background"]
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
        _arm_death_signal(cells.cell_state["zygote_pid"])
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
        cells.cell_state["session_pid"] = os.getpid()
        branch_sock = socket.socket(fileno=SESSION_FD)
        ready.update(pid=os.getpid(), workdir=workdir)
        branch_sock.sendall(encode(ready))
        return branch_sock
    except BaseException:
        traceback.print_exc()
        os._exit(1)
