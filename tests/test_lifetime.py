"""Children that die with their parent: an agent program run by the training gateway is
killed by the kernel when the trainer is killed outright (`kill -9`), however it is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

# A program that never talks to the gateway (it would otherwise notice the trainer is gone):
# it records its pid and sleeps.
STUCK_PROGRAM = (
    "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
)

RUNNER = textwrap.dedent(
    """
    import asyncio, os, sys
    from tirl.apps.gateway import _run_program
    command = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
    asyncio.run(_run_program(command, dict(os.environ), 600))
    """
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead: its parent (init here) has only not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_an_agent_program_dies_when_its_trainer_is_killed(tmp_path):
    pid_file = tmp_path / "agent.pid"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, STUCK_PROGRAM, str(pid_file)])
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60)
        agent = int(pid_file.read_text())
        assert alive(agent)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        assert wait_for(lambda: not alive(agent), 10), "the agent program outlived its trainer"
    finally:
        runner.kill()
        runner.wait()
        if pid_file.exists() and pid_file.read_text() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
