"""Sandbox sessions over HTTP: a server that wraps one local `Sandbox`, and a client for it.

`tirl sandbox serve` runs `serve`: an aiohttp server in front of one `tirl.sandbox.local.Sandbox`
(one zygote on that machine). Its JSON API:

    POST   /v1/sessions               -> {"id": ...}            open a session
    POST   /v1/sessions/{id}/run      {"code": str, "timeout_s": float | null}
                                      -> ExecResult.to_dict()   header X-Tirl-Session-Alive: 1|0
    POST   /v1/sessions/{id}/fork     -> {"id": ...}            copy-on-write branch
    DELETE /v1/sessions/{id}          -> {"id": ..., "closed": true}
    POST   /v1/run                    {"code", "timeout_s"} -> ExecResult.to_dict()  (stateless)
    GET    /v1/channel                WebSocket carrying the calls above for many sessions at once
                                      (tirl.sandbox.channel); its sessions are its own
    GET    /health                    -> status, live sessions, pool, uptime, limits
    GET    /metrics                   -> Prometheus text format

Errors are JSON `{"error": "..."}`: 400 for a malformed request (the message names the field),
404 for an unknown session, 409 when a session cannot be forked, 503 when the sandbox cannot
open a session. A per-call `timeout_s` is capped at the server's `max_timeout_s`. Sessions
idle for `idle_ttl_s` are closed, so a client that crashed does not leak processes.

Opening a session takes one from a pool of sessions forked ahead of time (`--pool-size`,
refilled in the background) when one is ready, else forks one; the fork rate of a machine is
what bounds a burst of opens larger than the pool (docs/benchmarks/history.md, "The sandbox as a service").

`HTTPSandbox` is the client (a `SandboxClient`). Given several server URLs (one per node), it
opens each new session on the server with the fewest live sessions of this client and sends
every later call on that session to the same server, on one channel per server (or one HTTP
request per call with `channel=False`). A session whose server stops answering returns
Status.KILLED and is not alive; `restore()` replays its history on a server that answers.

Security: anyone who can use the server can run code as the user that runs it. With an API key
(`api_key`; `tirl sandbox serve` reads `$TIRL_API_KEY`, or the variable `--api-key-env` names)
every route but `/health` needs `Authorization: Bearer <key>` and answers 401 without it, and
`/health` without the key says only its status (`tirl.httpauth`). Without a key the server
refuses to bind anything but loopback unless told `insecure_no_auth`. `HTTPSandbox` sends
`api_key`, or `$TIRL_API_KEY` when set. There is no TLS: off one machine, put a TLS proxy in
front, or the key crosses the network in clear text.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from tirl.httpauth import (
    auth_middleware,
    bearer,
    bind_refusal,
    client_key,
    is_loopback,
    redact_health,
    stop_signals,
    wait_idle,
)
from tirl.sandbox.api import SandboxClient, SandboxError, SessionBase
from tirl.sandbox.channel import (
    ALIVE_HEADER,
    CHANNEL_PATH,
    MAX_REQUEST_BYTES,
    BadRequest,
    Channel,
    Connection,
    Reply,
    RestLink,
    Unreachable,
    cell_fields,
    close_channels,
    result_from_wire,
    result_to_wire,
    serve_channel,
)
from tirl.sandbox.local import Sandbox, Session
from tirl.sandbox.result import ExecResult, Status

DEFAULT_MAX_TIMEOUT_S = 60.0
DEFAULT_IDLE_TTL_S = 600.0
SHUTDOWN_TIMEOUT_S = 5.0  # in-flight requests get this long once the sandbox is closed
CONTROL_TIMEOUT_S = 60.0  # open, fork, health: covers a zygote restart on the server
CLOSE_TIMEOUT_S = 5.0
RUN_MARGIN_S = 10.0  # HTTP timeout of a run = cell timeout + grace + this (kill, reap, network)
DOWN_RETRY_S = 5.0  # a server that failed is not offered new sessions for this long
# The client drops idle keep-alive connections after 15 s and the server after 75 s, so the
# client never sends a request on a connection the server is closing at that very moment.
CLIENT_KEEPALIVE_S = 15.0
SERVER_KEEPALIVE_S = 75.0


# -- server ------------------------------------------------------------------------------------


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@dataclass
class _Entry:
    session: Session
    last_used: float
    owner: object | None = None  # the channel that opened it; None: the REST routes
    busy: int = 0  # requests in flight; the idle reaper leaves busy sessions alone


CLOSE_REASONS = ("client", "idle", "disconnect")  # disconnect: its channel closed


@dataclass
class _Counters:
    created: int = 0
    forks: int = 0
    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))
    cells: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in Status})
    cell_seconds: float = 0.0


class SandboxServer:
    """The HTTP API over one local `Sandbox`. `app()` gives the aiohttp application; `serve`
    runs it. The sandbox is started on startup and closed on shutdown."""

    def __init__(
        self,
        sandbox: Sandbox,
        max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        api_key: str | None = None,
    ) -> None:
        if not max_timeout_s > 0 or not idle_ttl_s > 0:
            raise ValueError("max_timeout_s and idle_ttl_s must be positive")
        self.sandbox = sandbox
        self.api_key = api_key  # None: no authentication (loopback only, see `serve`)
        self.max_timeout_s = max_timeout_s
        self.idle_ttl_s = idle_ttl_s
        self.started_at = time.monotonic()
        self.counters = _Counters()
        self._sessions: dict[str, _Entry] = {}
        self._reaper: asyncio.Task | None = None
        self.channels: set[Any] = set()  # open channels (tirl.sandbox.channel), for shutdown
        self.draining = False  # SIGTERM: new operations are refused, running ones finish
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=MAX_REQUEST_BYTES,
            middlewares=[_json_errors, auth_middleware(self.api_key, _json_error)],
        )
        app.add_routes(
            [
                web.post("/v1/sessions", self.rest, name="open"),
                web.post("/v1/sessions/{id}/run", self.rest, name="run"),
                web.post("/v1/sessions/{id}/fork", self.rest, name="fork"),
                web.delete("/v1/sessions/{id}", self.rest, name="close"),
                web.post("/v1/run", self.rest, name="run_once"),
                web.get(CHANNEL_PATH, self.channel),
                web.get("/health", self.health),
                web.get("/metrics", self.metrics),
            ]
        )
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await self.sandbox.start()
        self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())

    async def _on_shutdown(self, app: web.Application) -> None:
        """After `drain` (`serve` awaits it on SIGTERM): closing the sandbox first makes any
        cell still running return KILLED at once, so the requests waiting on them finish
        before the shutdown timeout."""
        if self._reaper is not None:
            self._reaper.cancel()
        self._sessions.clear()
        await self.sandbox.close()
        await close_channels(self.channels)

    # -- the operations, shared by the REST routes and the channel (tirl.sandbox.channel) ------
    # Each returns (HTTP status, JSON body, whether the session is alive or None). `owner` is
    # the channel a session belongs to (None: the REST routes); a session is found only by its
    # owner, so no client reaches the sessions another channel opened. `operation` runs one,
    # counted, so that a shutdown can let the running ones finish (`drain`).

    async def operation(self, op: Any, *args: Any) -> Reply:
        if self.draining:
            return 503, {"error": "the sandbox server is shutting down"}, None
        self._in_flight += 1
        self._idle.clear()
        try:
            return await op(*args)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new operations and wait until the running ones (cells among them) have
        answered, at most `timeout_s`; True if they all did."""
        self.draining = True
        return await wait_idle(self._idle, timeout_s)

    async def op_open(self, owner: object | None = None) -> Reply:
        try:
            session = await self.sandbox.session()
        except SandboxError as e:
            return 503, {"error": f"could not open a session: {e}"}, None
        self._register(session, owner)
        return 200, {"id": session.id}, None

    async def op_run(self, sid: str, body: Any, owner: object | None = None) -> Reply:
        try:
            code, timeout_s = self._cell_fields(body)
        except BadRequest as e:
            return 400, {"error": str(e)}, None
        entry = self._lookup(sid, owner)  # after reading the body, so the reaper cannot interfere
        if entry is None:
            return self._unknown(sid)
        entry.busy += 1
        try:
            result = await entry.session.run(code, timeout_s)
        finally:
            entry.busy -= 1
            entry.last_used = time.monotonic()
        self._count(result)
        return 200, result_to_wire(result), entry.session.alive

    async def op_fork(self, sid: str, owner: object | None = None) -> Reply:
        entry = self._lookup(sid, owner)
        if entry is None:
            return self._unknown(sid)
        entry.busy += 1
        try:
            child = await entry.session.fork()
        except SandboxError as e:
            return 409, {"error": str(e)}, entry.session.alive
        finally:
            entry.busy -= 1
            entry.last_used = time.monotonic()
        self._register(child, owner)
        self.counters.forks += 1
        return 200, {"id": child.id}, None

    async def op_close(self, sid: str, owner: object | None = None) -> Reply:
        entry = self._sessions.get(sid)
        if entry is None or entry.owner is not owner:
            return self._unknown(sid)
        del self._sessions[sid]
        await entry.session.close()
        self.counters.closed["client"] += 1
        return 200, {"id": sid, "closed": True}, None

    async def op_run_once(self, body: Any) -> Reply:
        try:
            code, timeout_s = self._cell_fields(body)
            result = await self.sandbox.run_once(code, timeout_s)
        except BadRequest as e:
            return 400, {"error": str(e)}, None
        except SandboxError as e:
            return 503, {"error": f"could not open a session: {e}"}, None
        self._count(result)
        return 200, result_to_wire(result), None

    async def drop_owner(self, owner: object) -> None:
        """Close every session of a channel that went away (its client can no longer reach
        them)."""
        mine = [sid for sid, e in self._sessions.items() if e.owner is owner]
        entries = [self._sessions.pop(sid) for sid in mine]
        self.counters.closed["disconnect"] += len(entries)
        await asyncio.gather(*(e.session.close() for e in entries), return_exceptions=True)

    # -- REST handlers ----------------------------------------------------------------------

    async def rest(self, request: web.Request) -> web.Response:
        """Every session route: the op its route is named after (see `app`)."""
        op, sid = request.match_info.route.name, request.match_info.get("id", "")
        if op in ("run", "run_once"):
            try:
                body = await _json_body(request)
            except BadRequest as e:
                return _json_error(400, str(e))
            if op == "run":
                reply = await self.operation(self.op_run, sid, body)
            else:
                reply = await self.operation(self.op_run_once, body)
        elif op == "open":
            reply = await self.operation(self.op_open)
        else:
            call = self.op_fork if op == "fork" else self.op_close
            reply = await self.operation(call, sid)
        status, body, alive = reply
        headers = None if alive is None else {ALIVE_HEADER: "1" if alive else "0"}
        return web.json_response(body, status=status, headers=headers)

    async def channel(self, request: web.Request) -> web.StreamResponse:
        return await serve_channel(self, request)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            redact_health(
                request,
                {
                    "status": "ok",
                    "sessions": len(self._sessions),
                    "uptime_s": round(time.monotonic() - self.started_at, 3),
                    "limits": asdict(self.sandbox.limits),
                    "max_timeout_s": self.max_timeout_s,
                    "idle_ttl_s": self.idle_ttl_s,
                    "preload": list(self.sandbox.preload),
                    "pool_size": self.sandbox.pool_size,
                    "pool_ready": len(self.sandbox._pool),  # forked, waiting for an open
                    "channels": len(self.channels),
                    "pid": os.getpid(),
                },
            )
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self._prometheus_text(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    # -- helpers ----------------------------------------------------------------------------

    def _register(self, session: Session, owner: object | None) -> None:
        self._sessions[session.id] = _Entry(session, time.monotonic(), owner)
        self.counters.created += 1

    def _lookup(self, sid: str, owner: object | None) -> _Entry | None:
        entry = self._sessions.get(sid)
        return entry if entry is not None and entry.owner is owner else None

    def _unknown(self, sid: str) -> Reply:
        message = (
            f"no session {sid!r} on this server: it was closed, closed after"
            f" {self.idle_ttl_s:g} s idle, or never opened here (or by another client)"
        )
        return 404, {"error": message}, None

    def _cell_fields(self, body: Any) -> tuple[str, float]:
        """The `code` and the capped `timeout_s` of a run request's JSON, or BadRequest."""
        return cell_fields(body, self.sandbox.limits.timeout_s, self.max_timeout_s)

    def _count(self, result: ExecResult) -> None:
        self.counters.cells[result.status.value] += 1
        self.counters.cell_seconds += result.duration_s

    async def _reap_idle(self) -> None:
        """Close sessions nobody has used for `idle_ttl_s` (their client crashed or forgot)."""
        interval = max(0.05, min(self.idle_ttl_s / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            deadline = time.monotonic() - self.idle_ttl_s
            for sid, entry in list(self._sessions.items()):
                if entry.busy == 0 and entry.last_used < deadline:
                    del self._sessions[sid]
                    self.counters.closed["idle"] += 1
                    await entry.session.close()

    def _prometheus_text(self) -> str:
        c = self.counters
        families = [  # (name, type, help, {label set or suffix: value})
            ("sessions_created_total", "counter", "Sessions opened, forks included.",
             {"": c.created}),
            ("sessions_closed_total", "counter", "Sessions closed by the client or the idle TTL.",
             {f'{{reason="{r}"}}': n for r, n in c.closed.items()}),
            ("sessions_live", "gauge", "Sessions open now.", {"": len(self._sessions)}),
            ("forks_total", "counter", "Sessions forked.", {"": c.forks}),
            ("cells_total", "counter", "Cells run (one-shot runs included), by status.",
             {f'{{status="{s}"}}': n for s, n in c.cells.items()}),
            ("cell_duration_seconds", "summary", "Wall-clock time of cells.",
             {"_sum": c.cell_seconds, "_count": sum(c.cells.values())}),
            ("uptime_seconds", "gauge", "Seconds since the server started.",
             {"": time.monotonic() - self.started_at}),
        ]  # fmt: skip
        lines = []
        for name, kind, help_, samples in families:
            name = "tirl_sandbox_" + name
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{suffix} {value}" for suffix, value in samples.items()]
        return "\n".join(lines) + "\n"


async def _json_body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request body is not valid JSON ({e})") from None


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own errors (no such route, wrong method, body too large) as JSON too."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        headers = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        message = f"{e.reason}: {request.method} {request.path}"
        if e.status == 413:
            message = f"{e.reason}: the request body exceeds {MAX_REQUEST_BYTES} bytes"
        return _json_error(e.status, message, headers)


def serve(
    sandbox: Sandbox,
    host: str = "127.0.0.1",
    port: int = 8765,
    max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S,
    idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
    api_key: str | None = None,
    insecure_no_auth: bool = False,
) -> None:
    """Serve `sandbox` until SIGTERM or SIGINT, then close it (no process is left behind).
    The first signal drains (running cells finish and are answered, new requests get 503); a
    second one ends the process at once, exit code 128 + its number (the sessions die with
    the zygote, which dies with this process).

    Prints `tirl sandbox: listening on http://HOST:PORT` once connections are accepted (with
    port 0, PORT is the one the OS picked). Raises OSError if it cannot listen (as `tirl
    serve` does, so the command says which --host or --port in one line, exit code 2),
    SandboxError if the sandbox cannot start, and ValueError, before anything starts, for a
    non-loopback `host` without `api_key` unless `insecure_no_auth`."""
    refusal = bind_refusal(host, api_key, insecure_no_auth, "--api-key-env")
    if refusal:
        raise ValueError(refusal)
    server = SandboxServer(sandbox, max_timeout_s, idle_ttl_s, api_key=api_key)
    asyncio.run(_serve(server, host, port))


async def _serve(server: SandboxServer, host: str, port: int) -> None:
    stop = stop_signals(_say)
    runner = web.AppRunner(
        server.app(),
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=SERVER_KEEPALIVE_S,
    )
    try:
        await runner.setup()  # starts the sandbox (on_startup)
        # What is alive now (modules, the app) lives as long as the server: keep it out of the
        # collector's scans, which otherwise walk it on every full collection.
        gc.collect()
        gc.freeze()
        await web.TCPSite(runner, host, port).start()
        bound_port = runner.addresses[0][1]
        url_host = f"[{host}]" if ":" in host else host
        print(f"tirl sandbox: listening on http://{url_host}:{bound_port}", flush=True)
        if not is_loopback(host):
            what = (
                "no API key: anyone who can reach this port can run code as this user here"
                if server.api_key is None
                else "no TLS: the API key and the code cross the network in clear text"
            )
            _say(f"warning: listening on {host} with {what}")
        await stop.wait()
        # Cells already running finish and are answered (a cell is bounded by its timeout and
        # grace); new requests are refused meanwhile. Then the sandbox and channels close.
        limits = server.sandbox.limits
        _say("stopping (finishing the running cells; a second signal stops at once)")
        await server.drain(server.max_timeout_s + limits.grace_s + SHUTDOWN_TIMEOUT_S)
    finally:
        await runner.cleanup()  # stops listening, closes the sandbox (on_shutdown)
        await server.sandbox.close()  # in case startup failed half way


def _say(message: str) -> None:
    print(f"tirl sandbox: {message}", file=sys.stderr, flush=True)


# -- client ------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Server:
    """One server as the client sees it: what it told us at /health and what we opened there."""

    url: str
    timeout_s: float | None = None  # its default cell timeout (None until /health answered)
    grace_s: float = 0.0
    max_timeout_s: float = DEFAULT_MAX_TIMEOUT_S
    down_until: float = 0.0  # monotonic time before which it gets no new sessions
    sessions: set[HTTPSession] = field(default_factory=set)  # alive sessions of this client
    opening: int = 0  # sessions being opened right now
    link: Channel | RestLink = field(init=False)  # how calls reach it

    @property
    def load(self) -> int:
        return len(self.sessions) + self.opening

    def mark_down(self) -> None:
        """It failed: it gets no new sessions for DOWN_RETRY_S."""
        self.down_until = time.monotonic() + DOWN_RETRY_S

    def cell_deadline(self, timeout_s: float | None) -> float:
        """How long a run request may take before the client gives up on the server."""
        cell = self.timeout_s if timeout_s is None else timeout_s
        return min(cell or self.max_timeout_s, self.max_timeout_s) + self.grace_s + RUN_MARGIN_S


def _normalize_url(url: str) -> str:
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"a sandbox server URL looks like http://127.0.0.1:8765, got {url!r}")
    return str(parsed.origin())


class HTTPSandbox(SandboxClient):
    """Sessions on one or more `tirl sandbox serve` servers (one URL per node).

    A new session goes to the server with the fewest live sessions opened by this client (ties:
    round-robin); all its later calls go to that server. Use as `async with HTTPSandbox(url):`.
    """

    def __init__(
        self, urls: str | Sequence[str], *, api_key: str | None = None, channel: bool = True
    ) -> None:
        """`api_key`: sent as `Authorization: Bearer <key>` to every server; default
        `$TIRL_API_KEY` when set. `channel`: carry every call on one WebSocket per server
        (tirl.sandbox.channel: much less CPU per cell on both sides); False sends one HTTP
        request per call, for servers without `/v1/channel`. A channel's sessions end when its
        connection is lost (they return KILLED, and `restore()` rebuilds them)."""
        urls = [urls] if isinstance(urls, str) else list(urls)
        self._headers = bearer(client_key(api_key))
        if not urls:
            raise ValueError("HTTPSandbox needs at least one server URL")
        self.servers = [_Server(_normalize_url(u)) for u in urls]
        for server in self.servers:
            server.link = Channel(server.url, server.mark_down) if channel else RestLink(server.url)
        self._sessions: set[HTTPSession] = set()  # not closed yet; closed with the client
        self._http: aiohttp.ClientSession | None = None
        self._rr = 0

    async def start(self) -> None:
        """Open the HTTP connection pool and ask every server for its limits. Raises
        SandboxError if no server answers."""
        if self._http is not None:
            return
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEPALIVE_S),
            trust_env=False,  # never route through a proxy from the environment
            headers=self._headers,
        )
        errors = await asyncio.gather(*(self._fetch_info(s) for s in self.servers))
        if all(errors):
            await self.close()
            raise SandboxError("no sandbox server answered: " + "; ".join(errors))

    async def close(self) -> None:
        """Close every session this client opened, then the connection pool."""
        sessions = list(self._sessions)
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        await asyncio.gather(*(s.link.close() for s in self.servers), return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def session(self) -> HTTPSession:
        await self.start()
        server, remote_id, conn = await self._open()
        return HTTPSession(self, server, remote_id, conn)

    async def run_once(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """One stateless request to the least loaded server that answers."""
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        await self.start()
        errors = []
        for server in self._candidates():
            start = time.monotonic()
            body = {"code": code, "timeout_s": timeout_s}
            try:
                status, data, _, _ = await self._op(
                    server, "run_once", body=body, timeout_s=server.cell_deadline(timeout_s)
                )
            except Unreachable as e:
                if e.sent:  # the cell may have run: do not run it twice
                    return ExecResult(Status.KILLED, duration_s=_since(start), detail=str(e))
                errors.append(str(e))
                continue
            if status == 503:  # it could not open a session: the cell did not run
                errors.append(f"the sandbox server at {server.url} answered: {_error(data)}")
                continue
            return _to_result(server, status, data, _since(start))
        return ExecResult(Status.KILLED, detail="; ".join(errors))

    async def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "servers": [
                {"url": s.url, "live_sessions": len(s.sessions), "up": s.down_until <= now}
                for s in self.servers
            ]
        }

    # -- internals --------------------------------------------------------------------------

    def _candidates(self, prefer: _Server | None = None) -> list[_Server]:
        """Servers in the order to try: ones that have not failed lately first, fewest live
        sessions first, ties in round-robin order; `prefer` first if it has not failed."""
        self._rr = (self._rr + 1) % len(self.servers)
        rotated = self.servers[self._rr :] + self.servers[: self._rr]
        now = time.monotonic()
        order = sorted(rotated, key=lambda s: (s.down_until > now, s.load))
        if prefer is not None and prefer.down_until <= now:
            order.remove(prefer)
            order.insert(0, prefer)
        return order

    async def _open(self, prefer: _Server | None = None) -> tuple[_Server, str, Connection | None]:
        """Open a session on the first candidate server that can; SandboxError if none can."""
        errors = []
        for server in self._candidates(prefer):
            server.opening += 1
            try:
                if server.timeout_s is None and (error := await self._fetch_info(server)):
                    errors.append(error)
                    continue
                status, data, _, conn = await self._op(server, "open")
            except Unreachable as e:
                errors.append(str(e))
                continue
            finally:
                server.opening -= 1
            if status == 200:
                return server, data["id"], conn
            errors.append(f"the sandbox server at {server.url} answered {status}: {_error(data)}")
        raise SandboxError("could not open a sandbox session: " + "; ".join(errors))

    async def _fetch_info(self, server: _Server) -> str:
        """Learn the server's limits from /health; returns an error message, or "" if fine."""
        if self._http is None:
            return "the HTTPSandbox client is closed"
        try:
            status, data = await RestLink(server.url).get(self._http, "/health", CONTROL_TIMEOUT_S)
            server.down_until = 0.0
            if status != 200:
                return f"the sandbox server at {server.url} answered {status}: {_error(data)}"
            server.timeout_s = float(data["limits"]["timeout_s"])
            server.grace_s = float(data["limits"]["grace_s"])
            server.max_timeout_s = float(data["max_timeout_s"])
        except Unreachable as e:
            server.mark_down()
            return str(e)
        except (KeyError, TypeError, ValueError):
            if set(data) == {"status"}:  # what /health says to a request without the key
                return (
                    f"the sandbox server at {server.url} wants an API key, and this client"
                    " sent none or a wrong one (set $TIRL_API_KEY or pass api_key=)"
                )
            return f"{server.url} does not look like a tirl sandbox server (bad /health)"
        return ""

    async def _op(
        self,
        server: _Server,
        op: str,
        sid: str | None = None,
        body: dict[str, Any] | None = None,
        timeout_s: float = CONTROL_TIMEOUT_S,
        conn: Connection | None = None,
    ) -> tuple[int, dict[str, Any], bool | None, Connection | None]:
        """One call (an op of tirl.sandbox.channel) on the server's link: (status, JSON body,
        session alive or None, the channel connection or None). Raises Unreachable, and marks
        the server down when it failed."""
        if self._http is None:
            raise Unreachable("the HTTPSandbox client is closed", sent=False)
        msg: dict[str, Any] = {"op": op}
        if sid is not None:
            msg["session"] = sid
        if body is not None:
            msg.update(body)
        try:
            reply = await server.link.request(self._http, msg, timeout_s, conn)
        except Unreachable as e:
            if e.server_down:
                server.mark_down()
            raise
        server.down_until = 0.0
        return reply


def _error(data: dict[str, Any]) -> str:
    return str(data.get("error") or data)


def _since(start: float) -> float:
    return time.monotonic() - start


def _to_result(server: _Server, status: int, data: dict[str, Any], duration: float) -> ExecResult:
    """The ExecResult in a run response; KILLED with the reason when there is none. The
    duration is the caller's (round trip included), as `ExecResult` documents."""
    if status == 200:
        try:
            return result_from_wire(data, duration)
        except (KeyError, TypeError, ValueError):
            pass
    detail = f"the sandbox server at {server.url} answered {status}: {_error(data)}"
    return ExecResult(Status.KILLED, duration_s=duration, detail=detail)


class HTTPSession(SessionBase):
    """A session on one server. `id` stays the same for the life of this object, even when
    `restore()` rebuilds it as `remote_id` on another server (`url`)."""

    def __init__(
        self, client: HTTPSandbox, server: _Server, remote_id: str, conn: Connection | None
    ) -> None:
        self.id = remote_id
        self.remote_id = remote_id
        self.history: list[str] = []
        self._client = client
        self._server = server
        self._conn = conn  # the channel connection it was opened on (None: REST)
        self._lost: str | None = None  # why the client gave up on the server session
        self._remote_alive = True  # what the server said after the last run
        self._closed = False
        server.sessions.add(self)
        client._sessions.add(self)

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def alive(self) -> bool:
        return not self._closed and self._lost is None and self._remote_alive

    async def _execute(self, code: str, timeout_s: float | None) -> ExecResult:
        if self._closed:
            return ExecResult(Status.KILLED, detail="the session was closed")
        if self._lost is not None:
            return ExecResult(Status.KILLED, detail=self._lost)
        # A session the server reported dead still goes to the server: it answers KILLED at
        # once with the reason it died, exactly as a local session does.
        start = time.monotonic()
        server = self._server
        body = {"code": code, "timeout_s": timeout_s}
        try:
            status, data, alive, _ = await self._client._op(
                server, "run", self.remote_id, body, server.cell_deadline(timeout_s), self._conn
            )
        except Unreachable as e:
            self._lose(str(e))
            return ExecResult(Status.KILLED, duration_s=_since(start), detail=str(e))
        result = _to_result(server, status, data, _since(start))
        if status != 200:
            self._lose(result.detail)
        elif alive is False:
            self._remote_alive = False
            server.sessions.discard(self)
        return result

    async def _branch(self) -> HTTPSession:
        server = self._server
        try:
            status, data, alive, _ = await self._client._op(
                server, "fork", self.remote_id, conn=self._conn
            )
        except Unreachable as e:
            self._lose(str(e))
            raise
        if status == 200:
            return HTTPSession(self._client, server, data["id"], self._conn)
        if status == 404:
            self._lose(f"the sandbox server at {server.url} no longer has this session")
        elif alive is False:
            self._remote_alive = False
            server.sessions.discard(self)
        raise SandboxError(f"session {self.id} could not be forked: {_error(data)}")

    async def _replace(self) -> None:
        """Open a fresh server session, on the same server if it has not failed lately."""
        await self._delete_remote()
        try:
            self._server, self.remote_id, self._conn = await self._client._open(prefer=self._server)
        except SandboxError as e:
            self._lost = f"it could not be restored: {e}"
            raise
        self._lost, self._remote_alive, self._closed = None, True, False
        self._server.sessions.add(self)
        self._client._sessions.add(self)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client._sessions.discard(self)
        await self._delete_remote()

    def _lose(self, reason: str) -> None:
        """Give up on the server session (its server is gone or no longer knows it)."""
        if self._lost is None:
            self._lost = reason
        self._server.sessions.discard(self)

    async def _delete_remote(self) -> None:
        """Best effort: a server that does not answer closes the session after its idle TTL."""
        self._server.sessions.discard(self)
        if self._lost is not None:
            return
        self._lost = "the session was closed"
        try:
            await self._client._op(
                self._server, "close", self.remote_id, None, CLOSE_TIMEOUT_S, self._conn
            )
        except Unreachable:
            pass
