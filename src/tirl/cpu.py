"""How many CPU threads torch uses: as many as the cores other processes leave free (issue 28).

On a shared machine (a laptop, a CI runner) torch's default, one intra-op thread per core, costs
far more than a neighbour's share of the CPU: its threads work in lock-step, so when a neighbour
holds one of the cores every parallel operation waits for the thread that is not running, and
OpenMP's idle threads spin meanwhile. On 2 cores beside one busy process the quickstart's SFT
step ran 3.1-3.4x slower than alone, beside a second torch job 3.6-5.5x (`bench/threads.py`,
BENCHMARKS.md). One thread fewer than cores busy by others costs about the neighbour's share.

`threads: 0` (the default) therefore re-chooses torch's intra-op threads as the run goes: at each
`pace()` (between training steps and generation steps) at most once per `INTERVAL_S`, it measures
the CPU time other processes used since the last choice (all CPUs' busy time from /proc/stat,
less this process's own) and takes the cores they left free, at least 1 and at most the cores
this process may run on. Alone it keeps every core (torch's default speed); a neighbour that
arrives or leaves mid-run is followed within a step or two. `threads: N` fixes N, which also
makes a run's arithmetic independent of the machine's load (intra-op parallel reductions can
round differently with another thread count). OpenMP's wait policy is left as it is: a passive
wait would cost a run alone about 30% (BENCHMARKS.md), and with one thread nothing waits.

Where /proc/stat is absent (not Linux) `threads: 0` keeps torch's default.

torch's thread count is per thread of the process (OpenMP reads it per thread), so each thread
that computes calls `pace()` itself; the choice is shared.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

INTERVAL_S = 1.0  # the shortest window a choice is measured over (100 clock ticks per CPU)


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def busy_cpu_seconds() -> float | None:
    """CPU time all processes spent busy since boot (every CPU, in seconds), from /proc/stat;
    None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user .. steal, less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU time this process (all its threads, not its children) has used."""
    times = os.times()
    return times.user + times.system


def threads_for(others_busy_cores: float, usable: int) -> int:
    """The intra-op threads to use when other processes keep `others_busy_cores` cores busy:
    the free ones, rounded, at least 1 and at most `usable`."""
    return max(1, min(usable, round(usable - others_busy_cores)))


Sample = tuple[float, float, float]  # (monotonic s, busy_cpu_seconds, own_cpu_seconds)


def others_busy_cores(before: Sample, after: Sample) -> float:
    """How many cores other processes kept busy, on average, between two samples."""
    wall, busy, own = (b - a for a, b in zip(before, after))
    return max(0.0, busy - own) / wall


class ThreadGovernor:
    """Chooses torch's intra-op threads (module doc); `pace()` applies the choice on the
    calling thread. `fixed` > 0: always that many."""

    def __init__(self, fixed: int = 0, interval_s: float = INTERVAL_S):
        self.fixed = fixed
        self.interval_s = interval_s
        self.usable = usable_cores()
        self.threads = fixed or self.usable
        self._lock = threading.Lock()
        self._applied = threading.local()  # the count each thread last set
        self.sharers = 1  # threads of this process computing at once (`sharing_cores`)
        self._mark = self._sample()

    @staticmethod
    def _sample() -> Sample | None:
        busy = busy_cpu_seconds()
        return None if busy is None else (time.monotonic(), busy, own_cpu_seconds())

    def _rechoose(self) -> None:
        if self.fixed or self._mark is None:
            return
        if time.monotonic() - self._mark[0] < self.interval_s:
            return  # the common case, without reading /proc/stat
        with self._lock:
            now = self._sample()
            if now is None or now[0] - self._mark[0] < self.interval_s:
                return  # another thread has just chosen
            self.threads = threads_for(others_busy_cores(self._mark, now), self.usable)
            self._mark = now

    def pace(self, at_most: int = 0) -> int:
        """Re-choose if a window has passed, and set the choice on this thread (`at_most` > 0:
        no more than that); returns it."""
        import torch

        self._rechoose()
        threads = max(1, self.threads // self.sharers)
        if at_most:
            threads = min(threads, at_most)
        if getattr(self._applied, "threads", None) != threads:
            torch.set_num_threads(threads)
            self._applied.threads = threads
        return threads


_governor: ThreadGovernor | None = None


def configure_threads(threads: int) -> None:
    """Govern torch's threads for this process: `threads` > 0 fixes them, 0 follows the free
    cores (module doc). Until this is called, `pace()` does nothing (tirl as a library leaves
    the caller's torch settings alone)."""
    global _governor
    _governor = ThreadGovernor(threads)
    _governor.pace()


@contextlib.contextmanager
def sharing_cores(sharers: int):
    """While inside, `sharers` threads of this process compute at once (the sampler and a
    one-step-off-policy update): each `pace()` takes 1/`sharers` of the threads, so that
    their OpenMP teams together do not outnumber the cores. A no-op for 1 or when the
    threads are not governed."""
    if _governor is None or sharers <= 1:
        yield
        return
    _governor.sharers = sharers
    try:
        _governor.pace()
        yield
    finally:
        _governor.sharers = 1


def pace(at_most: int = 0) -> None:
    """Between steps of work, on the thread that computes: apply the governor's choice, and
    `at_most` > 0 as a cap on it (ungoverned: on torch's own count). A cap is for work whose
    operations are too small to gain from more threads: the HF engine's decode steps on a tiny
    model ran faster on one thread than on two (`rollout.engine_options: {threads: 1}`)."""
    if _governor is not None:
        _governor.pace(at_most)
    elif at_most:
        import torch

        if torch.get_num_threads() > at_most:
            torch.set_num_threads(at_most)
