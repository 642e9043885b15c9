"""Is a predicted answer mathematically equal to the gold one? math-verify, made safe for training.

Equivalence is decided by math-verify (`parse` + `verify`, huggingface/Math-Verify); this module
adds what a reward function needs around it:

- A hard timeout that works from any thread, asyncio task or worker process. math-verify's own
  timeout is SIGALRM, which only works in the main thread and cannot interrupt a long C-level
  big-integer operation. Here math-verify runs in worker processes, each a fresh interpreter
  started with `subprocess` (`tirl.rewards._verify_worker`), not with multiprocessing: the caller
  may hold torch/OpenMP threads, which `fork` would copy in a broken state, and multiprocessing's
  "spawn" would re-import the caller's `__main__` and refuse to start from a daemonic process.
  A comparison still running at its deadline gets a TIMEOUT verdict at the deadline and its
  worker is killed (SIGKILL) and replaced. Workers die with the process that started them
  (PR_SET_PDEATHSIG) and run under a memory limit.
- Guards against math-verify's false positives, found by testing (each names its case below and
  in `tests/data/verifier_cases.jsonl`). Guards only ever turn a "yes" into a "no" (or refuse
  before calling math-verify), so they cannot add false positives of their own.
- A fast path in the caller's process, ahead of the pool: most answers are plain numbers or small
  expressions, which `_judge.quick_verdict` decides with string work and exact rational
  arithmetic in microseconds, giving the verdict the sympy path gives (tested on every labelled
  case both ways); and a cache of the pool's verdicts, keyed by (gold, prediction), so a pair
  seen before (another epoch, another sample of the group) is not sent again. Timeouts and
  errors are not cached.

Not in scope: extracting the answer from model text (`tirl.rewards.answer`), multiple-choice
letter matching beyond `\\text{(C)}` vs `C`, and natural-language answers beyond exact word
match. `prediction` is the extracted answer (the content of the last box); a whole text is
judged by its box only when it holds exactly one.

Works from scripts without an `if __name__ == "__main__"` guard, from `python -` and notebooks,
inside daemonic `multiprocessing.Pool` workers and inside other frameworks' worker processes
(verl's reward functions run in Ray workers): a worker imports `tirl` and math-verify, never the
caller's main module. Known limits: a worker process costs about 60 MB and 0.5 s to start; it
runs `sys.executable` with the caller's `sys.path`, so an interpreter embedded in another
program (where `sys.executable` is not a Python) cannot start workers.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import socket
import subprocess
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _mp_wait
from typing import Any

from tirl.rewards import _verify_worker
from tirl.rewards._judge import (  # noqa: F401  (judge: for debugging)
    MODES,
    Mode,
    judge,
    quick_verdict,
)


@dataclass(frozen=True)
class Verdict:
    """The answer is `correct` or not; `reason` says why (or "equivalent")."""

    correct: bool
    reason: str

    @property
    def timed_out(self) -> bool:
        return self.reason.startswith("timed out")


_MARGIN_S = 1.0  # how long a caller waits past a deadline before giving up on the manager


def _timeout_verdict(timeout_s: float) -> Verdict:
    return Verdict(False, f"timed out after {timeout_s:g} s")


# =============================================================================================
# The pool: a manager thread owns the worker processes, the queue and the deadlines.
# =============================================================================================


class _Job:
    __slots__ = ("gold", "pred", "timeout_s", "future", "deadline")

    def __init__(self, gold: str, pred: str, timeout_s: float, deadline: float | None) -> None:
        self.gold, self.pred, self.timeout_s = gold, pred, timeout_s
        self.future: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
        # Absolute time.monotonic() deadline, or None: timeout_s from when a worker starts it.
        self.deadline = deadline


class _Worker:
    __slots__ = ("process", "conn", "ready", "jobs", "started")

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process, self.conn = process, conn
        self.ready = False
        self.jobs: deque[_Job] = deque()  # sent, not answered; jobs[0] is running
        self.started = 0.0  # when jobs[0] started


def _resolve(job: _Job, verdict: Verdict) -> None:
    if not job.future.done():
        try:
            job.future.set_result(verdict)
        except concurrent.futures.InvalidStateError:  # cancelled by a caller meanwhile
            pass


class MathVerifier:
    """A pool of math-verify worker processes with hard per-comparison timeouts.

    `verify` and `averify` give each call `timeout_s` from the moment it is made (time spent
    queued behind other calls counts). `verify_batch` gives each pair `timeout_s` from the moment
    a worker starts it, and sends up to `chunk_size` pairs per worker round trip. A comparison
    still running at its deadline gets `Verdict(False, "timed out after X s")` at the deadline,
    and its worker is killed and replaced. Calls wait for the workers to start only the first
    time (up to `start_timeout_s`), even those the fast path answers, so a verifier whose workers
    cannot start fails on every call, whatever the answers. Safe to share between threads and
    event loops.

    In "guarded" mode, pairs the fast path (`quick_verdict`) decides never reach a worker; the
    pool's verdicts are kept in a cache of up to `cache_size` pairs (0: no cache), least
    recently used first out.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        *,
        chunk_size: int = 16,
        mode: Mode = "guarded",
        memory_limit_mb: int | None = 2048,
        start_timeout_s: float = 120.0,
        cache_size: int = 100_000,
    ) -> None:
        if workers < 1 or timeout_s <= 0 or chunk_size < 1 or cache_size < 0:
            raise ValueError(
                "need workers >= 1, timeout_s > 0, chunk_size >= 1 and cache_size >= 0"
            )
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
        self.workers, self.timeout_s, self.chunk_size, self.mode = (
            workers, timeout_s, chunk_size, mode
        )  # fmt: skip
        self._memory_limit_mb = memory_limit_mb
        self._start_timeout_s = start_timeout_s
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._calls: deque[_Job] = deque()  # single calls, each with a deadline; served first
        self._batch: deque[_Job] = deque()  # batch pairs: timeout counted from their start
        self._workers: list[_Worker] = []
        self._closed = False
        self._broken: str | None = None
        self._start_failures = 0
        self._ready = threading.Event()
        self._cache: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # Workers are started by this thread only: PR_SET_PDEATHSIG follows the creating thread.
        self._thread = threading.Thread(target=self._run, name="tirl-math-verifier", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    def verify(self, gold: str, prediction: str | None, timeout_s: float | None = None) -> Verdict:
        """Verdict for one pair; returns within timeout_s (plus about a second at worst)."""
        timeout = self._timeout(timeout_s)
        if (early := _early_verdict(prediction)) is not None:
            return early
        self._wait_ready()
        if (known := self._known(str(gold), str(prediction))) is not None:
            return known
        job = self._submit([(str(gold), str(prediction))], timeout, from_now=True)[0]
        try:
            return job.future.result(timeout=timeout + _MARGIN_S)
        except concurrent.futures.TimeoutError:
            job.future.cancel()
            return _timeout_verdict(timeout)

    async def averify(
        self, gold: str, prediction: str | None, timeout_s: float | None = None
    ) -> Verdict:
        """`verify` for asyncio: never blocks the event loop."""
        timeout = self._timeout(timeout_s)
        if (early := _early_verdict(prediction)) is not None:
            return early
        if not self._ready.is_set():
            await asyncio.to_thread(self._wait_ready)
        self._wait_ready()  # set by now: raises at once if the workers cannot start
        if (known := self._known(str(gold), str(prediction))) is not None:
            return known
        job = self._submit([(str(gold), str(prediction))], timeout, from_now=True)[0]
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job.future), timeout + _MARGIN_S)
        except asyncio.TimeoutError:
            return _timeout_verdict(timeout)

    def verify_batch(
        self, pairs: Iterable[tuple[str, str | None]], timeout_s: float | None = None
    ) -> list[Verdict]:
        """Verdicts for many (gold, prediction) pairs, in order; identical pairs run once."""
        timeout = self._timeout(timeout_s)
        pairs = [(str(g), p) for g, p in pairs]
        out: list[Verdict | None] = [_early_verdict(p) for _, p in pairs]
        if any(v is None for v in out):
            self._wait_ready()
        unique: dict[tuple[str, str], list[int]] = {}
        for i, (g, p) in enumerate(pairs):
            if out[i] is None:
                out[i] = self._known(g, str(p))
                if out[i] is None:
                    unique.setdefault((g, str(p)), []).append(i)
        if unique:
            # Pairs with the same gold travel together: a worker parses that gold once
            # (math-verify caches parsed LaTeX), not once per worker.
            unique = dict(sorted(unique.items(), key=lambda item: item[0][0]))
            jobs = self._submit(list(unique), timeout, from_now=False)
            pending = {job.future for job in jobs}
            while pending:  # each job ends by its deadline; this loop only guards the manager
                _, pending = concurrent.futures.wait(pending, timeout=1.0)
                if pending and not self._thread.is_alive():
                    raise RuntimeError(self._broken or "MathVerifier manager thread stopped")
            for job, indices in zip(jobs, unique.values()):
                for i in indices:
                    out[i] = job.future.result()
        return [v for v in out if v is not None]

    def close(self) -> None:
        """Stop the workers; queued and running calls fail with RuntimeError. Idempotent."""
        if os.getpid() != self._pid:  # a forked copy: the workers belong to the parent
            return
        with self._lock:
            self._closed = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ caller side

    def _timeout(self, timeout_s: float | None) -> float:
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        return timeout

    def _known(self, gold: str, prediction: str) -> Verdict | None:
        """The verdict without a worker: the fast path's, or a cached one; None if neither."""
        if self.mode == "guarded" and (quick := quick_verdict(gold, prediction)) is not None:
            return Verdict(*quick)
        if self._cache_size:
            with self._cache_lock:
                if (verdict := self._cache.get((gold, prediction))) is not None:
                    self._cache.move_to_end((gold, prediction))
                    return verdict
        return None

    def _remember(self, job: _Job, verdict: Verdict) -> None:
        """Cache a worker's verdict; timeouts and errors may not recur, so they are not kept."""
        if not self._cache_size or verdict.reason.startswith("error"):
            return
        with self._cache_lock:
            self._cache[(job.gold, job.pred)] = verdict
            self._cache.move_to_end((job.gold, job.pred))
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _wait_ready(self) -> None:
        if self._closed:  # also for pairs the fast path or the cache would answer
            raise RuntimeError("MathVerifier is closed")
        if not self._ready.wait(self._start_timeout_s) or self._broken:
            raise RuntimeError(self._broken or "math-verify workers did not start in time")

    def _submit(self, pairs: list[tuple[str, str]], timeout: float, from_now: bool) -> list[_Job]:
        now = time.monotonic()
        jobs = [_Job(g, p, timeout, now + timeout if from_now else None) for g, p in pairs]
        with self._lock:
            if self._closed or self._broken:
                raise RuntimeError(self._broken or "MathVerifier is closed")
            (self._calls if from_now else self._batch).extend(jobs)
        self._wake()
        return jobs

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):  # already signalled (buffer full) or closed
            pass

    # ------------------------------------------------------------------ manager thread

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed or self._broken:
                        break
                    now = time.monotonic()
                    self._spawn_missing()
                    self._expire(now)
                    self._dispatch(now)
                    timeout = self._next_wakeup(now)
                    conns = [w.conn for w in self._workers]
                for conn in _mp_wait([self._wake_r, *conns], timeout):
                    if conn is self._wake_r:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except (BlockingIOError, OSError):
                            pass
                    else:
                        with self._lock:
                            self._receive(conn)
        finally:
            self._shutdown()

    def _spawn_missing(self) -> None:
        while len(self._workers) < self.workers and not self._broken:
            # A socket pair wrapped as Connection is what multiprocessing.Pipe() builds on Unix.
            parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                argv = _verify_worker.command(
                    child_end.fileno(), os.getpid(), self.mode, self._memory_limit_mb
                )
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,  # the caller's stdout may be a data channel
                    pass_fds=(child_end.fileno(),),
                )
            except (OSError, RuntimeError, ValueError) as e:
                parent_end.close()
                self._start_failures += 1
                if self._start_failures >= 3:
                    self._set_broken(f"cannot start a worker process: {type(e).__name__}: {e}")
                return
            finally:
                child_end.close()
            self._workers.append(_Worker(process, Connection(parent_end.detach())))

    def _kill(self, worker: _Worker) -> None:
        self._workers.remove(worker)
        worker.process.kill()
        _reap(worker.process)
        worker.conn.close()
        # Jobs sent after the running one have not started: back to the front of their queue.
        self._requeue([j for j in worker.jobs if not j.future.done()])
        worker.jobs.clear()

    def _requeue(self, jobs: list[_Job]) -> None:
        self._calls.extendleft(reversed([j for j in jobs if j.deadline is not None]))
        self._batch.extendleft(reversed([j for j in jobs if j.deadline is None]))

    def _expire(self, now: float) -> None:
        expired = lambda j: j.deadline is not None and j.deadline <= now  # noqa: E731
        if any(j.future.done() or expired(j) for j in self._calls):
            keep: deque[_Job] = deque()
            for job in self._calls:
                if expired(job):
                    _resolve(job, _timeout_verdict(job.timeout_s))
                elif not job.future.done():
                    keep.append(job)
            self._calls = keep
        for worker in list(self._workers):
            if worker.jobs and now >= self._deadline(worker):
                job = worker.jobs.popleft()
                _resolve(job, _timeout_verdict(job.timeout_s))
                self._kill(worker)

    @staticmethod
    def _deadline(worker: _Worker) -> float:
        job = worker.jobs[0]
        return job.deadline if job.deadline is not None else worker.started + job.timeout_s

    def _dispatch(self, now: float) -> None:
        idle = [w for w in self._workers if w.ready and not w.jobs]
        for worker in idle:
            # A single call travels alone, so it never waits behind a slow pair sent with it
            # while another worker is free; batch pairs travel in chunks of up to chunk_size.
            if self._calls:
                batch = [self._calls.popleft()]
            elif self._batch:
                size = min(self.chunk_size, -(-len(self._batch) // len(idle)))
                batch = [self._batch.popleft() for _ in range(min(size, len(self._batch)))]
            else:
                return
            try:
                worker.conn.send([(j.gold, j.pred) for j in batch])
            except (OSError, ValueError):
                self._requeue(batch)
                self._kill(worker)
                continue
            worker.jobs.extend(batch)
            worker.started = now

    def _next_wakeup(self, now: float) -> float:
        times = [self._deadline(w) for w in self._workers if w.jobs]
        times += [j.deadline for j in self._calls if j.deadline is not None]
        return min([1.0, *(max(0.0, t - now) for t in times)])

    def _receive(self, conn: Any) -> None:
        worker = next((w for w in self._workers if w.conn is conn), None)
        if worker is None:
            return
        try:
            while conn.poll():
                message = conn.recv()
                kind = message[0]
                if kind == "result":
                    if worker.jobs:
                        job = worker.jobs.popleft()
                        verdict = Verdict(message[1], message[2])
                        self._remember(job, verdict)
                        _resolve(job, verdict)
                        worker.started = time.monotonic()
                elif kind == "ready":
                    worker.ready = True
                    self._start_failures = 0
                    self._ready.set()
                elif kind == "error":
                    self._start_failed(worker, message[1])
                    return
        except (EOFError, OSError):
            self._died(worker)

    def _start_failed(self, worker: _Worker, error: str) -> None:
        self._kill(worker)
        self._start_failures += 1
        if self._start_failures >= 3:
            # Under a tight memory limit the worker's report of its own MemoryError can fail
            # too (it exits instead): the limit is named either way, as the likely cause.
            limit = f" (memory_limit_mb={self._memory_limit_mb})" if self._memory_limit_mb else ""
            self._set_broken(f"math-verify workers fail to start{limit}: {error}")

    def _set_broken(self, error: str) -> None:
        self._broken = error
        self._ready.set()  # wake callers waiting for readiness; they see _broken

    def _died(self, worker: _Worker) -> None:
        if not worker.ready:
            code = _reap(worker.process)
            self._start_failed(worker, f"a worker exited with code {code} before it was ready")
            return
        if worker.jobs:
            code = _reap(worker.process)
            died = Verdict(False, f"error: worker died (exit code {code})")
            _resolve(worker.jobs.popleft(), died)
        self._kill(worker)

    def _shutdown(self) -> None:
        with self._lock:
            for worker in list(self._workers):
                self._kill(worker)
            error = RuntimeError(self._broken or "MathVerifier is closed")
            for job in (*self._calls, *self._batch):
                if not job.future.done():
                    job.future.set_exception(error)
            self._calls.clear()
            self._batch.clear()
            self._ready.set()
        self._wake_r.close()
        self._wake_w.close()


def _reap(process: subprocess.Popen[bytes]) -> int | None:
    """Wait briefly for a worker that was killed or closed its end; its exit code, if known."""
    try:
        return process.wait(timeout=1.0)
    except subprocess.TimeoutExpired:  # reaped later by subprocess's own bookkeeping
        return None


def _early_verdict(prediction: str | None) -> Verdict | None:
    if prediction is None or not str(prediction).strip():
        return Verdict(False, "no answer")
    return None


# ------------------------------------------------------------------ module-level default

_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide verifier behind `verify_answer`, created on first use (2 workers)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
        return _default


def verify_answer(gold: str, prediction: str | None, timeout_s: float = 5.0) -> Verdict:
    """Is `prediction` (an extracted answer, None if there was none) equal to `gold`?

    Usable from any thread, asyncio task (it blocks; prefer `default_verifier().averify`) or
    worker process; returns within `timeout_s` plus about a second at worst.
    """
    return default_verifier().verify(gold, prediction, timeout_s=timeout_s)


def _close_default() -> None:
    if _default is not None:
        _default.close()


def _forget_default_after_fork() -> None:
    # A forked child inherits the object but not its thread; it must start its own.
    global _default, _default_lock
    _default, _default_lock = None, threading.Lock()


atexit.register(_close_default)
os.register_at_fork(after_in_child=_forget_default_after_fork)
