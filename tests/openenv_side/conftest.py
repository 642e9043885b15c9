"""Shared parts of the tests against the real OpenEnv (`openenv-core`, `tirl[openenv]`), run in
a venv of their own by `tests/test_openenv_plugin.py` (openenv's pins clash with the dev env).

Nothing here is a mock: each server is `python -m tirl.integrations.openenv.server` in a
process of its own on 127.0.0.1 (OpenEnv's FastAPI app under uvicorn, tirl's real sandbox), and
the tests drive it with OpenEnv's own `EnvClient` (`TirlEnvClient`). Every process of the run,
this one and the servers, runs under the network guard of `site/sitecustomize.py`; the run
fails if anything tried to leave loopback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SITE = HERE / "site"

# The main suite runs this folder through test_openenv_plugin.py, in a venv with openenv; where
# openenv is not installed (the main suite's own collection), nothing here runs or is installed.
if importlib.util.find_spec("openenv") is None:
    collect_ignore_glob = ["test_*.py"]
# The network guard, in this process and (through PYTHONPATH and the variable) in every server.
elif not os.environ.get("TIRL_NETGUARD_LOG"):
    os.environ["TIRL_NETGUARD_LOG"] = tempfile.mkstemp(prefix="tirl-netguard-", suffix=".log")[1]
_spec = importlib.util.spec_from_file_location("tirl_netguard", SITE / "sitecustomize.py")
netguard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netguard)  # installs the guard here when the variable is set
NETGUARD_LOG = Path(os.environ.get("TIRL_NETGUARD_LOG", "/nonexistent"))

START_TIMEOUT_S = 180  # importing gradio (openenv's) alone takes seconds on a busy machine


@pytest.fixture(scope="session", autouse=True)
def nothing_left_loopback() -> Iterator[None]:
    yield
    attempts = NETGUARD_LOG.read_text(encoding="utf-8") if NETGUARD_LOG.exists() else ""
    assert attempts == "", f"something tried to leave loopback:\n{attempts}"


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    stderr: str = ""  # what it wrote, once it has exited

    def descendants(self) -> set[int]:
        """Every live process under the server: its sandbox's zygote and the open sessions."""
        parents = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and not _gone(int(entry.name)):
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        found, grew = {self.process.pid}, True
        while grew:
            new = {pid for pid, parent in parents.items() if parent in found} - found
            found |= new
            grew = bool(new)
        return found - {self.process.pid}

    def children(self) -> list[int]:
        """Pids whose parent is the server (its sandbox's zygote, once code has run)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid:
                    pids.append(int(entry.name))
        return pids


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def server_env() -> dict[str, str]:
    path = [str(SITE), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def server_command(entry: dict, *settings: str, seed: int = 0) -> list[str]:
    sets = [arg for s in settings for arg in ("--set", s)]
    return [sys.executable, "-m", "tirl.integrations.openenv.server", "--source",
            json.dumps(entry), "--port", "0", "--seed", str(seed), *sets]  # fmt: skip


@contextmanager
def openenv_server(entry: dict, *settings: str, seed: int = 0) -> Iterator[Server]:
    """A server on a free loopback port; on leaving, SIGTERM, and it must exit cleanly."""
    process = subprocess.Popen(
        server_command(entry, *settings, seed=seed),
        cwd=ROOT, env=server_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while not line and time.monotonic() < deadline and process.poll() is None:
            if select.select([process.stdout], [], [], 1.0)[0]:
                line = process.stdout.readline()
        assert line.startswith("tirl openenv: listening on http://127.0.0.1:"), line + (
            process.stderr.read() if process.poll() is not None else ""
        )
        server = Server(line.split()[-1].strip(), process)
        yield server
        zygotes = server.children()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        server.stderr = err
        assert process.returncode == 0, err[-3000:]
        assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
        for pid in zygotes:  # the sandbox went with the server (or is a zombie being reaped)
            for _ in range(50):
                if _gone(pid):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"process {pid} of the server's sandbox outlived it")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


RACES = {"source": "races", "min_size": 2, "max_size": 3}  # short chains keep the search fast
RACES_SEED = 1


@pytest.fixture(scope="session")
def races_server() -> Iterator[Server]:
    with openenv_server(RACES, seed=RACES_SEED) as server:
        yield server


@pytest.fixture(scope="session")
def arithmetic_server() -> Iterator[Server]:
    with openenv_server({"source": "arithmetic"}, "max_tool_calls=3", "max_sessions=4") as server:
        yield server


def run(coroutine):
    """Run one test's client coroutine (each test has its own event loop and connections)."""
    return asyncio.run(coroutine)
