"""Tests of the HTTP transport against real `tirl sandbox serve` processes (no mocks).

Every server is started as a subprocess listening on 127.0.0.1 with a port the OS picks, and
these tests connect to nothing else. One server, shared by the module, runs the transport
contract (tests/sandbox_contract.py); tests that kill or stop a server start their own.
No assertion depends on wall-clock speed, except generous "does not hang" bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from process_tree import descendants
from sandbox_contract import CONTRACT_CHECKS, CONTRACT_LIMITS

from tirl.cli import main as cli_main
from tirl.sandbox import Status
from tirl.sandbox.api import SandboxError
from tirl.sandbox.http import HTTPSandbox

MAX_TIMEOUT_S = 2.5  # the servers' cap on a per-call timeout_s
SERVE_ARGS = [
    "--timeout-s", str(CONTRACT_LIMITS.timeout_s),
    "--grace-s", str(CONTRACT_LIMITS.grace_s),
    "--memory-mb", str(CONTRACT_LIMITS.memory_mb),
    "--capture-chars", str(CONTRACT_LIMITS.capture_chars),
    "--max-timeout-s", str(MAX_TIMEOUT_S),
    "--preload", "math",
    "--pool-size", "2",
]  # fmt: skip
START_TIMEOUT_S = 60.0
NO_HANG_S = 20.0  # bound on anything that must not hang


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_server(folder: Path, *extra: str) -> Server:
    """Start `tirl sandbox serve --port 0` and wait for the line that gives its port."""
    folder.mkdir(parents=True, exist_ok=True)
    out_path, err_path = folder / "stdout.txt", folder / "stderr.txt"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        cmd = [sys.executable, "-m", "tirl.cli", "sandbox", "serve", "--port", "0"]
        proc = subprocess.Popen([*cmd, *SERVE_ARGS, *extra], stdout=out, stderr=err)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)\n", out_path.read_text())
        if found:
            return Server(proc, found.group(1), err_path)
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"the server did not start:\n{err_path.read_text()}")
        time.sleep(0.05)


def stop_server(server: Server) -> int:
    """SIGTERM, then SIGKILL if it has not exited after NO_HANG_S; returns the exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(NO_HANG_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        raise


@contextlib.contextmanager
def running_server(folder: Path, *extra: str):
    server = start_server(folder, *extra)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("server")) as s:
        yield s


def run(coro):
    return asyncio.run(coro)


def _wait_until_gone(pids: set[int]) -> set[int]:
    """The pids still in /proc (zombies included) after waiting up to NO_HANG_S."""
    deadline = time.monotonic() + NO_HANG_S
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {p for p in left if os.path.exists(f"/proc/{p}")}
        time.sleep(0.05)
    return left


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, await resp.text()


async def _health(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(url + "/health") as resp:
        return await resp.json()


async def _metrics(url: str) -> dict[str, float]:
    """Samples of /metrics as {'name{labels}': value}."""
    status, text = await _get(url + "/metrics")
    assert status == 200
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


# -- the contract every transport meets ---------------------------------------------------------


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__[len("check_") :])
def test_contract(check, server):
    async def main():
        async with HTTPSandbox(server.url) as client:
            await check(client)

    run(main())


# -- the server's API ---------------------------------------------------------------------------


def test_health_and_metrics_follow_sessions_cells_and_forks(server):
    async def main():
        async with HTTPSandbox(server.url) as client:
            h0, m0 = await _health(server.url), await _metrics(server.url)
            s = await client.session()
            assert (await s.run("x = 1")).ok
            assert (await s.run("1 / 0")).status is Status.ERROR
            child = await s.fork()
            h1, m1 = await _health(server.url), await _metrics(server.url)
            await child.close()
            await s.close()
            m2 = await _metrics(server.url)
        return h0, h1, m0, m1, m2

    h0, h1, m0, m1, m2 = run(main())
    assert h1["status"] == "ok"
    assert h1["sessions"] == h0["sessions"] + 2
    assert h1["uptime_s"] > h0["uptime_s"]
    assert h1["limits"]["timeout_s"] == CONTRACT_LIMITS.timeout_s
    assert h1["limits"]["memory_mb"] == CONTRACT_LIMITS.memory_mb
    assert h1["max_timeout_s"] == MAX_TIMEOUT_S

    def delta(after, name):
        return after[name] - m0.get(name, 0.0)

    assert delta(m1, 'tirl_sandbox_cells_total{status="ok"}') == 1
    assert delta(m1, 'tirl_sandbox_cells_total{status="error"}') == 1
    assert delta(m1, 'tirl_sandbox_cells_total{status="timeout"}') == 0
    assert delta(m1, "tirl_sandbox_cell_duration_seconds_count") == 2
    assert delta(m1, "tirl_sandbox_cell_duration_seconds_sum") > 0
    assert delta(m1, "tirl_sandbox_sessions_created_total") == 2  # the fork included
    assert delta(m1, "tirl_sandbox_forks_total") == 1
    assert delta(m1, "tirl_sandbox_sessions_live") == 2
    assert delta(m2, 'tirl_sandbox_sessions_closed_total{reason="client"}') == 2
    assert delta(m2, "tirl_sandbox_sessions_live") == 0


@pytest.mark.parametrize(
    "body, words",
    [
        (b'{"timeout_s": 1}', ["missing field 'code'"]),
        (b'{"code": 42}', ["'code'", "string"]),
        (b'{"code": ["1"]}', ["'code'", "string", "array"]),
        (b'{"code": "1", "timeout_s": -1}', ["'timeout_s'", "positive", "-1"]),
        (b'{"code": "1", "timeout_s": "2"}', ["'timeout_s'", "positive"]),
        (b'{"code": "1", "timeout_s": true}', ["'timeout_s'", "true"]),
        (b'{"code": "1", "timeout_s": Infinity}', ["'timeout_s'", "Infinity"]),
        (b"{code: 1}", ["not valid JSON"]),
        (b"", ["not valid JSON"]),
        (b'"print(1)"', ["JSON object", "'code'"]),
    ],
)
def test_malformed_requests_get_400_naming_the_problem(server, body, words):
    async def main():
        async with aiohttp.ClientSession() as http:
            async with http.post(server.url + "/v1/sessions") as resp:
                sid = (await resp.json())["id"]
            replies = []
            for path in (f"/v1/sessions/{sid}/run", "/v1/run"):
                async with http.post(server.url + path, data=body) as resp:
                    replies.append((resp.status, await resp.json()))
            await http.delete(f"{server.url}/v1/sessions/{sid}")
            return replies

    for status, reply in run(main()):
        assert status == 400
        assert all(w in reply["error"] for w in words), reply


def test_unknown_session_ids_get_404_with_a_json_message(server):
    async def main():
        replies = []
        async with aiohttp.ClientSession() as http:
            for method, path in [
                ("POST", "/v1/sessions/f00d/run"),
                ("POST", "/v1/sessions/f00d/fork"),
                ("DELETE", "/v1/sessions/f00d"),
            ]:
                async with http.request(method, server.url + path, json={"code": "1"}) as resp:
                    replies.append((resp.status, await resp.json()))
            async with http.get(server.url + "/v1/no-such-route") as resp:
                replies.append((resp.status, await resp.json()))
        return replies

    *sessions, route = run(main())
    for status, reply in sessions:
        assert status == 404 and "no session 'f00d'" in reply["error"]
    assert route[0] == 404 and "/v1/no-such-route" in route[1]["error"]


def test_a_session_the_server_forgot_is_killed_and_can_be_restored(server):
    async def main():  # REST calls: a channel's sessions are not reachable from the routes
        async with HTTPSandbox(server.url, channel=False) as client, await client.session() as s:
            await s.run("kept = 7")
            async with aiohttp.ClientSession() as http:  # closed behind the client's back
                await http.delete(f"{server.url}/v1/sessions/{s.remote_id}")
            r = await s.run("kept")
            assert r.status is Status.KILLED and "no session" in r.detail
            assert not s.alive
            assert await s.restore() == 1
            assert (await s.run("kept")).stdout == "7\n"

    run(main())


def test_a_per_call_timeout_is_capped_by_the_server(server):
    async def main():
        async with HTTPSandbox(server.url) as client, await client.session() as s:
            r = await s.run("import time\nwhile True:\n    time.sleep(0.01)", timeout_s=30)
            assert r.status is Status.TIMEOUT and r.timeout_s == MAX_TIMEOUT_S
            assert s.alive

    run(main())


def test_idle_sessions_are_closed_after_the_ttl(tmp_path):
    async def main(srv):
        async with HTTPSandbox(srv.url) as client:
            s = await client.session()
            await s.run("x = 1")
            deadline = time.monotonic() + NO_HANG_S
            while (await _health(srv.url))["sessions"] and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            r = await s.run("x")
            assert r.status is Status.KILLED and "idle" in r.detail
            closed = (await _metrics(srv.url))['tirl_sandbox_sessions_closed_total{reason="idle"}']
            assert closed == 1

    with running_server(tmp_path, "--idle-ttl-s", "0.5") as srv:
        run(main(srv))


# -- failures and several servers ---------------------------------------------------------------


def test_a_server_killed_mid_session_gives_killed_and_never_hangs(tmp_path):
    async def main(srv):
        async with HTTPSandbox(srv.url) as client:
            busy, idle = await client.session(), await client.session()
            await idle.run("x = 1")
            cell = asyncio.ensure_future(busy.run("import time\ntime.sleep(60)", timeout_s=2))
            await asyncio.sleep(0.3)  # the cell has most likely started; either way: KILLED
            processes = descendants(srv.pid)
            srv.proc.kill()
            for r in [
                await asyncio.wait_for(cell, NO_HANG_S),
                await asyncio.wait_for(idle.run("x"), NO_HANG_S),
                await asyncio.wait_for(idle.run("x"), NO_HANG_S),
            ]:
                assert r.status is Status.KILLED and srv.url in r.detail, r
            assert not busy.alive and not idle.alive
            with pytest.raises(SandboxError, match="could not open a sandbox session"):
                await asyncio.wait_for(client.session(), NO_HANG_S)
        return processes

    with running_server(tmp_path) as srv:
        processes = run(main(srv))
    assert processes and _wait_until_gone(processes) == set()  # the zygote took them along


def test_sessions_spread_over_two_servers_and_stay_on_their_own(tmp_path):
    async def main(a, b):
        async with HTTPSandbox([a.url, b.url]) as client:
            sessions = [await client.session() for _ in range(4)]
            assert sorted(s.url for s in sessions) == sorted([a.url, a.url, b.url, b.url])
            for i, s in enumerate(sessions):  # i + 1 cells in session i
                for _ in range(i + 1):
                    assert (await s.run(f"v = {i}")).ok
            cells = {a.url: 0, b.url: 0}
            for i, s in enumerate(sessions):
                cells[s.url] += i + 1
            for srv in (a, b):
                metrics = await _metrics(srv.url)
                assert metrics['tirl_sandbox_cells_total{status="ok"}'] == cells[srv.url]
                assert (await _health(srv.url))["sessions"] == 2
            on_a = next(s for s in sessions if s.url == a.url)
            await on_a.close()
            assert (await client.session()).url == a.url  # the server with fewer sessions

    with running_server(tmp_path / "a") as a, running_server(tmp_path / "b") as b:
        run(main(a, b))


def test_restore_rebuilds_a_session_on_the_surviving_server(tmp_path):
    async def main(a, b):
        async with HTTPSandbox([a.url, b.url]) as client:
            first, second = await client.session(), await client.session()
            s = first if first.url == a.url else second
            sid = s.id
            await s.run("base = 40")
            await s.run("base += 2")
            a.proc.kill()
            r = await asyncio.wait_for(s.run("print(base)"), NO_HANG_S)
            assert r.status is Status.KILLED and a.url in r.detail and not s.alive
            assert await asyncio.wait_for(s.restore(), NO_HANG_S) == 2
            assert (s.id, s.url, s.alive) == (sid, b.url, True)
            assert (await s.run("print(base)")).stdout == "42\n"
            assert (await client.session()).url == b.url

    with running_server(tmp_path / "a") as a, running_server(tmp_path / "b") as b:
        run(main(a, b))


def test_sigterm_shuts_down_cleanly_and_leaves_no_process(tmp_path):
    async def main(srv):
        async with HTTPSandbox(srv.url) as client:
            s, busy = await client.session(), await client.session()
            code = "import subprocess\nsubprocess.Popen(['sleep', '60']).pid"
            assert (await s.run(code)).ok
            cell = asyncio.ensure_future(busy.run("import time\ntime.sleep(60)", timeout_s=2))
            await asyncio.sleep(0.3)
            processes = descendants(srv.pid)
            srv.proc.send_signal(signal.SIGTERM)
            r = await asyncio.wait_for(cell, NO_HANG_S)
            assert r.status is Status.TIMEOUT  # it ran to its own limit and was answered
        return processes

    srv = start_server(tmp_path)
    try:
        processes = run(main(srv))
        code = srv.proc.wait(NO_HANG_S)  # the SIGTERM sent in main() alone stops it
    finally:
        stop_server(srv)
    assert code == 0
    assert "tirl sandbox: stopping" in srv.stderr_path.read_text()
    assert len(processes) >= 4  # the zygote, two sessions, the pool, the sleep
    assert _wait_until_gone(processes) == set()


def test_a_second_sigterm_stops_a_draining_server_at_once(tmp_path):
    """The first SIGTERM waits for a running cell (up to --max-timeout-s); the second one does
    not wait, and the sessions still go with the server."""

    async def main(srv):
        async with HTTPSandbox(srv.url) as client:
            session = await client.session()
            cell = asyncio.ensure_future(session.run("import time\ntime.sleep(60)", timeout_s=60))
            await asyncio.sleep(0.3)
            processes = descendants(srv.pid)
            srv.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + NO_HANG_S
            while "stopping (" not in srv.stderr_path.read_text():
                assert time.monotonic() < deadline, srv.stderr_path.read_text()
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            assert srv.proc.poll() is None  # draining: the cell has 60 s
            sent = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(srv.proc.wait, NO_HANG_S)
            took = time.monotonic() - sent
            result = await asyncio.wait_for(cell, NO_HANG_S)
            return processes, code, took, result

    srv = start_server(tmp_path, "--max-timeout-s", "60")
    try:
        processes, code, took, result = run(main(srv))
    finally:
        stop_server(srv)
    assert code == 128 + signal.SIGTERM and took < 5.0, (code, took)
    assert "stopping now (second signal)" in srv.stderr_path.read_text()
    assert result.status is Status.KILLED  # the server went away under it
    assert len(processes) >= 2 and _wait_until_gone(processes) == set()


def test_a_port_in_use_is_one_line_and_exit_code_2_as_for_tirl_serve(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tirl.cli", "sandbox", "serve", "--port", str(port),
             "--pool-size", "0", "--preload", ""],
            capture_output=True, text=True, timeout=START_TIMEOUT_S,
        )  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1 port {port}" in done.stderr, done.stderr


def test_bad_flag_values_are_one_line_errors(capsys):
    for flags in (["--port", "http"], ["--timeout-s", "0"], ["--preload", "no_such_module_x"]):
        assert cli_main(["sandbox", "serve", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flags[0] in err and "Traceback" not in err


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "rest"])
def test_sigterm_answers_the_running_cells_before_the_server_exits(tmp_path, channel):
    """A cell running when the server gets SIGTERM finishes and its client gets the result;
    a request that arrives meanwhile is refused (503), and the server then exits cleanly."""

    async def main(srv: Server):
        async with HTTPSandbox(srv.url, channel=channel) as sandbox:
            session = await sandbox.session()
            running = asyncio.create_task(
                session.run("import time\ntime.sleep(1.5)\nprint('finished')", timeout_s=2.0)
            )
            await asyncio.sleep(0.5)  # the cell is running
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with aiohttp.ClientSession(trust_env=False) as http:
                async with http.post(f"{srv.url}/v1/run", json={"code": "print(1)"}) as r:
                    refused = r.status, (await r.json())["error"]
            return await running, refused

    srv = start_server(tmp_path / "server")
    try:
        result, refused = run(main(srv))
        assert result.status is Status.OK and result.stdout == "finished\n", result
        assert refused == (503, "the sandbox server is shutting down")
        assert srv.proc.wait(NO_HANG_S) == 0
    finally:
        stop_server(srv)
