"""Hostile programs against the in-process sandbox: each must be contained and reported.

Every case is a cell a model could write, the statuses it may end with, and a check of what it
reports. `test_each_program_is_contained` runs each one alone and then checks that the sandbox
still serves a fresh session; `test_all_programs_at_once_beside_innocent_sessions` runs all of
them concurrently next to sessions doing honest arithmetic, whose answers must stay right, and
then checks that closing the sandbox leaves no process behind; it runs twice, the second time
beside busy-loop processes that keep every core busy (at most 4), as a shared CI machine would.
tests/test_sandbox_load.py runs 50 of these programs among 1,000 concurrent sessions.

Network rule of this project: nothing here connects to an address outside loopback, not even
to watch it fail. Isolation from the outside is shown by the missing interfaces and routes and
by the refused socket, never by trying.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

import tirl
from tirl.sandbox import ExecResult, Sandbox, SandboxLimits, Status

# grace 2 s: with fork bombs and busy neighbours beside them, interrupted cells need a moment
# to answer (the grace counts from the interrupt's delivery, so a busy zygote does not eat it)
LIMITS = SandboxLimits(
    timeout_s=2.0, grace_s=2.0, memory_mb=512, capture_chars=2000, max_processes=16
)
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(tirl.__file__)))


@dataclass
class Case:
    name: str
    code: str
    statuses: set[Status]
    check: Callable[[ExecResult], bool] = lambda r: True
    session_survives: bool | None = None  # None: either is acceptable
    needs: str = ""  # an isolation feature the case relies on ("mount", "family uid")
    setup: Callable[[], dict] = field(default=lambda: {})


def printed(text: str) -> Callable[[ExecResult], bool]:
    return lambda r: text in r.stdout


def raised(name: str) -> Callable[[ExecResult], bool]:
    return lambda r: r.traceback is not None and name in r.traceback


OK, ERROR, TIMEOUT, MEMORY, KILLED = (
    Status.OK,
    Status.ERROR,
    Status.TIMEOUT,
    Status.MEMORY,
    Status.KILLED,
)
IGNORE_SIGINT = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
HOST_MARKER = f"/tmp/tirl-adversarial-{os.getpid()}"
ABSTRACT_NAME = f"tirl-adversarial-{os.getpid()}"

CASES = [
    Case(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        {TIMEOUT, KILLED},
    ),
    Case("shell_fork_bomb", "import os\nos.system(':(){ :|:& };:')", {TIMEOUT, KILLED, OK}),
    Case(
        "thread_bomb",
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
        {ERROR},
        raised("can't start new thread"),
        session_survives=True,
    ),
    Case("memory_bomb_one_block", "x = bytearray(4 << 30)", {MEMORY}, session_survives=True),
    Case(
        "memory_bomb_growing",
        "xs = []\nwhile True:\n    xs.append(bytearray(10 << 20))",
        {MEMORY, TIMEOUT},
        session_survives=True,
    ),  # TIMEOUT: on 2 busy cores, 2 s may not do
    Case("infinite_loop", "while True:\n    pass", {TIMEOUT}, session_survives=True),
    Case("sleep_forever", "import time\ntime.sleep(10**6)", {TIMEOUT}, session_survives=True),
    Case(
        "loop_ignoring_sigint",
        IGNORE_SIGINT + "while True:\n    pass",
        {TIMEOUT},
        session_survives=False,
    ),
    Case(
        "loop_catching_every_interrupt",
        IGNORE_SIGINT
        + "while True:\n    try:\n        pass\n    except BaseException:\n        pass",
        {TIMEOUT},
        session_survives=False,
    ),
    Case(
        "connect_to_host_loopback_listener",
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', PORT), timeout=1)\n    print('connected')\n"
        "except OSError as e:\n    print('refused', e)",
        {OK},
        printed("refused"),
    ),
    Case(
        "inet_socket_refused",
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        {ERROR},
        raised("PermissionError"),
    ),
    Case(
        "only_loopback_interface_and_no_routes",
        "print([l.split(':')[0].strip() for l in open('/proc/self/net/dev')][2:])\n"
        "print(len(open('/proc/self/net/route').read().splitlines()[1:]), 'routes')",
        {OK},
        printed("['lo']\n0 routes"),
    ),
    Case(
        "abstract_unix_socket_of_the_host",
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{ABSTRACT_NAME}')\n"
        "    print('connected')\nexcept OSError as e:\n    print('refused', e)",
        {OK},
        printed("refused"),
    ),
    Case("write_to_root", "open('/owned', 'w')", {ERROR}, raised("Error"), needs="mount"),
    Case(
        "write_to_host_tmp",
        f"open('{HOST_MARKER}', 'w').write('x')\nprint('wrote privately')",
        {OK},
        printed("wrote privately"),
        needs="mount",
    ),
    Case(
        "write_into_the_project",
        f"open('{PROJECT_DIR}/pwned.py', 'w')",
        {ERROR},
        raised("Error"),
        needs="mount",
    ),
    Case(
        "fill_the_private_disk",
        "with open('big', 'wb') as f:\n    for _ in range(200):\n        f.write(b'x' * (1 << 20))",
        {ERROR},
        lambda r: "No space" in r.traceback or "File too large" in r.traceback,
    ),
    Case(
        "read_the_parents_environment",
        "import os\nprint(sorted(os.environ))\ntry:\n    open(f'/proc/{os.getppid()}/environ').read()\n"
        "    print('read it')\nexcept OSError as e:\n    print('denied', type(e).__name__)",
        {OK},
        printed("['HOME', 'LANG', 'PATH', 'TMPDIR']\ndenied"),
        needs="family uid",
    ),
    Case(
        "write_kernel_settings",
        "open('/proc/sys/kernel/hostname', 'w').write('pwned')",
        {ERROR},
        raised("PermissionError"),
        needs="family uid",
    ),
    Case(
        "read_etc_shadow",
        "open('/etc/shadow').read()",
        {ERROR},
        raised("PermissionError"),
        needs="family uid",
    ),
    Case(
        "kill_the_parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        {ERROR},
        raised("PermissionError"),
        needs="family uid",
    ),
    Case(
        "kill_everything",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
        {ERROR},
        raised("PermissionError"),
    ),
    Case(
        "become_root",
        "import os\nos.setuid(0)",
        {ERROR},
        raised("PermissionError"),
        needs="family uid",
    ),
    Case(
        "raise_own_rlimits",
        "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6))",
        {ERROR},
        lambda r: "ValueError" in r.traceback or "PermissionError" in r.traceback,
    ),
    Case(
        "mount_and_unshare_via_ctypes",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000 | 0x40000000), ctypes.get_errno())\n"
        "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())",
        {OK},
        printed("-1 1\n-1 1"),
    ),
    Case(
        "ptrace_the_parent",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(16, os.getppid(), None, None), ctypes.get_errno())",
        {OK},
        printed("-1 1"),
    ),
    Case("os_exit", "import os\nos._exit(0)", {KILLED}, printed(""), session_survives=False),
    Case(
        "segfault_via_ctypes",
        "import ctypes\nctypes.string_at(0)",
        {KILLED},
        lambda r: "SIGSEGV" in r.detail,
        session_survives=False,
    ),
    Case(
        "huge_stdout",
        "import sys\nfor _ in range(100):\n    sys.stdout.write('y' * 1_000_000)",
        {OK},
        lambda r: r.stdout_truncated and len(r.stdout) < 2100,
        session_survives=True,
    ),
    Case(
        "huge_fd_output",
        "import os\nos.write(1, b'z' * 20_000_000)",
        {OK},
        lambda r: r.stdout_truncated and len(r.stdout) < 2100,
        session_survives=True,
    ),
    Case(
        "deep_recursion",
        "def f(n):\n    return f(n + 1)\nf(0)",
        {ERROR},
        raised("RecursionError"),
        session_survives=True,
    ),
    Case(
        "deep_recursion_past_the_c_stack",
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
        {KILLED, ERROR, MEMORY, TIMEOUT},
    ),  # 3.11 frames live on the heap: memory runs out first
    Case(
        "close_own_stdout",
        "import os, sys\nos.close(1)\nos.close(2)\nsys.stdout.close()",
        {OK, ERROR},
        session_survives=True,
    ),
    Case(
        "orphaned_children",
        "import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "subprocess.Popen(['sh', '-c', '(sleep 600 &) ; exit 0'])\nprint('spawned')",
        {OK},
        printed("spawned"),
        session_survives=True,
    ),
    Case(
        "exit_via_sys_exit_and_keyboard_interrupt",
        "raise SystemExit(3)",
        {ERROR},
        raised("SystemExit"),
        session_survives=True,
    ),
]


async def _innocent(sb: Sandbox, k: int) -> list[str]:
    async with await sb.session() as s:
        await s.run(f"acc = {k}")
        out = []
        for i in range(6):
            out.append((await s.run(f"acc = acc * 3 + {i}\nprint(acc)")).stdout)
            await asyncio.sleep(0.05)
        return out


def _expected_innocent(k: int) -> list[str]:
    acc, out = k, []
    for i in range(6):
        acc = acc * 3 + i
        out.append(f"{acc}\n")
    return out


def _sandbox_processes(uid_range: list[int] | None) -> list[int]:
    """Pids running as one of the sandbox's family uids (what a root sandbox's sessions run
    as), so processes that left every process group are found too."""
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


def _skip_reason(case: Case, session) -> str | None:
    if case.needs == "mount" and not session.isolation.get("mount"):
        return "no mount namespace here"
    if case.needs == "family uid" and session.isolation.get("uid") != "family":
        return "sessions do not run as their own uid here (needs root)"
    return None


@pytest.fixture
def host_listeners():
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + ABSTRACT_NAME)
    abstract.listen(1)
    yield tcp.getsockname()[1]
    tcp.close()
    abstract.close()
    if os.path.exists(HOST_MARKER):
        os.remove(HOST_MARKER)


async def _run_case(sb: Sandbox, case: Case, port: int) -> tuple[ExecResult | None, str | None]:
    async with await sb.session() as s:
        reason = _skip_reason(case, s)
        if reason:
            return None, reason
        r = await s.run(case.code.replace("PORT", str(port)))
        assert r.status in case.statuses, (case.name, r)
        assert case.check(r), (case.name, r)
        if case.session_survives is not None:
            assert s.alive is case.session_survives, (case.name, r)
        if s.alive:
            assert (await s.run("print(6 * 7)")).stdout.endswith("42\n"), case.name
        return r, None


def test_there_are_at_least_25_programs():
    assert len(CASES) >= 25 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_program_is_contained(case, host_listeners):
    async def main():
        async with Sandbox(LIMITS, preload=("math",)) as sb:
            _, skipped = await _run_case(sb, case, host_listeners)
            if skipped:
                pytest.skip(skipped)
            assert (await sb.run_once("print(sum(range(10)))")).stdout == "45\n"
            assert os.path.exists(f"/proc/{sb.zygote_pid}")
            return sb.isolation.get("uid_range")

    uid_range = asyncio.run(main())
    assert not os.path.exists(HOST_MARKER)
    assert not os.path.exists(f"{PROJECT_DIR}/pwned.py")
    assert _sandbox_processes(uid_range) == []


@contextlib.contextmanager
def _busy_neighbours(n: int):
    """`n` processes that spin on a core each until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    "neighbours", [0, min(os.cpu_count() or 1, 4)], ids=["alone", "beside_busy_cores"]
)
def test_all_programs_at_once_beside_innocent_sessions(host_listeners, neighbours):
    async def main():
        async with Sandbox(LIMITS, preload=("math",)) as sb:
            innocent = [asyncio.ensure_future(_innocent(sb, k)) for k in range(4)]
            hostile = [_run_case(sb, case, host_listeners) for case in CASES]
            results = await asyncio.gather(*hostile)
            assert (
                sum(r is not None for r, _ in results) >= 25 or sb.isolation.get("uid") != "family"
            )
            for k, task in enumerate(innocent):
                assert await task == _expected_innocent(k)
            assert (await sb.run_once("print(2 ** 10)")).stdout == "1024\n"
            return sb.zygote_pid, sb.isolation.get("uid_range")

    with _busy_neighbours(neighbours):
        zygote, uid_range = asyncio.run(main())
    assert not os.path.exists(f"/proc/{zygote}")
    assert _sandbox_processes(uid_range) == []
    assert not os.path.exists(HOST_MARKER)


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("the sandbox needs Linux", allow_module_level=True)
