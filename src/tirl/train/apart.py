"""Run functions at once, each in a process of its own (`parallel_variants`).

A small model's training step uses a second core poorly (the quickstart's SFT step is ~1.25x
faster on two threads than on one, BENCHMARKS.md), so two variants trained side by side, one
process each, finish sooner than one after the other on two threads each. Processes, not
threads: each variant has its own torch RNG, sandbox and event loop, and Python code of one
never waits for the other's.

Processes are spawned (a fork would copy the parent's threads' locks), and each gets
`TQDM_POSITION` = its index so that their progress bars take lines of their own. The first
failure (an exception in a child, or a child that dies) stops the others and is raised in the
parent; so is Ctrl-C. A parent killed outright (`kill -9`, the OOM killer) runs none of that,
so on Linux each child asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`):
no variant trains on, unseen, after the command is gone. Each child also holds a duplicate of
the parent's folder locks (`tirl.files.held_lock_fds`), so the run folder stays locked until
the last child has ended: a `--resume` started right after a kill is refused, not run beside
a dying writer.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import DupFd
from typing import Any

from tirl.files import held_lock_fds
from tirl.lifetime import die_with


class ChildDied(RuntimeError):
    """A child process ended without a result (killed, or out of memory)."""


def _child(
    conn: Connection, parent: int, locks: list, target: Callable[..., Any], args: tuple
) -> None:
    die_with(parent)
    for lock in locks:  # held, not closed, until this process ends
        os.set_inheritable(lock.detach(), False)
    try:
        conn.send(("ok", target(*args)))
    except BaseException as exc:  # sent whole: the parent raises it as it was
        conn.send(("error", exc))
    finally:
        conn.close()


def _ending(proc: multiprocessing.process.BaseProcess) -> str:
    """How a child ended, in words: "killed by SIGKILL (out of memory?)", "exit code 3"."""
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exit code {code}"


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """`os.environ` with `values` set while a child is spawned (it copies the environment)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_apart(target: Callable[..., Any], jobs: Sequence[tuple], names: Sequence[str]) -> list:
    """`target(*args)` for every `args` of `jobs`, all at once, each in a spawned process;
    their results, in order. `names` say which job a failure is about."""
    spawn = multiprocessing.get_context("spawn")
    procs, ends = [], []
    try:
        for position, args in enumerate(jobs):
            ours, theirs = spawn.Pipe(duplex=False)
            with _environment(TQDM_POSITION=str(position)):
                locks = [DupFd(fd) for fd in held_lock_fds()]
                proc = spawn.Process(
                    target=_child,
                    args=(theirs, os.getpid(), locks, target, args),
                    name=names[position],
                )
                proc.start()
            theirs.close()
            procs.append(proc)
            ends.append(ours)
        results: dict[int, Any] = {}
        while len(results) < len(jobs):
            for end in wait([e for i, e in enumerate(ends) if i not in results]):
                i = ends.index(end)
                try:
                    status, value = end.recv()
                except EOFError:
                    procs[i].join()
                    raise ChildDied(
                        f"{names[i]}: its process ended without a result ({_ending(procs[i])});"
                        " what it finished is kept: rerun with --resume"
                    ) from None
                if status == "error":
                    raise value
                results[i] = value
        return [results[i] for i in range(len(jobs))]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
