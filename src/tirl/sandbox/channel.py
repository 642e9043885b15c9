"""The session channel: one WebSocket per client and server that carries the calls of many
sessions at once (`GET /v1/channel` on `tirl sandbox serve`; `HTTPSandbox` uses it by default).

Why. One HTTP request per cell costs more CPU than a small cell itself: the request line and
headers, a connection from the pool, a response object on each side. A rollout of 1,000 sessions
sends thousands of cells a second, and on a 2-core machine that overhead halved the cells it
could run. On the channel a cell is one small JSON frame each way on a connection that stays
open, and the replies of many sessions come back on it in the order they finish.

Protocol. Text frames, one JSON object each. A request names an `op`, carries an `id` of the
client's choosing (a number or string) and the fields of the REST route it stands for:

    {"id": 1, "op": "open"}                                          POST   /v1/sessions
    {"id": 2, "op": "run", "session": "ab12", "code": "1 + 1", "timeout_s": null}
                                                                     POST   /v1/sessions/ab12/run
    {"id": 3, "op": "fork", "session": "ab12"}                       POST   /v1/sessions/ab12/fork
    {"id": 4, "op": "close", "session": "ab12"}                      DELETE /v1/sessions/ab12
    {"id": 5, "op": "run_once", "code": "print(1)"}                  POST   /v1/run

Every request gets exactly one reply, `{"id": ..., "status": ..., "body": ..., "alive": ...}`:
`status` and `body` are the HTTP status and JSON body the REST route answers (200; 400 for a
malformed request, naming the field; 404 for an unknown session; 409; 503), and `alive` (run
and fork only) is what the REST route's X-Tirl-Session-Alive header says. Requests run
concurrently; replies come in the order they finish. A frame that is not a JSON object with an
`id` gets `"id": null` and 400; a bad request never closes the channel or touches the other
sessions on it. An unexpected failure answers that request with 500.

Ownership. Sessions opened (or forked) on a channel belong to it: other channels and the REST
routes get 404 for them, and the server closes them when the channel closes, for whatever
reason (the client closed it, or the connection was lost; then `restore()` rebuilds them on a
new channel). The server's idle TTL applies to them as to any session.

Limits. Frames up to MAX_FRAME_BYTES are read; a request over the REST body limit gets 413.
A frame larger than MAX_FRAME_BYTES closes the channel (aiohttp refuses to read it). Both ends
ping an idle channel every HEARTBEAT_S and drop it when the pong does not come, so a client or
server that vanished without closing its connection does not hold sessions forever.
Authentication is the server's (tirl.httpauth): the upgrade request carries the bearer key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from tirl.sandbox.api import SandboxError
from tirl.sandbox.result import ExecResult, Status

CHANNEL_PATH = "/v1/channel"
ALIVE_HEADER = "X-Tirl-Session-Alive"  # the REST routes' "alive" (run and fork)
CONNECT_TIMEOUT_S = 5.0
# The REST route of each op (the op's name is the route's name on the server).
REST_ROUTES = {
    "open": ("POST", "/v1/sessions"),
    "run": ("POST", "/v1/sessions/{}/run"),
    "fork": ("POST", "/v1/sessions/{}/fork"),
    "close": ("DELETE", "/v1/sessions/{}"),
    "run_once": ("POST", "/v1/run"),
}
MAX_REQUEST_BYTES = 16 << 20  # as the REST routes' body limit (tirl.sandbox.http)
MAX_FRAME_BYTES = 4 * MAX_REQUEST_BYTES  # above this aiohttp closes the channel
HEARTBEAT_S = 30.0  # ping an idle channel this often; no pong within half of it: dropped
SHUTDOWN_DRAIN_S = 2.0  # replies of cells the shutdown ended get this long to go out
CLOSE_TIMEOUT_S = 5.0
OPS = ("open", "run", "fork", "close", "run_once")

Reply = tuple[int, dict[str, Any], "bool | None"]


# -- requests and results on the wire (the channel, the REST routes and Ray) --------------------


class BadRequest(Exception):
    """A malformed request; the message says which field is wrong and what was expected."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def cell_fields(body: Any, default_timeout_s: float, max_timeout_s: float) -> tuple[str, float]:
    """The `code` and `timeout_s` (default when null, capped at `max_timeout_s`) of a run
    request's JSON object; BadRequest naming the field when they are not what they must be."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with a 'code' field")
    if "code" not in body:
        raise BadRequest("missing field 'code' (the Python source to run, a string)")
    code = body["code"]
    if not isinstance(code, str):
        raise BadRequest(f"field 'code' must be a string, got {_json_type(code)}")
    timeout_s = body.get("timeout_s")
    if timeout_s is None:
        timeout_s = default_timeout_s
    elif (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise BadRequest(
            "field 'timeout_s' must be a positive number of seconds or null,"
            f" got {json.dumps(timeout_s)}"
        )
    return code, min(float(timeout_s), max_timeout_s)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ExecResult))


def result_to_wire(result: ExecResult) -> dict[str, Any]:
    """`result.to_dict()` without the deep copy of `dataclasses.asdict`, which cost more than
    the rest of the server's work on a small cell (every field is a plain value)."""
    d = {name: getattr(result, name) for name in _RESULT_FIELDS}
    d["status"] = result.status.value
    return d


def result_from_wire(d: dict[str, Any], duration_s: float) -> ExecResult:
    """`replace(ExecResult.from_dict(d), duration_s=duration_s)` in one step (the duration is
    the caller's: round trip included)."""
    kwargs = {name: d[name] for name in _RESULT_FIELDS if name in d}
    kwargs["status"] = Status(d["status"])
    kwargs["duration_s"] = duration_s
    return ExecResult(**kwargs)


# -- the server's end --------------------------------------------------------------------------


class ChannelServer(Protocol):
    """What `serve_channel` needs from the server (tirl.sandbox.http.SandboxServer)."""

    channels: set[ServerChannel]

    async def operation(self, op: Any, *args: Any) -> Reply: ...
    async def op_open(self, owner: object | None = None) -> Reply: ...
    async def op_run(self, sid: str, body: Any, owner: object | None = None) -> Reply: ...
    async def op_fork(self, sid: str, owner: object | None = None) -> Reply: ...
    async def op_close(self, sid: str, owner: object | None = None) -> Reply: ...
    async def op_run_once(self, body: Any) -> Reply: ...
    async def drop_owner(self, owner: object) -> None: ...


class ServerChannel:
    """One client's channel on the server; the owner of the sessions opened on it."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.tasks: set[asyncio.Task] = set()  # requests being answered

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def send(self, rid: Any, status: int, body: dict[str, Any], alive: bool | None) -> None:
        reply: dict[str, Any] = {"id": rid, "status": status, "body": body}
        if alive is not None:
            reply["alive"] = alive
        if self.ws.closed:
            return  # the client is gone; its sessions are closed with the channel
        try:
            await self.ws.send_str(json.dumps(reply))
        except (ConnectionError, RuntimeError):
            pass


async def serve_channel(server: ChannelServer, request: web.Request) -> web.WebSocketResponse:
    """The `GET /v1/channel` handler: answer requests until the channel closes, then close the
    sessions opened on it."""
    ws = web.WebSocketResponse(compress=False, max_msg_size=MAX_FRAME_BYTES, heartbeat=HEARTBEAT_S)
    await ws.prepare(request)
    channel = ServerChannel(ws)
    server.channels.add(channel)
    try:
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.TEXT:
                channel.spawn(_answer(server, channel, msg.data))
            elif msg.type is aiohttp.WSMsgType.BINARY:
                error = "binary frames are not understood: send each request as a JSON text frame"
                await channel.send(None, 400, {"error": error}, None)
    finally:
        server.channels.discard(channel)
        for task in list(channel.tasks):
            task.cancel()
        await server.drop_owner(channel)
    return ws


async def _answer(server: ChannelServer, channel: ServerChannel, text: str) -> None:
    rid = None
    try:
        msg = _parse(text)
        rid = msg["id"]
        if len(text) > MAX_REQUEST_BYTES:
            raise BadRequest(f"the request exceeds {MAX_REQUEST_BYTES} bytes", 413)
        op = msg.get("op")
        if op == "run":
            reply = await server.operation(server.op_run, _session_field(msg), msg, channel)
        elif op == "open":
            reply = await server.operation(server.op_open, channel)
        elif op == "close":
            reply = await server.operation(server.op_close, _session_field(msg), channel)
        elif op == "fork":
            reply = await server.operation(server.op_fork, _session_field(msg), channel)
        elif op == "run_once":
            reply = await server.operation(server.op_run_once, msg)
        else:
            raise BadRequest(f"field 'op' must be one of {', '.join(OPS)}; got {json.dumps(op)}")
    except BadRequest as e:
        reply = (e.status, {"error": str(e)}, None)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug answers this request alone; the channel goes on
        traceback.print_exc(file=sys.stderr)
        reply = (
            500,
            {"error": f"the server failed on this request: {type(e).__name__}: {e}"},
            None,
        )
    await channel.send(rid, *reply)


def _parse(text: str) -> dict[str, Any]:
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise BadRequest(f"the message is not valid JSON ({e})") from None
    if not isinstance(msg, dict):
        raise BadRequest("a message must be a JSON object with the fields 'id' and 'op'")
    rid = msg.get("id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        raise BadRequest("missing field 'id' (a number or string that the reply carries back)")
    return msg


def _session_field(msg: dict[str, Any]) -> str:
    sid = msg.get("session")
    if not isinstance(sid, str):
        raise BadRequest(f"op {msg['op']!r} needs the field 'session' (a session id, a string)")
    return sid


async def close_channels(channels: set[ServerChannel]) -> None:
    """At shutdown, after the sandbox was closed (every running cell then returns KILLED): let
    those replies go out, then close each channel with 1001 (going away)."""
    channels = set(channels)
    pending = [t for c in channels for t in c.tasks]
    if pending:
        await asyncio.wait(pending, timeout=SHUTDOWN_DRAIN_S)
    message = b"the sandbox server is shutting down"
    await asyncio.gather(
        *(c.ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=message) for c in channels),
        return_exceptions=True,
    )


# -- the client's end --------------------------------------------------------------------------


class Unreachable(SandboxError):
    """The server did not answer. `sent`: the request may have reached it (and run).
    `server_down`: the server itself failed (else only an old connection to it is gone).
    `timed_out`: no reply in time on a connection that is still open."""

    def __init__(
        self, message: str, sent: bool, server_down: bool = True, timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.sent = sent
        self.server_down = server_down
        self.timed_out = timed_out


class Connection:
    """One WebSocket connection of a `Channel`. Sessions opened on it live as long as it does."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.pending: dict[int, asyncio.Future] = {}  # request id -> reply
        self.next_id = 0
        self.lost: str | None = None  # why it closed
        self.reader: asyncio.Task | None = None


class Channel:
    """The client's end of the channel to one server: connected on first use, and again on
    the first use after the connection was lost. `on_lost` is called when a connection is lost
    (not when `close()` closes it)."""

    def __init__(self, url: str, on_lost: Callable[[], None]) -> None:
        self.url = url
        self.on_lost = on_lost
        self._conn: Connection | None = None
        self._lock: asyncio.Lock | None = None  # made on first use, in the caller's loop
        self._closing = False

    @property
    def connected(self) -> bool:
        """Whether a connection is open (else the next request connects first)."""
        return self._conn is not None and self._conn.lost is None

    async def request(
        self,
        http: aiohttp.ClientSession,
        msg: dict[str, Any],
        timeout_s: float,
        conn: Connection | None = None,
    ) -> tuple[int, dict[str, Any], bool | None, Connection]:
        """Send `msg` (its `id` is set here) and wait for the reply: (status, body, alive, the
        connection used). `conn`: the connection a session was opened on (None: the current
        one, connecting if needed). Raises Unreachable."""
        if conn is None:
            conn = await self._connection(http)
        elif conn.lost is not None:
            raise Unreachable(
                f"{conn.lost}; the server closed the sessions opened on it", False, False
            )
        rid = msg["id"] = conn.next_id
        conn.next_id += 1
        loop = asyncio.get_running_loop()
        reply = loop.create_future()
        conn.pending[rid] = reply
        timer = loop.call_later(timeout_s, _expire, reply)
        try:
            try:
                await conn.ws.send_str(json.dumps(msg))
            except (ConnectionError, RuntimeError) as e:
                raise Unreachable(f"{self._lost_words()} ({e})", sent=False) from None
            answer = await reply
        finally:
            timer.cancel()
            conn.pending.pop(rid, None)
        if answer is None:
            raise Unreachable(
                f"the sandbox server at {self.url} did not answer within {timeout_s:g} s",
                sent=True,
                timed_out=True,
            )
        body = answer.get("body")
        return (
            answer.get("status", 0),
            body if isinstance(body, dict) else {},
            answer.get("alive"),
            conn,
        )

    async def close(self) -> None:
        """Close the connection (the server then closes its sessions); a later request
        connects again."""
        self._closing = True
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                await conn.ws.close()
                if conn.reader is not None:
                    await asyncio.gather(conn.reader, return_exceptions=True)
        finally:
            self._closing = False

    async def _connection(self, http: aiohttp.ClientSession) -> Connection:
        conn = self._conn
        if conn is not None and conn.lost is None:
            return conn
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn is not None and self._conn.lost is None:
                return self._conn
            try:
                ws = await asyncio.wait_for(
                    http.ws_connect(
                        self.url + CHANNEL_PATH,
                        compress=0,
                        max_msg_size=0,  # replies are bounded by the server's output limit
                        heartbeat=HEARTBEAT_S,
                    ),
                    CLOSE_TIMEOUT_S + 5.0,
                )
            except aiohttp.WSServerHandshakeError as e:
                what = (
                    "wants an API key, and this client sent none or a wrong one"
                    if e.status == 401
                    else f"answered {e.status} to {CHANNEL_PATH} (an older tirl there? pass"
                    " channel=False to HTTPSandbox)"
                )
                raise Unreachable(f"the sandbox server at {self.url} {what}", sent=False) from None
            except asyncio.TimeoutError:
                raise Unreachable(
                    f"the sandbox server at {self.url} did not accept a channel in time", False
                ) from None
            except (aiohttp.ClientError, OSError) as e:
                raise Unreachable(
                    f"the sandbox server at {self.url} is unreachable: {e}", sent=False
                ) from None
            conn = self._conn = Connection(ws)
            conn.reader = asyncio.get_running_loop().create_task(self._read(conn))
            return conn

    async def _read(self, conn: Connection) -> None:
        """Hand each reply to the request waiting for it; when the connection ends, fail every
        request still waiting."""
        reason = ""
        try:
            async for msg in conn.ws:
                if msg.type is aiohttp.WSMsgType.TEXT:
                    reply = json.loads(msg.data)
                    waiting = conn.pending.get(reply.get("id"))
                    if waiting is not None and not waiting.done():
                        waiting.set_result(reply)
                elif msg.type is aiohttp.WSMsgType.ERROR:
                    reason = f"{type(msg.data).__name__}: {msg.data}"
        except (ValueError, AttributeError) as e:  # not our protocol: give up on it
            reason = f"a reply that is not a JSON object ({e})"
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
        finally:
            reason = reason or f"closed with code {conn.ws.close_code}"
            conn.lost = f"{self._lost_words()} ({reason})"
            for waiting in conn.pending.values():
                if not waiting.done():
                    waiting.set_exception(Unreachable(conn.lost, sent=True))
            conn.pending.clear()
            if not conn.ws.closed:
                await conn.ws.close()
            if self._conn is conn:
                self._conn = None
            if not self._closing:
                self.on_lost()

    def _lost_words(self) -> str:
        return f"lost the channel to the sandbox server at {self.url}"


class RestLink:
    """The client's other way to a server: one HTTP request per call (`HTTPSandbox(channel=
    False)`, for servers without the channel), with the same `request` as `Channel`."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def request(
        self,
        http: aiohttp.ClientSession,
        msg: dict[str, Any],
        timeout_s: float,
        conn: Connection | None = None,
    ) -> tuple[int, dict[str, Any], bool | None, None]:
        method, path = REST_ROUTES[msg["op"]]
        path = path.format(msg.get("session"))
        body = {k: v for k, v in msg.items() if k not in ("op", "session")} or None
        status, data, alive = await self._send(http, method, path, body, timeout_s)
        return status, data, None if alive is None else alive == "1", None

    async def get(
        self, http: aiohttp.ClientSession, path: str, timeout_s: float
    ) -> tuple[int, dict[str, Any]]:
        status, data, _ = await self._send(http, "GET", path, None, timeout_s)
        return status, data

    async def close(self) -> None:
        """Nothing to close: the requests share the client's connection pool."""

    async def _send(
        self,
        http: aiohttp.ClientSession,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout_s: float,
    ) -> tuple[int, dict[str, Any], str | None]:
        """One request: (HTTP status, JSON body, alive header). Raises Unreachable when the
        server cannot be reached or does not answer in time."""
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with http.request(method, self.url + path, json=body, timeout=timeout) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = {"error": f"not JSON: {(await resp.text())[:200]!r}"}
                alive = resp.headers.get(ALIVE_HEADER)
                return resp.status, data if isinstance(data, dict) else {}, alive
        except asyncio.TimeoutError:
            raise Unreachable(
                f"the sandbox server at {self.url} did not answer within {timeout_s:g} s",
                sent=True,
            ) from None
        except aiohttp.ClientConnectorError as e:
            raise Unreachable(
                f"the sandbox server at {self.url} is unreachable: {e}", sent=False
            ) from None
        except (aiohttp.ClientError, OSError) as e:
            raise Unreachable(
                f"lost the connection to the sandbox server at {self.url}"
                f" ({type(e).__name__}: {e})",
                sent=True,
            ) from None


def _expire(reply: asyncio.Future) -> None:
    if not reply.done():
        reply.set_result(None)
