"""The math-verify worker process behind `tirl.rewards.verify.MathVerifier`.

The pool starts it as a plain program, `python -c <boot code> <json config>`, not through
multiprocessing: nothing of the caller's `__main__` is imported (so unguarded scripts, `python -`
and notebooks work), and a daemonic `multiprocessing.Pool` worker or a Ray worker may start it.
The boot code (built by `command`) first sets `sys.path` to the caller's, with the folder holding
this copy of `tirl` on it, so the worker runs the same code as the caller whether `tirl` was
installed or put on `sys.path` from a source folder.

Messages travel over an inherited socket wrapped as a `multiprocessing.connection.Connection`
(pickled tuples, as `multiprocessing.Pipe` sends them): the worker sends ("ready", pid) or
("error", text) once, then for each list of (gold, prediction) it receives, one
("result", ok, reason) per pair; None or end of file stops it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

# Runs before anything but `sys` is imported, so a stray `json.py` in the caller's working
# directory cannot shadow the standard library. {path} is a Python literal list of folders.
_BOOT = """\
import sys
sys.path[:] = {path}
try:
    from tirl.rewards._verify_worker import main
except BaseException as e:
    from multiprocessing.connection import Connection
    import json
    fd = json.loads(sys.argv[1])["fd"]
    Connection(fd).send(("error", f"cannot import tirl in the worker: {{type(e).__name__}}: {{e}}"))
    raise SystemExit(1)
main()
"""


def _search_path() -> list[str]:
    """The caller's `sys.path`, absolute, with the folder that holds this `tirl` on it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path: list[str] = []
    for entry in sys.path:
        if not isinstance(entry, (str, os.PathLike)):
            continue
        entry = os.path.abspath(os.fspath(entry)) if entry else os.getcwd()
        if isinstance(entry, str) and entry not in path:
            path.append(entry)
    if root not in path:  # found some other way (an import hook): make sure this copy wins
        path.insert(0, root)
    return path


def command(fd: int, parent_pid: int, mode: str, memory_limit_mb: int | None) -> list[str]:
    """The argv that starts one worker talking over the inherited file descriptor `fd`."""
    if not sys.executable:
        raise RuntimeError("sys.executable is empty: cannot start math-verify workers")
    config = {"fd": fd, "parent_pid": parent_pid, "mode": mode, "memory_limit_mb": memory_limit_mb}
    try:  # the interpreter flags (-S, -I, -X ...) the caller runs with, as multiprocessing does
        from subprocess import _args_from_interpreter_flags  # type: ignore[attr-defined]

        flags = _args_from_interpreter_flags()
    except ImportError:
        flags = []
    boot = _BOOT.format(path=repr(_search_path()))
    return [sys.executable, *flags, "-c", boot, json.dumps(config)]


def _set_parent_death_signal(parent_pid: int) -> None:
    """Linux: die with the parent even while stuck in C code (a thread could not run then)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(0)


def serve(conn: Any, parent_pid: int, mode: str, memory_limit_mb: int | None) -> None:
    """Worker loop: receive a list of (gold, prediction), send one ("result", ok, reason) each."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _set_parent_death_signal(parent_pid)
    try:
        # exec keeps the signal mask: a caller thread that blocked signals must not pass it on.
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if memory_limit_mb:
            import resource

            limit = memory_limit_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        import logging

        for name in ("math_verify", "latex2sympy2_extended"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        from tirl.rewards._judge import judge

        # Import sympy and load the ANTLR parser now, not in the first comparison's time budget:
        # a pair that neither the string steps nor the fast path settle ("1" vs "1" would be).
        warm_up = mode if mode in ("bare", "boxed") else "slow"
        judge("\\sqrt{2}", "2^{1/2}", warm_up)  # type: ignore[arg-type]
    except BaseException as e:  # noqa: BLE001 - report any start-up failure to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for gold, pred in batch:
            try:
                ok, reason = judge(gold, pred, mode)  # type: ignore[arg-type]
            except RecursionError:
                ok, reason = False, "guard: expression too deeply nested"
            except Exception as e:  # math-verify raised: the answer is not verified
                ok, reason = False, f"error: {type(e).__name__}"
            conn.send(("result", bool(ok), reason))


def main() -> None:
    config = json.loads(sys.argv[1])
    conn = Connection(config["fd"])
    try:
        serve(conn, config["parent_pid"], config["mode"], config["memory_limit_mb"])
    finally:
        conn.close()
