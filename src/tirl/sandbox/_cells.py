"""One cell inside a session process: its output captured, its interrupt, its traceback, and
the processes it left running ended.

Imported by `tirl.sandbox._session_process` in the zygote (`tirl.sandbox._zygote`) before it
forks, so every session has it already; like the zygote it imports only the standard library
and two small tirl modules, and starts no thread.

- Output: `sys.stdout`/`sys.stderr` are bounded writers during a cell (head and tail kept, the
  count of what was dropped in between); fds 1 and 2 are in-memory files drained after the cell
  (output of C code and subprocesses), appended after the Python-level output.
- Interrupt: the parent's timeout SIGINT raises KeyboardInterrupt only while a cell runs
  (`cell_state["in_cell"]`); one that Python swallows (an at-fork hook, a __del__) is raised
  again in the frame it would have reached.
- Traceback: the user's frames only: every frame of this module is hidden (`_HIDDEN`), so a
  cell never sees the sandbox's own code.
- Background processes: with `limits["kill_background"]` the session is a child subreaper, so
  every process a cell starts stays its descendant even after a double fork or setsid; after
  each cell, before the output is collected, `_end_background` kills all of them.
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import resource
import signal
import stat
import sys
import time
import traceback
import types

from tirl.sandbox.formatter import truncate_middle, truncation_marker

BACKGROUND_KILL_S = 5.0  # per phase of `_end_background` (stop, then kill)
_HIDDEN = globals()  # frames whose globals are these belong to the sandbox and are hidden

# ---------------------------------------------------------------------------------------------
# Output capture


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
# Running a cell

cell_state = {
    "in_cell": False,
    "interrupted": False,
    "session_pid": 0,
    "zygote_pid": 0,
    "kill_background": False,
}


def on_sigint(signum: int, frame: types.FrameType | None) -> None:
    # The parent sends SIGINT on timeout. Outside a cell (between cells, or while the reply is
    # being sent) it is ignored, so a late interrupt can never break the protocol.
    if cell_state["in_cell"]:
        cell_state["interrupted"] = True
        raise KeyboardInterrupt


def on_unraisable(unraisable) -> None:
    # Python swallows an exception raised where it cannot propagate: in an os.register_at_fork
    # hook (logging's lock release runs inside every os.fork()), a __del__, a weakref callback.
    # Our KeyboardInterrupt landing there would be lost, and the cell would run on until it is
    # killed (a fork bomb spends most of its time in fork). Raise it again instead, in the frame
    # it would have reached: the one whose call into C ran the hook (the way pdb stops a
    # running frame: its f_trace, with tracing on, sees its next line).
    caller = sys._getframe().f_back
    if (
        isinstance(unraisable.exc_value, KeyboardInterrupt)
        and cell_state["in_cell"]
        and cell_state["interrupted"]
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
    if cell_state["in_cell"]:
        raise KeyboardInterrupt


def _user_traceback(exc: BaseException) -> str:
    """Format `exc` with every frame of this module removed."""
    kept = []
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals is not _HIDDEN:
            kept.append(tb)
        tb = tb.tb_next
    new_tb = None
    for t in reversed(kept):
        new_tb = types.TracebackType(new_tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return "".join(traceback.format_exception(type(exc), exc, new_tb))


def run_cell(code: str, cell: int, ns: dict, cap: int) -> dict:
    filename = f"<cell {cell}>"
    out, err = _BoundedWriter(cap), _BoundedWriter(cap)
    sys.stdout, sys.stderr = out, err
    status, tb_text, message = "ok", None, ""
    cell_state["interrupted"] = False
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
            cell_state["in_cell"] = True
            try:
                exec(body, ns)
                if tail is not None:
                    value = eval(tail, ns)
                    if value is not None:
                        print(repr(value))
            finally:
                cell_state["in_cell"] = False
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the session lives on
        status = "memory" if isinstance(e, MemoryError) else "error"
        message = str(e) if isinstance(e, MemoryError) else ""
        try:
            tb_text = _user_traceback(e)
        except MemoryError:
            tb_text = f"{type(e).__name__}: {e}\n"
    finally:
        cell_state["in_cell"] = False
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    if os.getpid() != cell_state["session_pid"]:
        # A process the cell forked (os.fork) got here: it must not answer on the session's
        # socket or drain its output. End it like a script would end.
        os._exit(0 if status == "ok" else 1)
    if cell_state["kill_background"]:
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
        "interrupted": cell_state["interrupted"],
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


def capture_output() -> None:
    """fd 0 reads nothing; fds 1 and 2 go to in-memory files drained after every cell."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    for target, name in ((1, "stdout"), (2, "stderr")):
        fd = os.memfd_create(name)
        os.dup2(fd, target)
        os.close(fd)


def ensure_capture_fds() -> None:
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
