"""The local sandbox under load: many concurrent callers, hostile sessions among them.

What is shown here, with real processes:
- 1,000 concurrent `session()` calls, 50 of them hostile (programs from
  tests/test_sandbox_adversarial.py: fork bombs, memory bombs, loops that ignore SIGINT, ...),
  every one of the 1,000 sessions held open until all have been handed out: every call returns,
  every honest answer is right, no honest cell times out (`timeout_s` 5 s, the default), and
  closing leaves no process. Figures (wall, cells/s, cell p50/p99, peak memory) are printed;
  run with `-s` to see them. On the 2-core, 24 GB machine this project uses, it takes 25-50 s
  (depending on what else runs) and ~3 GB (half of it the memory bombs, 512 MB each allowed).
- the cause of the old hang: bursts of requests on a full control socket (the zygote's queue
  holds 10 records), forks and interrupts alike, all get through;
- back-pressure: no more than `max_starting` sessions start at once, whatever the callers do;
- the timeout clock: time a cell waits before its session reads it, and time an interrupt waits
  before the zygote delivers it, are not charged to the cell.

Every test is bounded by an asyncio timeout that fails it instead of hanging CI. No assertion
depends on how fast the machine is: the one thing timed is printed, not checked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time

import pytest
from test_sandbox_adversarial import CASES

from tirl.sandbox import Sandbox, SandboxLimits, Status

LIGHT = ("math",)
# The default timeout, a generous grace (a loaded CI core must not turn an interrupt into a
# kill) and the adversarial suite's process and memory limits.
LOAD_LIMITS = SandboxLimits(
    timeout_s=5.0, grace_s=2.0, memory_mb=512, capture_chars=2000, max_processes=16
)
HOSTILE = [
    "fork_bomb",
    "shell_fork_bomb",
    "thread_bomb",
    "memory_bomb_one_block",
    "memory_bomb_growing",
    "infinite_loop",
    "sleep_forever",
    "loop_ignoring_sigint",
    "loop_catching_every_interrupt",
    "huge_stdout",
    "huge_fd_output",
    "deep_recursion_past_the_c_stack",
    "orphaned_children",
    "os_exit",
    "segfault_via_ctypes",
    "fill_the_private_disk",
    "kill_everything",
    "close_own_stdout",
]
BY_NAME = {c.name: c for c in CASES}
HOSTILE_TIMEOUT_S = 2.0  # hostile cells get a shorter timeout, to keep the test short
BOUND_S = 600.0  # the whole test fails (rather than hangs) past this


def _used_mb() -> float:
    info = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024


def _uid_range_processes(uid_range: list[int] | None) -> list[int]:
    if not uid_range:
        return []
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            except (OSError, StopIteration, ValueError):
                continue
            if uid_range[0] <= uid < uid_range[1]:
                found.append(int(name))
    return found


@pytest.mark.slow
def test_a_thousand_concurrent_sessions_with_fifty_hostile_ones_all_answer_correctly():
    n, n_hostile = 1000, 50
    every = n // n_hostile  # every 20th caller is hostile

    async def main():
        base_mb = _used_mb()
        peak = {"mb": 0.0}

        async def sample_memory():
            while True:
                peak["mb"] = max(peak["mb"], _used_mb() - base_mb)
                await asyncio.sleep(0.2)

        sampler = asyncio.ensure_future(sample_memory())
        async with Sandbox(LOAD_LIMITS, preload=LIGHT, pool_size=8) as sb:
            handed_out = 0
            all_open = asyncio.Event()
            durations: list[float] = []

            def opened() -> None:
                nonlocal handed_out
                handed_out += 1
                if handed_out == n:
                    all_open.set()

            async def honest(k: int) -> tuple[str, str, Status, Status]:
                async with await sb.session() as s:
                    opened()
                    first = await s.run(f"x = {k} * {k}")
                    await all_open.wait()  # every session is open at this point
                    second = await s.run("print(x + 1)")
                    durations.extend((first.duration_s, second.duration_s))
                    return second.stdout, f"{k * k + 1}\n", first.status, second.status

            async def hostile(i: int) -> tuple[str, Status, bool]:
                case = BY_NAME[HOSTILE[i % len(HOSTILE)]]
                async with await sb.session() as s:
                    opened()
                    r = await s.run(case.code, timeout_s=HOSTILE_TIMEOUT_S)
                    return case.name, r.status, r.status in case.statuses

            t0 = time.monotonic()
            calls = [hostile(i // every) if i % every == every - 1 else honest(i) for i in range(n)]
            results = await asyncio.wait_for(asyncio.gather(*calls), BOUND_S)
            wall = time.monotonic() - t0
            stats = await sb.stats()
            uid_range = sb.isolation.get("uid_range")
            zygote = sb.zygote_pid
        sampler.cancel()
        return results, durations, wall, peak["mb"], stats, uid_range, zygote

    results, durations, wall, peak_mb, stats, uid_range, zygote = asyncio.run(main())
    honest = [r for r in results if len(r) == 4]
    hostile = [r for r in results if len(r) == 3]
    assert len(honest) == n - n_hostile and len(hostile) == n_hostile
    assert [got for got, *_ in honest] == [want for _, want, *_ in honest]
    assert all(a is Status.OK and b is Status.OK for *_, a, b in honest)  # no honest timeout
    assert [(name, status) for name, status, fine in hostile if not fine] == []
    assert stats["sessions_starting_peak"] <= stats["max_starting"]
    assert not os.path.exists(f"/proc/{zygote}")
    assert _uid_range_processes(uid_range) == []
    q = statistics.quantiles(durations, n=100)
    print(
        f"\n{n} concurrent session() calls, {n_hostile} hostile, all {n} open at once:"
        f" wall {wall:.1f} s, {len(durations) / wall:.0f} honest cells/s,"
        f" cell p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms,"
        f" max {max(durations) * 1000:.0f} ms (timeout {LOAD_LIMITS.timeout_s:g} s),"
        f" peak memory +{peak_mb:.0f} MB"
    )


def test_bursts_on_a_full_control_socket_lose_no_fork_and_no_interrupt():
    # max_starting far above the zygote's queue (10 records), so the callers' requests and the
    # interrupts of the timing-out cells pile up on the control socket at once.
    n_loops, n_new = 40, 200

    async def main():
        limits = SandboxLimits(timeout_s=5.0, grace_s=10.0, memory_mb=256)
        async with Sandbox(limits, preload=LIGHT, max_starting=n_new) as sb:
            loops = await asyncio.gather(*(sb.session() for _ in range(n_loops)))
            await asyncio.gather(*(s.run(f"k = {i}") for i, s in enumerate(loops)))
            spin = "import time\nwhile True:\n    time.sleep(0.001)"
            timed_out = asyncio.gather(*(s.run(spin, timeout_s=0.5) for s in loops))
            new = await asyncio.gather(*(sb.run_once(f"{i} + 1") for i in range(n_new)))
            interrupted = await timed_out
            kept = await asyncio.gather(*(s.run("k") for s in loops))
            return new, interrupted, kept, [s.alive for s in loops], await sb.stats()

    new, interrupted, kept, alive, stats = asyncio.run(asyncio.wait_for(main(), BOUND_S))
    assert [r.stdout for r in new] == [f"{i + 1}\n" for i in range(n_new)]
    assert [r.status for r in interrupted] == [Status.TIMEOUT] * n_loops
    assert all(alive)  # each got its interrupt in time, none needed the kill
    assert [r.stdout for r in kept] == [f"{i}\n" for i in range(n_loops)]
    assert stats["sessions_starting_peak"] > 10  # the burst really outran the zygote's queue


def test_no_more_than_max_starting_sessions_start_at_once():
    async def main():
        async with Sandbox(SandboxLimits(), preload=LIGHT, max_starting=3) as sb:
            results = await asyncio.gather(*(sb.run_once(f"{i} * 3") for i in range(60)))
            return results, await sb.stats()

    results, stats = asyncio.run(asyncio.wait_for(main(), BOUND_S))
    assert [r.stdout for r in results] == [f"{i * 3}\n" for i in range(60)]
    assert stats["max_starting"] == 3
    assert stats["sessions_starting_peak"] == 3  # reached, never passed
    assert stats["sessions_starting"] == 0


def test_max_starting_must_be_a_positive_int():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_starting"):
            Sandbox(max_starting=bad)


def test_timeout_clock_starts_when_the_session_reads_the_cell():
    # A session that cannot run (stopped here, starved on a loaded machine) for longer than the
    # timeout before it reads the cell: the cell itself is quick, so it must not time out.
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=0.5), preload=LIGHT) as sb:
            s = await sb.session()
            os.kill(s.pid, signal.SIGSTOP)
            run = asyncio.ensure_future(s.run("print(6 * 7)"))
            await asyncio.sleep(1.5)  # three timeouts long
            assert not run.done()
            os.kill(s.pid, signal.SIGCONT)
            r = await run
            alive = s.alive
            await s.close()
            return r, alive

    r, alive = asyncio.run(asyncio.wait_for(main(), BOUND_S))
    assert (r.status, r.stdout, alive) == (Status.OK, "42\n", True)


def test_grace_period_starts_when_the_interrupt_is_delivered():
    # The zygote, which delivers interrupts, is stopped for longer than the grace period when a
    # cell times out: the session must still get its interrupt and survive.
    async def main():
        limits = SandboxLimits(timeout_s=0.5, grace_s=1.0)
        async with Sandbox(limits, preload=LIGHT) as sb:
            s = await sb.session()
            await s.run("kept = 'yes'")
            os.kill(sb.zygote_pid, signal.SIGSTOP)
            try:
                run = asyncio.ensure_future(s.run("import time\nwhile True:\n    time.sleep(0.01)"))
                await asyncio.sleep(0.5 + 2.5)  # past the timeout plus twice the grace
                assert not run.done()
            finally:
                os.kill(sb.zygote_pid, signal.SIGCONT)
            r = await run
            after = await s.run("print(kept)")
            return r, after, s.alive

    r, after, alive = asyncio.run(asyncio.wait_for(main(), BOUND_S))
    assert r.status is Status.TIMEOUT and "KeyboardInterrupt" in r.traceback
    assert alive and after.stdout == "yes\n"
