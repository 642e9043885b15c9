"""The session channel (tirl.sandbox.channel) against a real `tirl sandbox serve` on 127.0.0.1.

Raw WebSocket frames check the protocol (one reply per request, matched by id; state kept per
session; a bad frame answered alone, the channel and its other sessions untouched; sessions
reachable only from the channel that opened them), and `HTTPSandbox` checks what a lost
connection does to its sessions. The wire helpers are checked against `ExecResult.to_dict` and
`from_dict`, which they replace on the hot path. Authentication of the channel is in
tests/test_auth.py; the transport contract runs over the channel in tests/test_sandbox_http.py.
No assertion depends on wall-clock speed.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp
import pytest
from test_sandbox_http import NO_HANG_S, _health, _metrics, running_server

from tirl.sandbox import Status
from tirl.sandbox.channel import result_from_wire, result_to_wire
from tirl.sandbox.http import HTTPSandbox
from tirl.sandbox.result import ExecResult


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("channel")) as s:
        yield s


class Raw:
    """A bare channel: send frames, collect replies by id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0

    async def send(self, op: str, **fields) -> int:
        self.next_id += 1
        await self.ws.send_str(json.dumps({"id": self.next_id, "op": op, **fields}))
        return self.next_id

    async def replies(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            msg = await asyncio.wait_for(self.ws.receive(), NO_HANG_S)
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            out.append(json.loads(msg.data))
        return out

    async def ask(self, op: str, **fields) -> dict:
        rid = await self.send(op, **fields)
        (reply,) = await self.replies(1)
        assert reply["id"] == rid
        return reply


async def _channels(url: str, n: int, body):
    async with aiohttp.ClientSession(trust_env=False) as http:
        sockets = [await http.ws_connect(url + "/v1/channel") for _ in range(n)]
        try:
            return await body(http, *(Raw(ws) for ws in sockets))
        finally:
            for ws in sockets:
                await ws.close()


def test_one_channel_carries_many_sessions_each_with_its_own_state(server):
    async def body(http, ch):
        a = (await ch.ask("open"))["body"]["id"]
        b = (await ch.ask("open"))["body"]["id"]
        ids = {
            await ch.send("run", session=a, code="x = 1\nimport time; time.sleep(1.0)"),
            await ch.send("run", session=b, code="x = 2"),
        }
        first, second = await ch.replies(2)
        assert {first["id"], second["id"]} == ids
        assert first["id"] == max(ids)  # b's short cell answered before a's: no head of line
        for reply in (first, second):
            assert (reply["status"], reply["body"]["status"], reply["alive"]) == (200, "ok", True)
        assert (await ch.ask("run", session=a, code="x"))["body"]["stdout"] == "1\n"
        assert (await ch.ask("run", session=b, code="x"))["body"]["stdout"] == "2\n"
        c = (await ch.ask("fork", session=a))["body"]["id"]
        assert (await ch.ask("run", session=c, code="x += 10\nx"))["body"]["stdout"] == "11\n"
        assert (await ch.ask("run", session=a, code="x"))["body"]["stdout"] == "1\n"
        once = await ch.ask("run_once", code="print(6 * 7)")
        assert (once["status"], once["body"]["stdout"]) == (200, "42\n")
        for sid in (a, b, c):
            assert (await ch.ask("close", session=sid))["body"] == {"id": sid, "closed": True}
        gone = await ch.ask("run", session=a, code="x")
        assert gone["status"] == 404 and "no session" in gone["body"]["error"]

    asyncio.run(_channels(server.url, 1, body))


def test_a_bad_frame_gets_an_error_of_its_own_and_the_channel_goes_on(server):
    async def body(http, ch):
        sid = (await ch.ask("open"))["body"]["id"]
        await ch.ask("run", session=sid, code="kept = 5")
        bad = [
            ("not json", None, ["not valid JSON"]),
            ("[1, 2]", None, ["JSON object", "'id'"]),
            ('{"op": "run"}', None, ["missing field 'id'"]),
            ('{"id": true, "op": "open"}', None, ["missing field 'id'"]),
            ('{"id": "e1", "op": "explode"}', "e1", ["'op'", "explode", "run_once"]),
            ('{"id": "e2", "op": "run"}', "e2", ["'session'"]),
            (f'{{"id": "e3", "op": "run", "session": "{sid}", "code": 42}}', "e3", ["'code'"]),
            (
                f'{{"id": "e4", "op": "run", "session": "{sid}", "code": "1", "timeout_s": -1}}',
                "e4",
                ["'timeout_s'", "positive"],
            ),
        ]
        for text, _, _ in bad:
            await ch.ws.send_str(text)
        await ch.ws.send_bytes(b"\x00\x01")
        replies = await ch.replies(len(bad) + 1)
        expected = [(rid, words) for _, rid, words in bad] + [(None, ["binary", "JSON text"])]
        for reply in replies:
            assert reply["status"] == 400 and "alive" not in reply, reply
            # replies come in the order they finish: match each to an expectation left
            match = next(
                (rid, words)
                for rid, words in expected
                if rid == reply["id"] and all(w in reply["body"]["error"] for w in words)
            )
            expected.remove(match)
        assert expected == []
        # the session and the channel are untouched
        assert (await ch.ask("run", session=sid, code="kept"))["body"]["stdout"] == "5\n"
        await ch.ask("close", session=sid)

    asyncio.run(_channels(server.url, 1, body))
    assert asyncio.run(_health(server.url))["status"] == "ok"


def test_sessions_are_reachable_only_from_the_channel_that_opened_them(server):
    async def body(http, mine, other):
        sid = (await mine.ask("open"))["body"]["id"]
        await mine.ask("run", session=sid, code="secret = 1")
        for op, fields in [("run", {"code": "secret"}), ("fork", {}), ("close", {})]:
            reply = await other.ask(op, session=sid, **fields)
            assert reply["status"] == 404 and "no session" in reply["body"]["error"], reply
        async with http.post(f"{server.url}/v1/sessions/{sid}/run", json={"code": "1"}) as r:
            assert r.status == 404
        async with http.delete(f"{server.url}/v1/sessions/{sid}") as r:
            assert r.status == 404
        async with http.post(f"{server.url}/v1/sessions") as r:  # and the other way round
            rest_sid = (await r.json())["id"]
        assert (await mine.ask("run", session=rest_sid, code="1"))["status"] == 404
        async with http.delete(f"{server.url}/v1/sessions/{rest_sid}") as r:
            assert r.status == 200
        assert (await mine.ask("run", session=sid, code="secret"))["body"]["stdout"] == "1\n"

    asyncio.run(_channels(server.url, 2, body))


def test_a_lost_channel_closes_its_sessions_and_restore_rebuilds_them(server):
    async def main():
        async with HTTPSandbox(server.url) as client:
            s = await client.session()
            assert (await s.run("v = 3")).ok
            closed_before = (await _metrics(server.url))[
                'tirl_sandbox_sessions_closed_total{reason="disconnect"}'
            ]
            await s._conn.ws.close()  # the connection drops under the client
            r = await s.run("v")
            assert r.status is Status.KILLED and "lost the channel" in r.detail, r
            assert not s.alive
            deadline = asyncio.get_running_loop().time() + NO_HANG_S
            key = 'tirl_sandbox_sessions_closed_total{reason="disconnect"}'
            while (await _metrics(server.url))[key] == closed_before:
                assert asyncio.get_running_loop().time() < deadline, "not closed on the server"
                await asyncio.sleep(0.05)
            assert await s.restore() == 1  # on a new connection
            assert (await s.run("v")).stdout == "3\n"

    asyncio.run(main())


def test_the_rest_client_still_works_without_the_channel(server):
    async def main():
        async with HTTPSandbox(server.url, channel=False) as client:
            async with await client.session() as s:
                await s.run("n = 4")
                branch = await s.fork()
                await branch.run("n += 1")
                assert [(await x.run("n")).stdout for x in (s, branch)] == ["4\n", "5\n"]
                await branch.close()
                health = await _health(server.url)
            assert (await client.run_once("print('once')")).stdout == "once\n"
        return health

    assert asyncio.run(main())["channels"] == 0


@pytest.mark.parametrize(
    "result",
    [
        ExecResult(Status.OK, stdout="2\n", duration_s=0.25, peak_memory_mb=21.5),
        ExecResult(
            Status.ERROR,
            stderr="warn\n",
            traceback='  File "<cell 1>"\nZeroDivisionError: division by zero',
        ),
        ExecResult(
            Status.TIMEOUT,
            timeout_s=2.0,
            stdout="a…[9 chars truncated]…z",
            stdout_truncated=True,
            detail="the cell ignored the interrupt",
        ),  # fmt: skip
        ExecResult(Status.MEMORY, detail="the memory limit of 512 MB was exceeded"),
        ExecResult(Status.KILLED, stderr_truncated=True, stdout="ünïcødé ✓"),
    ],
    ids=lambda r: r.status.value,
)
def test_the_wire_helpers_equal_to_dict_and_from_dict(result):
    wire = result_to_wire(result)
    assert wire == result.to_dict()
    sent = json.loads(json.dumps({**wire, "alive": True}))  # what a reply carries
    assert result_from_wire(sent, 1.5) == replace(ExecResult.from_dict(sent), duration_s=1.5)
    assert result_from_wire(sent, result.duration_s) == result
