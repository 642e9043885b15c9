"""Behaviour every sandbox transport must show, written once and run against each of them.

Each check is `async def check_...(client)` and receives a started `SandboxClient` whose
sessions use `CONTRACT_LIMITS` (timeout 2 s, grace 2 s, 512 MB, 1,000 output chars). The
local, HTTP and Ray transports each run every check in `CONTRACT_CHECKS`
(tests/test_sandbox.py, tests/test_sandbox_http.py, tests/test_sandbox_ray.py).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from tirl.sandbox import SandboxLimits, Status
from tirl.sandbox.api import RestoreError, SandboxError

# grace 2 s: it costs time only where a cell ignores the interrupt, and a loaded CI core may need
# it for an interrupted cell to answer
CONTRACT_LIMITS = SandboxLimits(timeout_s=2.0, grace_s=2.0, memory_mb=512, capture_chars=1000)
# For tests that need a process a cell started to outlive the cell (to see close() end it).
CONTRACT_LIMITS_KEEP_BACKGROUND = replace(CONTRACT_LIMITS, kill_background=False)


async def check_state_persists_across_cells(client):
    async with await client.session() as s:
        assert (await s.run("import math\nx = 41\ndef f(v):\n    return v + 1")).ok
        r = await s.run("print(f(x), math.isqrt(17))")
        assert (r.status, r.stdout) == (Status.OK, "42 4\n")
        assert (await s.run("x * 2")).stdout == "82\n"  # the last expression is echoed


async def check_run_once_is_stateless(client):
    assert (await client.run_once("leak = 1")).ok
    r = await client.run_once("print(leak)")
    assert r.status is Status.ERROR
    assert "NameError" in r.traceback


async def check_error_has_user_frames_only(client):
    async with await client.session() as s:
        r = await s.run("def g():\n    return 1 / 0\ng()")
        assert r.status is Status.ERROR
        assert r.traceback.rstrip().endswith("ZeroDivisionError: division by zero")
        assert '"<cell 1>", line 2' in r.traceback
        assert "tirl" not in r.traceback and "_zygote" not in r.traceback
        assert (await s.run("1 + 1")).stdout == "2\n"  # the session goes on


async def check_timeout_interrupts_and_state_survives(client):
    async with await client.session() as s:
        await s.run("kept = 'yes'")
        r = await s.run("import time\nwhile True:\n    time.sleep(0.01)", timeout_s=0.5)
        assert r.status is Status.TIMEOUT
        assert r.timeout_s == 0.5
        assert (await s.run("print(kept)")).stdout == "yes\n"


async def check_ignored_interrupt_kills_then_restore_replays(client):
    async with await client.session() as s:
        await s.run("import random\nbase = 40")
        await s.run("base += 2")
        await s.run("undefined_name")  # an error: not replayed
        stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
        r = await s.run(stubborn, timeout_s=0.5)
        assert r.status is Status.TIMEOUT
        assert not s.alive
        later = await s.run("print(base)")
        assert later.status is Status.KILLED
        assert "killed" in later.detail
        assert await s.restore() == 2
        assert s.alive
        assert (await s.run("print(base)")).stdout == "42\n"


async def check_restore_reports_a_cell_that_fails_on_replay(client):
    async with await client.session() as s:
        await s.run("n = 1")
        await s.run("import os\nos._exit(3)")
        s.history.append("raise ValueError('not twice')")  # as if it had succeeded once
        with pytest.raises(RestoreError, match="replayed cell 2 of 2 returned error"):
            await s.restore()
        assert s.alive and s.history == ["n = 1"]
        assert (await s.run("print(n)")).stdout == "1\n"


async def check_fork_copies_state_and_then_diverges(client):
    async with await client.session() as parent:
        await parent.run("xs = [1, 2]\nopen('notes.txt', 'w').write('prefix')")
        child = await parent.fork()
        try:
            assert child.id != parent.id
            assert child.history == parent.history
            await child.run("xs.append(3)\nopen('notes.txt', 'a').write('+child')")
            await parent.run("xs.append(99)")
            assert (await child.run("print(xs, open('notes.txt').read())")).stdout == (
                "[1, 2, 3] prefix+child\n"
            )
            assert (await parent.run("print(xs, open('notes.txt').read())")).stdout == (
                "[1, 2, 99] prefix\n"
            )
            grandchild = await child.fork()
            async with grandchild:
                await child.close()
                assert (await grandchild.run("len(xs)")).stdout == "3\n"
        finally:
            await child.close()


async def check_fork_of_a_dead_session_is_an_error(client):
    s = await client.session()
    await s.close()
    with pytest.raises(SandboxError, match="not alive"):
        await s.fork()


async def check_huge_output_is_truncated(client):
    async with await client.session() as s:
        r = await s.run("print('a' * 5000 + 'END')")
        assert r.status is Status.OK and r.stdout_truncated
        assert len(r.stdout) <= 1000 + 60
        assert r.stdout.startswith("aaa") and r.stdout.rstrip().endswith("END")
        assert "chars truncated" in r.stdout


async def check_process_death_gives_killed(client):
    async with await client.session() as s:
        r = await s.run("import os\nos._exit(7)")
        assert r.status is Status.KILLED
        assert "exit code 7" in r.detail
        assert (await s.run("1")).status is Status.KILLED


async def check_closed_session_returns_killed(client):
    s = await client.session()
    await s.close()
    assert not s.alive
    r = await s.run("1 + 1")
    assert r.status is Status.KILLED
    await s.close()  # idempotent


async def check_concurrent_sessions_are_independent(client):
    async def one(i: int):
        async with await client.session() as s:
            await s.run(f"v = {i}")
            await asyncio.sleep(0.01)
            return (await s.run("print(v * v)")).stdout

    got = await asyncio.gather(*(one(i) for i in range(12)))
    assert got == [f"{i * i}\n" for i in range(12)]


async def check_cannot_reach_a_loopback_listener(client):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', type(e).__name__)"
        )
        r = await client.run_once(code)
        assert r.status is Status.OK
        assert r.stdout.startswith("refused")
    finally:
        listener.close()


CONTRACT_CHECKS = [
    check_state_persists_across_cells,
    check_run_once_is_stateless,
    check_error_has_user_frames_only,
    check_timeout_interrupts_and_state_survives,
    check_ignored_interrupt_kills_then_restore_replays,
    check_restore_reports_a_cell_that_fails_on_replay,
    check_fork_copies_state_and_then_diverges,
    check_fork_of_a_dead_session_is_an_error,
    check_huge_output_is_truncated,
    check_process_death_gives_killed,
    check_closed_session_returns_killed,
    check_concurrent_sessions_are_independent,
    check_cannot_reach_a_loopback_listener,
]
