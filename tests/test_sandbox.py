"""Tests of tirl.sandbox with real processes (no mocks).

Each test runs its own event loop with asyncio.run, so each starts its own zygote (~0.1 s).
Cell timeouts in these tests are short where a timeout is what happens; the grace after an
interrupt and every wait for a process to go are generous, because a busy CI core may take that
long, and waits poll for the event instead of sleeping a fixed time. No assertion depends on
wall-clock speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from sandbox_contract import CONTRACT_CHECKS, CONTRACT_LIMITS

from tirl.sandbox import (
    FORMATTER_VERSION,
    ExecResult,
    Sandbox,
    SandboxLimits,
    Status,
    format_result,
)
from tirl.sandbox.formatter import truncate_middle, truncation_marker

# grace 2 s: an interrupted cell on a loaded machine must have time to answer (it costs time
# only in the tests where the cell ignores the interrupt)
FAST = SandboxLimits(timeout_s=2.0, grace_s=2.0, memory_mb=512, capture_chars=1000)
WAIT_S = 30.0  # for a process to go: generous, and only a stuck machine takes it
LIGHT = ("math",)  # tests need no sympy in the zygote; it would add ~0.7 s per test


def light_sandbox(limits: SandboxLimits = FAST, **kwargs) -> Sandbox:
    return Sandbox(limits, preload=LIGHT, **kwargs)


def run(coro):
    return asyncio.run(coro)


def _exists(pid: int) -> bool:
    """True while /proc has the pid, zombies included (an unreaped child is a leak too)."""
    return os.path.exists(f"/proc/{pid}")


def _running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _wait_until(condition, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def _await_until(condition, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found


# ---------------------------------------------------------------------------------------------
# Cell semantics


def test_state_persists_across_cells():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            assert (await s.run("import math\nx = 41\ndef f(v):\n    return v + 1")).ok
            r = await s.run("print(f(x), math.isqrt(17))")
            assert r.status is Status.OK
            assert r.stdout == "42 4\n"

    run(main())


def test_last_expression_is_echoed_unless_none():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            assert (await s.run("x = 6\nx * 7")).stdout == "42\n"
            assert (await s.run("'a' + 'b'")).stdout == "'ab'\n"
            assert (await s.run("print('p')\nNone")).stdout == "p\n"
            assert (await s.run("y = 1")).stdout == ""
            assert (await s.run("[1, 2][0]; x")).stdout == "6\n"

    run(main())


def test_exception_gives_error_with_user_frames_only():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            await s.run("pass")
            r = await s.run("def f(a):\n    return a / 0\n\nprint('before')\nf(1)")
            assert r.status is Status.ERROR
            assert r.stdout == "before\n"
            tb = r.traceback
            assert tb.startswith("Traceback (most recent call last):")
            assert 'File "<cell 2>", line 5, in <module>' in tb
            assert 'File "<cell 2>", line 2, in f' in tb
            assert "return a / 0" in tb
            assert tb.rstrip().endswith("ZeroDivisionError: division by zero")
            assert "_zygote" not in tb and "tirl" not in tb

            r = await s.run("x = (1,\n")
            assert r.status is Status.ERROR
            assert '"<cell 3>"' in r.traceback and "SyntaxError" in r.traceback
            assert (await s.run("1 + 1")).stdout == "2\n"  # the session is fine afterwards

    run(main())


def test_sys_exit_in_a_cell_does_not_end_the_session():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            await s.run("k = 3")
            r = await s.run("import sys\nsys.exit(k)")
            assert r.status is Status.ERROR
            assert r.traceback.rstrip().endswith("SystemExit: 3")
            assert (await s.run("exit()")).status is Status.ERROR
            assert (await s.run("k")).stdout == "3\n"
            assert s.alive

    run(main())


def test_huge_output_is_truncated_head_and_tail_with_flags():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            r = await s.run("for i in range(100000):\n    print(i)")
            assert r.status is Status.OK and r.stdout_truncated and not r.stderr_truncated
            assert r.stdout.startswith("0\n1\n2\n")
            assert r.stdout.endswith("99998\n99999\n")
            total = sum(len(f"{i}\n") for i in range(100000))
            assert truncation_marker(total - 1000) in r.stdout
            assert len(r.stdout) == 1000 + len(truncation_marker(total - 1000))

            # 100 MB in one write, plus stderr and fd-level (C / subprocess) output
            r = await s.run(
                "import sys, os\nsys.stdout.write('x' * 100_000_000)\n"
                "sys.stderr.write('e' * 5000)\nos.write(1, b'from-fd')"
            )
            assert r.status is Status.OK and r.stdout_truncated and r.stderr_truncated
            assert r.stdout.endswith("from-fd") and r.stdout.startswith("x" * 500)
            assert len(r.stderr) < 1100
            assert r.peak_memory_mb is not None and r.peak_memory_mb > 0

            r = await s.run("print('small')")
            assert r.stdout == "small\n" and not r.stdout_truncated

    run(main())


def test_run_once_is_stateless():
    async def main():
        async with light_sandbox() as sb:
            assert (await sb.run_once("x = 1\nx")).stdout == "1\n"
            r = await sb.run_once("x")
            assert r.status is Status.ERROR
            assert "NameError: name 'x' is not defined" in r.traceback

    run(main())


def test_pool_serves_sessions_and_run_once():
    async def main():
        async with light_sandbox(pool_size=2) as sb:
            results = await asyncio.gather(*(sb.run_once(f"{i} * 2") for i in range(5)))
            assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(5)]

    run(main())


def test_twenty_concurrent_sessions_are_independent():
    async def main():
        async with light_sandbox() as sb:
            sessions = await asyncio.gather(*(sb.session() for _ in range(20)))
            assert len({s.pid for s in sessions}) == 20
            await asyncio.gather(*(s.run(f"x = {i}") for i, s in enumerate(sessions)))
            code = "import time\ntime.sleep(0.05)\nx * x"
            results = await asyncio.gather(*(s.run(code) for s in sessions))
            assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(20)]
            await asyncio.gather(*(s.close() for s in sessions))

    run(main())


def test_session_creation_smoke():
    async def main():
        async with light_sandbox() as sb:
            t0 = time.perf_counter()
            sessions = [await sb.session() for _ in range(5)]
            per_session_ms = (time.perf_counter() - t0) * 1000 / 5
            assert per_session_ms > 0  # reported by bench/sandbox.py; no threshold here
            assert len({s.id for s in sessions}) == 5 and all(s.alive for s in sessions)
            for s in sessions:
                await s.close()
                assert not s.alive and not _exists(s.pid)

    run(main())


# ---------------------------------------------------------------------------------------------
# Limits and failures


def test_timeout_interrupts_the_cell_and_the_session_survives():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            await s.run("x = 5")
            r = await s.run("print('started', flush=True)\nwhile True:\n    x += 0", timeout_s=0.3)
            assert r.status is Status.TIMEOUT and r.timeout_s == 0.3
            assert r.stdout == "started\n"
            assert "KeyboardInterrupt" in r.traceback
            assert s.alive
            assert (await s.run("x")).stdout == "5\n"

    run(main())


def test_cell_ignoring_the_interrupt_is_killed_and_later_runs_say_killed():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            code = (
                "import time\n"
                "while True:\n"
                "    try:\n"
                "        time.sleep(10)\n"
                "    except BaseException:\n"
                "        pass"
            )
            r = await s.run(code, timeout_s=0.3)
            assert r.status is Status.TIMEOUT
            assert not s.alive
            r = await asyncio.wait_for(s.run("1"), 5.0)  # never hangs
            assert r.status is Status.KILLED and "variables are lost" in r.detail
            assert await _await_until(lambda: not _exists(s.pid))

    run(main())


def test_an_interrupt_landing_where_python_swallows_exceptions_still_ends_the_cell():
    # Python ignores exceptions raised in __del__ methods and os.register_at_fork hooks (a fork
    # bomb spends most of its time in the latter). This cell spends nearly all of its time in
    # a __del__, so that is where the timeout's KeyboardInterrupt lands.
    slow_finalizer = (
        "import time\n"
        "class Slow:\n"
        "    def __del__(self):\n"
        "        t = time.monotonic()\n"
        "        while time.monotonic() - t < 0.05:\n"
        "            pass\n"
        "while True:\n"
        "    Slow()"
    )

    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            await s.run("kept = 1")
            r = await s.run(slow_finalizer, timeout_s=0.5)
            assert r.status is Status.TIMEOUT and "KeyboardInterrupt" in r.traceback
            assert s.alive  # the interrupt ended the cell; no kill was needed
            assert (await s.run("kept")).stdout == "1\n"

    run(main())


def test_memory_bomb_gives_memory_status_and_session_survives():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            r = await s.run("x = bytearray(600 * 2**20)")
            assert r.status is Status.MEMORY
            assert "MemoryError" in r.traceback
            r = await s.run("chunks = []\nwhile True:\n    chunks.append(bytearray(2**20))")
            assert r.status is Status.MEMORY
            assert format_result(r).startswith("MemoryError: ")
            assert (await s.run("del chunks\n1 + 1")).stdout == "2\n"

    run(main())


def test_process_death_gives_killed():
    async def main():
        async with light_sandbox() as sb:
            async with await sb.session() as s:
                r = await s.run("import os\nos._exit(3)")
                assert r.status is Status.KILLED and r.detail == "exit code 3"
                assert (await s.run("1")).status is Status.KILLED
            async with await sb.session() as s:
                r = await s.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
                assert r.status is Status.KILLED and "SIGSEGV" in r.detail

    run(main())


def test_cpu_limit_ends_the_session_with_timeout_and_is_per_session():
    async def main():
        limits = SandboxLimits(timeout_s=60.0, cpu_s=1)
        async with light_sandbox(limits) as sb:
            s, bystander = await sb.session(), await sb.session()
            burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
            assert (await bystander.run(burn)).ok  # 0.6 s of its own second
            r = await s.run("while True: pass")
            assert r.status is Status.TIMEOUT and "CPU time limit" in r.detail
            assert not s.alive
            # the other session's allowance is its own: it still has 0.4 s
            r = await bystander.run(
                "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n7"
            )
            assert (r.status, r.stdout) == (Status.OK, "7\n") and bystander.alive
            await bystander.close()

    run(main())


# ---------------------------------------------------------------------------------------------
# Processes a cell leaves behind (SandboxLimits.kill_background)

BACKGROUND = (
    "import subprocess\n"
    "plain = subprocess.Popen(['sleep', '1000'])\n"
    "escaped = subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
    "double = subprocess.run(['sh', '-c', 'sleep 1000 > /dev/null 2>&1 & echo $!'],\n"
    "                        capture_output=True, text=True).stdout.strip()\n"
    "busy = subprocess.Popen(['sh', '-c', 'while :; do :; done'])\n"
    "print(plain.pid, escaped.pid, double, busy.pid)"
)


def test_background_processes_are_gone_when_their_cell_returns_and_others_are_untouched():
    async def main():
        async with light_sandbox() as sb:
            s, bystander = await sb.session(), await sb.session()
            # The bystander is mid-cell, waiting on a subprocess of its own.
            waiting = asyncio.ensure_future(
                bystander.run(
                    "import subprocess\np = subprocess.Popen(['sleep', '1000'])\nprint(p.wait())",
                    timeout_s=120,
                )
            )
            assert await _await_until(lambda: _children_of(bystander.pid))
            [theirs] = _children_of(bystander.pid)

            r = await s.run(BACKGROUND)
            assert r.status is Status.OK
            left = [int(p) for p in r.stdout.split()]
            assert len(left) == 4
            # gone (not even a zombie) by the time the cell's result is back
            assert [p for p in left if _exists(p)] == []
            assert s.alive and (await s.run("plain.poll() is not None")).stdout == "True\n"

            assert _running(theirs) and not waiting.done()
            os.kill(theirs, signal.SIGTERM)  # ends the bystander's cell, as it would end itself
            r = await waiting
            assert (r.status, r.stdout) == (Status.OK, "-15\n")
            for x in (s, bystander):
                await x.close()

    run(main())


def test_os_fork_children_and_interrupted_cells_leave_nothing_running():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            r = await s.run(
                "import os, time\nchild = os.fork()\n"
                "if child == 0:\n    while True:\n        time.sleep(1)\nprint(child)"
            )
            assert r.ok and not _exists(int(r.stdout))
            r = await s.run(
                "import subprocess, signal, time\n"
                "p = subprocess.Popen(['sh', '-c', 'trap \"\" INT; sleep 1000'])\n"
                "print(p.pid, flush=True)\nwhile True:\n    time.sleep(0.01)",
                timeout_s=0.5,
            )
            assert r.status is Status.TIMEOUT and s.alive
            assert not _exists(int(r.stdout))  # it ignored the interrupt; the cell ended anyway

    run(main())


def test_without_kill_background_a_background_process_lives_until_the_session_closes():
    async def main():
        limits = SandboxLimits(timeout_s=10.0, grace_s=2.0, kill_background=False)
        async with light_sandbox(limits) as sb:
            s = await sb.session()
            r = await s.run("import subprocess\np = subprocess.Popen(['sleep', '1000'])\np.pid")
            pid = int(r.stdout)
            assert (await s.run("1 + 1")).ok
            assert _running(pid) and (await s.run("p.poll()")).stdout == ""
            await s.close()
            assert await _await_until(lambda: not _running(pid))

    run(main())


def test_kill_background_must_be_a_bool():
    with pytest.raises(ValueError, match="kill_background"):
        SandboxLimits(kill_background=1)


def test_cancelled_run_kills_the_session():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(s.run("import time\ntime.sleep(10)"), 0.2)
            assert not s.alive
            assert (await s.run("1")).status is Status.KILLED

    run(main())


# ---------------------------------------------------------------------------------------------
# Isolation and cleanup


def test_sandboxed_code_cannot_reach_a_loopback_listener():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]

    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            if not s.net_isolated:
                pytest.skip("no network namespace here (needs root or user namespaces)")
            code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
            return await s.run(code)

    try:
        r = run(main())
        assert r.status is Status.ERROR
        assert "OSError" in r.traceback or "Error" in r.traceback.splitlines()[-1]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()


def test_sandboxed_code_sees_only_a_loopback_interface():
    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            if not s.net_isolated:
                pytest.skip("no network namespace here (needs root or user namespaces)")
            # /proc/self/net/dev lists the interfaces of the reader's network namespace (the
            # socket-based if_nameindex() is refused by the seccomp filter)
            code = "print([l.split(':')[0].strip() for l in open('/proc/self/net/dev')][2:])"
            return await s.run(code)

    r = run(main())
    assert r.status is Status.OK and r.stdout == "['lo']\n"


def test_caller_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("TIRL_SANDBOX_SECRET", "hunter2")

    async def main():
        async with light_sandbox() as sb, await sb.session() as s:
            r = await s.run(
                "import os\nprint(sorted(os.environ))\n"
                "print(b'hunter2' in open('/proc/self/environ', 'rb').read())"
            )
            assert r.stdout == "['HOME', 'LANG', 'PATH', 'TMPDIR']\nFalse\n"

    run(main())


def test_session_files_live_in_a_private_tmp_the_host_never_sees():
    async def main():
        async with light_sandbox() as sb:
            a, b = await sb.session(), await sb.session()
            if not a.isolation.get("mount"):
                pytest.skip("no mount namespace here (needs root or user namespaces)")
            cwd_a = (await a.run("import os\nos.getcwd()")).stdout.strip().strip("'")
            cwd_b = (await b.run("import os\nos.getcwd()")).stdout.strip().strip("'")
            assert cwd_a != cwd_b and cwd_a.startswith("/tmp/")
            assert (await a.run("open('f.txt', 'w').write('hi')")).ok
            assert (await a.run(f"open('/tmp/outside-{os.getpid()}', 'w')")).ok
            seen_by_b = await b.run(f"import os\nos.path.exists('{cwd_a}/f.txt')")
            assert seen_by_b.stdout == "False\n"
            assert not os.path.exists(f"{cwd_a}/f.txt")
            assert not os.path.exists(f"/tmp/outside-{os.getpid()}")
            await a.close()
            await b.close()

    run(main())


def test_without_isolation_the_cwd_is_a_host_directory_removed_on_close():
    async def main():
        async with light_sandbox(isolate=False) as sb:
            a, b = await sb.session(), await sb.session()
            assert a.isolation["mount"] is False
            cwd_a = (await a.run("import os\nos.getcwd()")).stdout.strip().strip("'")
            cwd_b = (await b.run("import os\nos.getcwd()")).stdout.strip().strip("'")
            assert cwd_a != cwd_b and os.path.isdir(cwd_a)
            await a.run("open('f.txt', 'w').write('hi')")
            await a.close()
            assert not os.path.exists(cwd_a) and os.path.isdir(cwd_b)
            await b.close()

    run(main())


def test_close_leaves_no_process_or_directory_behind():
    before = set(_children_of(os.getpid()))

    async def main():
        sb = light_sandbox()
        await sb.start()
        sessions = [await sb.session() for _ in range(3)]
        # a subprocess in the session's group, and one that escapes into its own session
        r = await sessions[0].run(
            "import subprocess\n"
            "a = subprocess.Popen(['sleep', '60'])\n"
            "b = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
            "print(a.pid, b.pid)"
        )
        grandchildren = [int(p) for p in r.stdout.split()]
        await sessions[1].run("while True: pass", timeout_s=0.1)  # busy at close time
        pids = [sb.zygote_pid, *(s.pid for s in sessions), *grandchildren]
        assert all(_exists(p) for p in pids[:4])
        await sb.close()
        return pids

    pids = run(main())
    assert [p for p in pids if _exists(p)] == []
    assert set(_children_of(os.getpid())) - before == set()


def test_death_of_the_caller_takes_zygote_sessions_and_subprocesses_with_it():
    script = (
        "import asyncio, os\n"
        "from tirl.sandbox import Sandbox\n"
        "async def main():\n"
        "    sb = Sandbox()\n"
        "    await sb.start()\n"
        "    s = await sb.session()\n"
        "    r = await s.run(\"import subprocess\\nsubprocess.Popen(['sleep', '60']).pid\")\n"
        "    print(sb.zygote_pid, s.pid, r.stdout.strip(), sb.workdir, flush=True)\n"
        "    os._exit(0)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    *pids, workdir = out.stdout.split()
    pids = [int(p) for p in pids]
    assert len(pids) == 3, out.stderr
    _wait_until(lambda: not any(map(_running, pids)) and not os.path.exists(workdir))
    assert [p for p in pids if _running(p)] == []
    assert not os.path.exists(workdir)


def test_sessions_die_with_the_zygote():
    async def main():
        async with light_sandbox() as sb:
            s = await sb.session()
            os.kill(sb.zygote_pid, signal.SIGKILL)
            # PR_SET_PDEATHSIG takes effect when the zygote has exited
            assert await _await_until(lambda: not _running(s.pid))
            r = await asyncio.wait_for(s.run("1"), 5.0)
            assert r.status is Status.KILLED
            # the sandbox starts a new zygote on demand
            async with await sb.session() as fresh:
                assert (await fresh.run("2 + 2")).stdout == "4\n"
            assert (await s.run("1")).status is Status.KILLED

    run(main())


# ---------------------------------------------------------------------------------------------
# Result and formatter


def test_exec_result_round_trips_through_dict():
    r = ExecResult(Status.TIMEOUT, stdout="a", duration_s=1.5, timeout_s=1.0, peak_memory_mb=9.5)
    d = r.to_dict()
    assert d["status"] == "timeout"
    assert ExecResult.from_dict(d) == r


def test_formatter_output_for_each_status():
    assert FORMATTER_VERSION == "1"
    assert format_result(ExecResult(Status.OK, stdout="42\n\n")) == "42"
    assert format_result(ExecResult(Status.OK)) == ""
    assert format_result(ExecResult(Status.OK, stdout="x", stderr="warning")) == "x"
    tb = (
        "Traceback (most recent call last):\n"
        '  File "<cell 1>", line 1, in <module>\n'
        "    1/0\n"
        "ZeroDivisionError: division by zero\n"
    )
    assert format_result(ExecResult(Status.ERROR, stdout="hi\n", traceback=tb)) == (
        "hi\n" + tb.rstrip("\n")
    )
    assert format_result(ExecResult(Status.ERROR, traceback="\x1b[31mValueError: x\x1b[0m")) == (
        "ValueError: x"
    )
    assert format_result(ExecResult(Status.TIMEOUT, stdout="1\n", timeout_s=5.0)) == (
        "1\nTimeoutError: execution exceeded 5 s"
    )
    assert format_result(ExecResult(Status.TIMEOUT, timeout_s=2.5)) == (
        "TimeoutError: execution exceeded 2.5 s"
    )
    assert format_result(
        ExecResult(Status.TIMEOUT, detail="the CPU time limit of 3 s was exceeded")
    ) == ("TimeoutError: the CPU time limit of 3 s was exceeded")
    assert format_result(
        ExecResult(Status.MEMORY, detail="the memory limit of 1024 MB was exceeded")
    ) == ("MemoryError: the memory limit of 1024 MB was exceeded")
    assert format_result(ExecResult(Status.KILLED, detail="killed by signal 11 (SIGSEGV)")) == (
        "Error: the interpreter process died (killed by signal 11 (SIGSEGV))"
    )


def test_formatter_shortens_long_tracebacks_keeping_the_exception_line():
    frames = "".join(f'  File "lib.py", line {i}, in g\n    g()\n' for i in range(20))
    tb = (
        "Traceback (most recent call last):\n"
        '  File "<cell 1>", line 1, in <module>\n'
        "    g()\n" + frames + "RecursionError: too deep\n"
    )
    text = format_result(ExecResult(Status.ERROR, traceback=tb))
    lines = text.split("\n")
    assert lines[:3] == tb.split("\n")[:3]
    assert lines[3] == "  …[33 lines omitted]…"
    assert lines[-1] == "RecursionError: too deep" and len(lines) == 12


def test_formatter_truncates_to_exactly_max_chars():
    text = "".join(str(i % 10) for i in range(5000))
    for max_chars in (100, 101, 2000):
        out = format_result(ExecResult(Status.OK, stdout=text), max_chars=max_chars)
        assert len(out) == max_chars
        head, rest = out.split("\n…[", 1)
        n_dropped = int(rest.split(" chars truncated]…\n")[0])
        tail = rest.split(" chars truncated]…\n")[1]
        assert text.startswith(head) and text.endswith(tail)
        assert len(head) + len(tail) + n_dropped == len(text)
    assert truncate_middle("short", 10) == "short"
    # the exception line survives truncation of a long stdout
    r = ExecResult(Status.ERROR, stdout="y" * 10000, traceback="KeyError: 'k'\n")
    assert format_result(r, max_chars=300).endswith("\nKeyError: 'k'")


# ---------------------------------------------------------------------------------------------
# The behaviour every transport shares (tests/sandbox_contract.py)


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__[len("check_") :])
def test_contract(check):
    async def main():
        async with Sandbox(CONTRACT_LIMITS, preload=LIGHT) as sb:
            await check(sb)

    run(main())


# ---------------------------------------------------------------------------------------------
# Without root: user namespaces stand in for it


_UNPRIVILEGED_SCRIPT = """
import asyncio, json
from tirl.sandbox import Sandbox, SandboxLimits

CELLS = {
    "uid": "import os\\nprint(os.getuid())",
    "root_is_readonly": "open('/usr/pwned', 'w')",
    "interfaces": "print([l.split(':')[0].strip() for l in open('/proc/self/net/dev')][2:])",
    "inet_socket": "import socket\\nsocket.socket(socket.AF_INET)",
    "kill_everything": "import os\\nos.kill(-1, 9)",
    "thread_bomb": "import threading, time\\n"
    "while True:\\n    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()",
}

async def main():
    limits = SandboxLimits(timeout_s=3, grace_s=0.3, memory_mb=512, max_processes=8)
    async with Sandbox(limits, preload=("math",)) as sb:
        out = {"zygote": sb.isolation}
        sessions = [await sb.session(), await sb.session()]
        out["session"] = sessions[0].isolation
        for name, code in CELLS.items():
            out[name] = (await sessions[0].run(code)).to_dict()
        # RLIMIT_NPROC is per session: a second session still starts threads
        out["second_thread"] = (await sessions[1].run(CELLS["thread_bomb"].replace("while True", "for _ in range(3)"))).to_dict()
        print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_an_unprivileged_caller_still_gets_namespaces_seccomp_and_process_limits():
    from tirl.sandbox import _isolation as iso

    nobody = 65534
    python_paths = [sys.prefix, sys.base_prefix, *sys.path]

    def become_nobody():  # runs in the child before exec; Python must stay reachable for nobody
        if not iso.unshare(iso.CLONE_NEWNS):
            os._exit(97)
        iso.make_mounts_private()
        iso.expose_paths(python_paths)
        iso.become(nobody, nobody)

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", _UNPRIVILEGED_SCRIPT],
        preexec_fn=become_nobody,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["zygote"]["uid"] == "caller" and out["zygote"]["mount"] is True
    assert out["session"]["net"] is True and out["session"]["seccomp"] is True
    assert out["uid"]["stdout"] == f"{nobody}\n"  # no fake root inside
    assert "Read-only file system" in out["root_is_readonly"]["traceback"]
    assert out["interfaces"]["stdout"] == "['lo']\n"
    assert "PermissionError" in out["inet_socket"]["traceback"]
    assert "PermissionError" in out["kill_everything"]["traceback"]
    assert "can't start new thread" in out["thread_bomb"]["traceback"]
    assert out["second_thread"]["status"] == "ok"


def test_the_zygote_imports_little():
    """Every session inherits what the zygote imported: it takes the standard library and the
    few sandbox modules it runs, never asyncio or the rest of tirl (`tirl.sandbox` imports
    `Sandbox` on first use)."""
    code = (
        "import json, sys\nimport tirl.sandbox._zygote\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('tirl', 'asyncio')))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    allowed = {"_cells", "_isolation", "_session_process", "_wire", "_zygote", "api"}
    allowed |= {"formatter", "limits", "result"}
    imported = set(json.loads(done.stdout)) - {"tirl", "tirl.sandbox"}
    assert imported <= {f"tirl.sandbox.{name}" for name in allowed}, imported
