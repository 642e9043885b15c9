"""The socket data path of `tirl.sandbox.ray_pool`: cells travel to a sandbox actor over a
WebSocket, not as Ray calls.

Why. A Ray actor call costs about 1.6 ms round trip on an idle machine, more than the 1 ms a
cell may add over the in-process API, while the channel of `tirl sandbox serve`
(tirl.sandbox.channel) adds about 0.3 ms (docs/benchmarks/history.md, "Where the Ray pool's per-cell time
goes"). So each `SandboxActor` serves that channel's endpoint (`GET /v1/channel`) on its node,
and the pool sends its cells (`run`, `run_once`) over it. Ray keeps what it is good at:
placement, restarts, node failures, and the rare control calls (ready, create, fork, close,
stats, shutdown), which start or end processes and cost a fork anyway.

The actor's end. `ActorEndpoint` is a `ChannelServer` over the actor's sessions: it answers the
channel's `run` and `run_once` ops, with the same request checks as `tirl sandbox serve` (a
malformed request gets 400 for itself alone). `open`, `fork` and `close` get 400: they go
through Ray, so a session's id is made by the caller and survives `restore()`. Sessions belong
to the pool, not to a connection: a connection that closes (the caller's event loop ended)
leaves them running, so a pool works from one event loop after another, as over Ray.
The endpoint binds the node's address as Ray knows it (127.0.0.1 on `init_local_ray`'s
cluster), or the pool's `endpoint_host`, on a port the OS picks, and wants a bearer key
(tirl.httpauth) made at random for each actor process; `ready()` hands the address and the key
to the pool over Ray.

The caller's end. `ActorSocket`, one per actor process and event loop: an aiohttp client session
and the HTTP client's `Channel`. It closes itself when its event loop shuts down (asyncio.run
cancels its tasks at the end).

Limits. No TLS, as for `tirl sandbox serve`: on a cluster of several nodes the cells, their
output and the key cross the network in clear text (anyone who can call the actor through Ray
can run code there anyway). Both ends ping an idle connection (channel.HEARTBEAT_S), so a
caller whose event loop is blocked for more than half of it loses the connection: the next call
connects again, but a cell that was waiting for its reply then counts as lost (its session is
closed and returns KILLED). What the pool does when a socket fails is in
`tirl.sandbox.ray_pool` ("Failures").
"""

from __future__ import annotations

import asyncio
import math
import secrets
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from tirl.httpauth import auth_middleware, bearer
from tirl.sandbox.channel import (
    CHANNEL_PATH,
    MAX_REQUEST_BYTES,
    BadRequest,
    Channel,
    Reply,
    ServerChannel,
    Unreachable,
    cell_fields,
    close_channels,
    serve_channel,
)

CONTROL_OPS = "open, fork and close go through the actor's Ray methods; this socket carries cells"


class CellRunner(Protocol):
    """What the endpoint needs from the actor (tirl.sandbox.ray_pool.SandboxActor)."""

    async def run(self, sid: str, code: str, timeout_s: float | None) -> dict[str, Any]: ...
    async def run_once(self, code: str, timeout_s: float | None) -> dict[str, Any]: ...


class ActorEndpoint:
    """The channel endpoint of one sandbox actor (a `ChannelServer`, see the module docstring)."""

    def __init__(self, runner: CellRunner, default_timeout_s: float) -> None:
        self.runner = runner
        self.default_timeout_s = default_timeout_s
        self.key = secrets.token_urlsafe(32)
        self.channels: set[ServerChannel] = set()
        self.requests = 0  # requests answered (bad ones included)
        self.url: str | None = None
        self._web: web.AppRunner | None = None

    async def start(self, host: str) -> str:
        """Listen on `host`, port chosen by the OS; returns the URL."""
        app = web.Application(
            client_max_size=MAX_REQUEST_BYTES,
            middlewares=[auth_middleware(self.key, _json_error)],
        )
        app.add_routes([web.get(CHANNEL_PATH, self._channel)])
        self._web = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._web.setup()
        await web.TCPSite(self._web, host, 0).start()
        port = self._web.addresses[0][1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.url

    async def close(self) -> None:
        await close_channels(self.channels)
        if self._web is not None:
            await self._web.cleanup()

    async def _channel(self, request: web.Request) -> web.StreamResponse:
        return await serve_channel(self, request)

    # -- ChannelServer ----------------------------------------------------------------------

    async def operation(self, op: Any, *args: Any) -> Reply:
        self.requests += 1
        return await op(*args)

    async def op_run(self, sid: str, body: Any, owner: object | None = None) -> Reply:
        code, timeout_s = cell_fields(body, self.default_timeout_s, math.inf)
        d = await self.runner.run(sid, code, timeout_s)
        alive = d.pop("alive")
        return 200, d, alive

    async def op_run_once(self, body: Any) -> Reply:
        code, timeout_s = cell_fields(body, self.default_timeout_s, math.inf)
        return 200, await self.runner.run_once(code, timeout_s), None

    async def op_open(self, owner: object | None = None) -> Reply:
        raise BadRequest(CONTROL_OPS)

    async def op_fork(self, sid: str, owner: object | None = None) -> Reply:
        raise BadRequest(CONTROL_OPS)

    async def op_close(self, sid: str, owner: object | None = None) -> Reply:
        raise BadRequest(CONTROL_OPS)

    async def drop_owner(self, owner: object) -> None:
        """Nothing to drop: the sessions belong to the pool, not to one connection."""


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class ActorSocket:
    """The caller's end of one actor's endpoint, in the event loop that made it."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.loop = asyncio.get_running_loop()
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            trust_env=False,  # never route through a proxy from the environment
            headers=bearer(key),
        )
        self.channel = Channel(url, on_lost=lambda: None)  # the pool asks Ray what happened
        self._keeper = self.loop.create_task(self._close_with_loop())

    async def request(self, msg: dict[str, Any], timeout_s: float) -> tuple[int, dict, bool | None]:
        """(status, body, alive) of one request within `timeout_s`, connecting first if need be;
        raises `channel.Unreachable`."""
        if self.channel.connected:
            status, body, alive, _ = await self.channel.request(self.http, msg, timeout_s)
            return status, body, alive
        try:  # the connection's own bound is fixed (a stopped actor accepts, then never answers)
            return await asyncio.wait_for(self._connect_and_request(msg, timeout_s), timeout_s)
        except asyncio.TimeoutError:
            what = f"did not accept a connection and answer within {timeout_s:g} s"
            raise Unreachable(
                f"the sandbox actor at {self.url} {what}", True, timed_out=True
            ) from None

    async def _connect_and_request(self, msg: dict[str, Any], timeout_s: float) -> Any:
        status, body, alive, _ = await self.channel.request(self.http, msg, timeout_s)
        return status, body, alive

    async def close(self) -> None:
        self._keeper.cancel()
        await asyncio.gather(self._keeper, return_exceptions=True)

    async def _close_with_loop(self) -> None:
        try:
            await self.loop.create_future()  # until cancelled: by close(), or at loop shutdown
        finally:
            try:
                await self.channel.close()
            finally:
                await self.http.close()
