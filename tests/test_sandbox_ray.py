"""Tests of tirl.sandbox.ray_pool on a local, loopback-only Ray cluster (real actors, no mocks).

Starting Ray and its worker processes costs seconds, so one cluster and one pool of two actors
serve the whole module. Each test still runs its own event loop with asyncio.run: the pool keeps
no asyncio objects between calls, and Ray results can be awaited from any loop. A test that kills
an actor leaves the pool to replace it, which is part of what it checks. No assertion depends on
wall-clock speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'tirl[ray]')")

from sandbox_contract import (  # noqa: E402
    CONTRACT_CHECKS,
    CONTRACT_LIMITS,
    CONTRACT_LIMITS_KEEP_BACKGROUND,
)

from tirl.sandbox import Status  # noqa: E402
from tirl.sandbox.ray_pool import RaySandboxPool, init_local_ray  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    started_here = not ray.is_initialized()
    if started_here:
        init_local_ray(num_cpus=2)
    yield
    if started_here:
        ray.shutdown()


@pytest.fixture(scope="module")
def pool(ray_cluster):
    pool = RaySandboxPool(num_actors=2, limits=CONTRACT_LIMITS)
    asyncio.run(pool.start())
    yield pool
    asyncio.run(pool.close())


@pytest.fixture(scope="module")
def ray_path_pool(ray_cluster):
    """A pool whose cells go as Ray calls (`exchange`), the fallback data path."""
    pool = RaySandboxPool(num_actors=1, limits=CONTRACT_LIMITS, data_path="ray")
    asyncio.run(pool.start())
    yield pool
    asyncio.run(pool.close())


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], within_s: float = 15.0) -> list[int]:
    """The pids still running after waiting up to `within_s` for all of them to end."""
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        with open(f"/proc/{pid}/status") as f:
            pid = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
        chain.append(pid)
    return chain


def _actor_holding(stats: dict, session_id: str) -> dict:
    return next(a for a in stats["actors"] if session_id in a.get("session_pids", {}))


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_contract(pool, check):
    asyncio.run(check(pool))


def test_local_cluster_uses_only_loopback(ray_cluster):
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}


def test_sessions_spread_over_actors_and_cells_run_on_their_actor(pool):
    async def main():
        sessions = [await pool.session() for _ in range(4)]
        try:
            for i, s in enumerate(sessions):
                for _ in range(i + 1):
                    assert (await s.run("pass")).ok
            stats = await pool.stats()
            live = [a for a in stats["actors"] if a["alive"]]
            assert len(live) == 2
            assert sorted(len(a["session_pids"]) for a in live) == [2, 2]  # least-loaded
            for s in sessions:
                actor = _actor_holding(stats, s.id)
                ancestors = _ancestors(actor["session_pids"][s.id])
                assert actor["pid"] in ancestors and actor["zygote_pid"] in ancestors
            cells = {a["pid"]: a["cells"].get("ok", 0) for a in live}
        finally:
            for s in sessions:
                await s.close()
        ran = [
            sum(i + 1 for i, s in enumerate(sessions) if _actor_holding(stats, s.id) is a)
            for a in live
        ]
        return cells, ran, live

    before = asyncio.run(pool.stats())
    ok_before = {a["pid"]: a["cells"].get("ok", 0) for a in before["actors"] if a["alive"]}
    cells, ran, live = asyncio.run(main())
    # Each actor counted exactly the cells of the sessions placed on it.
    assert [cells[a["pid"]] - ok_before.get(a["pid"], 0) for a in live] == ran


@pytest.mark.parametrize("pool_name", ["pool", "ray_path_pool"])
def test_many_sessions_at_once_share_actor_calls_and_get_their_own_replies(request, pool_name):
    # 40 sleeping cells at once. Over Ray calls (ray_path_pool), more than COALESCE_MIN_RUNNING
    # run at once, so exchanges carry many requests and replies (and wait to coalesce them);
    # over the sockets, one connection per actor carries them all.
    pool = request.getfixturevalue(pool_name)

    async def one(i: int):
        async with await pool.session() as s:
            assert (await s.run(f"v = {i}")).ok
            r = await s.run("import time\ntime.sleep(0.3)\nprint(v * v)")
            return r.stdout

    async def main():
        return await asyncio.gather(*(one(i) for i in range(40)))

    assert asyncio.run(main()) == [f"{i * i}\n" for i in range(40)]


@pytest.mark.parametrize("pool_name", ["pool", "ray_path_pool"])
def test_a_cancelled_run_kills_its_session_on_the_actor(request, pool_name):
    pool = request.getfixturevalue(pool_name)

    async def main():
        s = await pool.session()
        cell = asyncio.ensure_future(s.run("import time\ntime.sleep(60)", timeout_s=60))
        await asyncio.sleep(0.5)  # most likely running; either way the session must die
        cell.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cell
        assert not s.alive
        deadline = time.monotonic() + 20
        while any(s.id in a.get("session_pids", {}) for a in (await pool.stats())["actors"]):
            assert time.monotonic() < deadline, "the actor did not end the cancelled session"
            await asyncio.sleep(0.05)
        await s.close()

    asyncio.run(main())


def test_unknown_session_id_gives_killed(pool):
    d = ray.get(pool.actors[0].run.remote("no-such-id", "1", None), timeout=60)
    assert d["status"] == Status.KILLED.value
    assert "no session no-such-id" in d["detail"] and d["alive"] is False


def test_killed_actor_gives_killed_then_pool_replaces_it_and_restore_moves_session(pool):
    async def main():
        doomed_session = await pool.session()
        other = await pool.session()
        assert doomed_session.actor != other.actor
        await doomed_session.run("x = 6 * 7")
        before = await pool.stats()
        doomed = _actor_holding(before, doomed_session.id)
        ray.kill(doomed_session.actor, no_restart=True)
        assert _wait_gone([doomed["pid"]]) == []

        r = await doomed_session.run("print(x)")
        assert r.status is Status.KILLED
        assert "sandbox actor" in r.detail and "died" in r.detail
        assert not doomed_session.alive
        assert (await other.run("1 + 1")).stdout == "2\n"  # the other actor is untouched

        async with await pool.session() as fresh:  # placed on the replacement actor
            assert (await fresh.run("print('fresh')")).stdout == "fresh\n"
        after = await pool.stats()
        assert after["actors_alive"] == 2 and after["actors_replaced"] >= 1
        assert doomed["pid"] not in {a["pid"] for a in after["actors"]}

        old_id, old_actor = doomed_session.id, doomed_session.actor
        assert await doomed_session.restore() == 1
        assert doomed_session.id == old_id and doomed_session.actor != old_actor
        assert (await doomed_session.run("print(x)")).stdout == "42\n"
        await doomed_session.close()
        await other.close()
        return doomed

    doomed = asyncio.run(main())
    # The actor's zygote and sessions died with it.
    assert _wait_gone([doomed["zygote_pid"], *doomed["session_pids"].values()]) == []


def test_close_leaves_no_sandbox_process_behind(ray_cluster):
    async def main():
        pool = RaySandboxPool(num_actors=2, limits=CONTRACT_LIMITS_KEEP_BACKGROUND)
        await pool.start()
        sessions = [await pool.session() for _ in range(3)]
        assert (
            await sessions[0].run("import subprocess\np = subprocess.Popen(['sleep', '600'])")
        ).ok
        stats = await pool.stats()
        leftover = _children_of(
            _actor_holding(stats, sessions[0].id)["session_pids"][sessions[0].id]
        )
        await pool.close()
        after_close = await sessions[1].run("1")
        return leftover, stats, after_close

    leftover, stats, after_close = asyncio.run(main())
    assert after_close.status is Status.KILLED
    assert len(leftover) == 1  # the sleep the cell started
    pids = list(leftover)
    for actor in stats["actors"]:
        pids += [actor["pid"], actor["zygote_pid"], *actor["session_pids"].values()]
    assert len(pids) == 1 + 2 * 2 + 3
    assert _wait_gone(pids) == []


@pytest.mark.parametrize("connected", [False, True], ids=["connecting", "connected"])
def test_an_actor_that_stops_answering_gives_killed_instead_of_hanging(ray_cluster, connected):
    # A stopped actor's kernel still accepts a connection; nothing answers on it.
    async def main():
        async with RaySandboxPool(limits=CONTRACT_LIMITS, rpc_margin_s=1.0) as pool:
            s = await pool.session()
            if connected:  # the socket is open before the actor stops
                assert (await s.run("0")).ok
            actor_pid = (await pool.stats())["actors"][0]["pid"]
            os.kill(actor_pid, signal.SIGSTOP)  # alive, but answers nothing
            try:
                r = await s.run("1", timeout_s=0.5)
            finally:
                os.kill(actor_pid, signal.SIGCONT)
            assert r.status is Status.KILLED and "did not answer" in r.detail
            assert not s.alive
            assert await s.restore() == int(connected)  # the cells replayed
            assert (await s.run("2")).stdout == "2\n"

    asyncio.run(main())


def _requests(stats: dict) -> dict[str, int]:
    """Requests the live actors answered, by data path (Ray `exchange` calls or the socket)."""
    live = [a for a in stats["actors"] if a["alive"]]
    return {path: sum(a["requests"][path] for a in live) for path in ("ray", "socket")}


def test_cells_go_over_the_actors_sockets_not_as_ray_calls(pool, ray_path_pool):
    async def main(pool):
        before = _requests(await pool.stats())
        async with await pool.session() as s:
            for i in range(10):
                assert (await s.run(f"print({i})")).stdout == f"{i}\n"
            assert (await pool.run_once("print('once')")).stdout == "once\n"
            during = _requests(await pool.stats())
        return before, during

    before, during = asyncio.run(main(pool))
    # One Ray request for the whole session (its `create`); the 11 cells went over the socket.
    assert (during["ray"] - before["ray"], during["socket"] - before["socket"]) == (1, 11)
    for slot in pool._slots:
        assert slot.info["url"].startswith("http://127.0.0.1:")  # loopback on a local cluster
    before, during = asyncio.run(main(ray_path_pool))
    assert (during["ray"] - before["ray"], during["socket"] - before["socket"]) == (12, 0)


def test_a_bad_message_on_the_socket_fails_only_that_request(pool):
    async def main():
        s = await pool.session()
        await s.run("kept = 41")
        info = s._slot.info
        url = info["url"] + "/v1/channel"
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession(trust_env=False) as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as no_key:
                await http.ws_connect(url)
            assert no_key.value.status == 401
            headers = {"Authorization": f"Bearer {info['key']}"}
            async with http.ws_connect(url, headers=headers) as ws:
                await ws.send_str("not json")
                await ws.send_str(json.dumps({"id": 1, "op": "run", "session": s.id, "code": 5}))
                await ws.send_str(json.dumps({"id": 2, "op": "open"}))
                await ws.send_str(json.dumps({"id": 3, "op": "run", "session": s.id}))
                good = {"id": 4, "op": "run", "session": s.id, "code": "print(kept + 1)"}
                await ws.send_str(json.dumps(good))
                replies = {}
                while len(replies) < 5:
                    reply = json.loads((await ws.receive(timeout=30)).data)
                    replies[reply["id"]] = reply
        assert replies[None]["status"] == 400 and "not valid JSON" in replies[None]["body"]["error"]
        assert (
            replies[1]["status"] == 400 and "'code' must be a string" in replies[1]["body"]["error"]
        )
        assert (
            replies[2]["status"] == 400
            and "go through the actor's Ray" in replies[2]["body"]["error"]
        )
        assert replies[3]["status"] == 400 and "missing field 'code'" in replies[3]["body"]["error"]
        assert (replies[4]["status"], replies[4]["body"]["stdout"]) == (200, "42\n")
        # The session lives on after that connection closed: it belongs to the pool.
        assert s.alive and (await s.run("print(kept)")).stdout == "41\n"
        await s.close()

    asyncio.run(main())


@pytest.mark.parametrize("max_restarts", [0, 1], ids=["replaced", "restarted-by-ray"])
def test_an_actor_killed_mid_cell_fails_its_sessions_and_new_ones_use_its_successor(
    ray_cluster, max_restarts
):
    # The actor's process dies while a cell runs on its socket: the socket closes, the pool asks
    # Ray, and every session of that process reports the death. With max_restarts=0 the pool
    # starts a new actor; with 1, Ray restarts the same one. Either way, new sessions reach the
    # new process at its new address.
    async def main():
        options = {"max_restarts": max_restarts}
        async with RaySandboxPool(limits=CONTRACT_LIMITS, actor_options=options) as pool:
            running, idle = await pool.session(), await pool.session()
            await idle.run("x = 1")
            old = (await pool.stats())["actors"][0]
            old_url = pool._slots[0].info["url"]
            cell = asyncio.ensure_future(running.run("import time\ntime.sleep(30)", timeout_s=60))
            await asyncio.sleep(0.5)
            os.kill(old["pid"], signal.SIGKILL)
            r = await asyncio.wait_for(cell, 60)
            assert r.status is Status.KILLED, r
            assert "sandbox actor" in r.detail and "died" in r.detail
            assert not running.alive
            later = await idle.run("print(x)")
            assert later.status is Status.KILLED and "died" in later.detail
            assert not idle.alive

            async with await pool.session() as fresh:
                assert (await fresh.run("print('fresh')")).stdout == "fresh\n"
            new = (await pool.stats())["actors"][0]
            assert new["alive"] and new["pid"] != old["pid"]
            assert pool._slots[0].info["url"] != old_url
            assert (await pool.stats())["actors_replaced"] == (1 if max_restarts == 0 else 0)
            assert await idle.restore() == 1 and (await idle.run("print(x)")).stdout == "1\n"
            await running.close()
            await idle.close()
            return old

    old = asyncio.run(main())
    assert _wait_gone([old["zygote_pid"], *old["session_pids"].values()]) == []
