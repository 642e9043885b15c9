"""Serve a tirl task source as an OpenEnv environment (HTTP + WebSocket, openenv-core 0.3.0).

    python -m tirl.integrations.openenv.server --source '{"source": "races", "max_size": 3}' \\
        --port 8000 [--set max_tool_calls=6 --set sandbox.timeout_s=10 ...]

`--source` is a task-source entry as in a run config's `data.train` (JSON), or just a source's
name; `--set key=value` sets an `OpenEnvSettings` key (dotted for the sandbox section). The
server prints `tirl openenv: listening on http://HOST:PORT` once it accepts connections (with
port 0, the port the OS picked) and runs until SIGINT or SIGTERM, then closes the sandbox.

The server has no authentication, and every client may run code in the sandbox: it listens on
loopback only unless `allow_remote` (`--insecure-allow-remote`) says the network is trusted.
Bad input (an unknown source, a bad setting, openenv missing) is one line and exit code 2,
before anything listens; a bad request is answered with an error and the server goes on
(OpenEnv's WebSocket answers `{"type": "error"}`; an `EpisodeError` over HTTP is a 409).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from tirl.cliargs import bind_host, number
from tirl.config import ConfigError, apply_overrides, from_dict
from tirl.httpauth import is_loopback
from tirl.integrations.openenv import require_openenv
from tirl.integrations.openenv.settings import CLIENT_GONE

LISTENING = "tirl openenv: listening on http://{host}:{port}"


def make_app(entry: Mapping[str, Any], seed: int = 0, settings=None, where: str = "source"):
    """The FastAPI app of OpenEnv's server over the task source `entry` names (checked first:
    a ConfigError naming `where`), with `settings` (`OpenEnvSettings`; None: the defaults)."""
    # Here, not at the top: the command line imports this module for its parser, and the
    # source readers import every built-in source.
    from tirl.tasks.registry import make_source

    source = make_source(entry, where, seed)
    require_openenv()
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import create_fastapi_app

    from tirl.integrations.openenv.env import (
        EpisodeError,
        OpenEnvSettings,
        Shared,
        TirlAction,
        TirlEnvironment,
        TirlObservation,
    )

    settings = OpenEnvSettings() if settings is None else settings
    shared = Shared(source, settings)
    app = create_fastapi_app(
        functools.partial(TirlEnvironment, shared),
        TirlAction,
        TirlObservation,
        max_concurrent_envs=settings.max_sessions,
    )

    async def episode_error(request, exc: EpisodeError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    app.add_exception_handler(EpisodeError, episode_error)
    app.add_middleware(WatchClient)
    app.router.on_shutdown.append(shared.close)
    app.state.tirl = shared
    return app


class WatchClient:
    """ASGI middleware for OpenEnv's WebSocket handler: a client that goes is noticed at once,
    and is not a server error.

    OpenEnv 0.3.0's handler reads the socket only between steps, so a client that disconnects
    mid-step is noticed when the step's answer cannot be sent: the step ran to its end for
    nobody (a cell up to its timeout), holding a session slot, and the failed sends logged
    "Exception in ASGI application" with chained tracebacks (Starlette's WebSocketDisconnect,
    then WebSocketDisconnected from its error reply). Here the client's messages are read as
    they come and handed on in order; a disconnect sets the connection's CLIENT_GONE event, so
    the running step stops and closes its sandbox session (`TirlEnvironment`), and what the
    handler then raises about the closed socket is dropped. A normal close (the client sends
    "close", then hangs up) ends the same quiet way."""

    INBOX = 32  # client messages held ahead of the handler (uvicorn's own default queue)

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette import websockets

        closed_socket = (
            websockets.WebSocketDisconnect,
            getattr(websockets, "WebSocketDisconnected", websockets.WebSocketDisconnect),
        )
        gone, inbox = asyncio.Event(), asyncio.Queue(self.INBOX)

        async def read_client() -> None:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    gone.set()  # before the put, which may wait for room
                await inbox.put(message)
                if gone.is_set():
                    return

        async def next_message():
            message = await inbox.get()
            if message["type"] == "websocket.disconnect":
                inbox.put_nowait(message)  # every later receive sees it too
            return message

        async def send_plainly(message) -> None:
            if message["type"] == "websocket.send" and (message.get("text") or "").startswith(
                '{"type":"error"'
            ):
                message = {**message, "text": plain_error(message["text"])}
            await send(message)

        token = CLIENT_GONE.set(gone)
        reader = asyncio.ensure_future(read_client())
        try:
            await self.app(scope, next_message, send_plainly)
        except closed_socket:
            pass  # the client went; its session is already destroyed (OpenEnv's `finally`)
        finally:
            reader.cancel()
            CLIENT_GONE.reset(token)


def plain_error(text: str) -> str:
    """OpenEnv's error reply `text`, its message made one clear line for the client, and the
    same line on the server's stderr for a refused session or an invalid message: a session
    refused at capacity says how many are open and which setting bounds them (the connection
    closes at once, holding no slot), and OpenEnv's "Invalid message" names each bad field."""
    reply = json.loads(text)
    data = reply.get("data", {})
    code = data.get("code")
    if code == "CAPACITY_REACHED":
        data["message"] = (
            f"the server is at capacity: {data.get('active_sessions')} of"
            f" {data.get('max_sessions')} sessions open (its max_sessions setting); try again"
            " when one closes"
        )
        print(f"tirl openenv: refused a session: {data['message']}", file=sys.stderr, flush=True)
    elif code == "VALIDATION_ERROR":
        fields = "; ".join(
            f"{'.'.join(str(part) for part in error.get('loc', ())) or 'message'}:"
            f" {error.get('msg', 'invalid')}"
            for error in data.get("errors", [])
        )
        data["message"] = f"Invalid message: {fields or 'not what the server takes'}"
        print(f"tirl openenv: {data['message']}", file=sys.stderr, flush=True)
    else:
        return text
    return json.dumps(reply)


def serve(
    entry: Mapping[str, Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    seed: int = 0,
    settings=None,
    allow_remote: bool = False,
) -> None:
    """Serve the task source `entry` names until SIGINT or SIGTERM (see the module doc).
    ConfigError, before anything listens, for a bad entry or setting, a missing openenv, a
    non-loopback `host` without `allow_remote`, or an address it cannot listen on."""
    if not (allow_remote or is_loopback(host)):
        raise ConfigError(
            f"refusing to listen on {host!r}: the OpenEnv server has no authentication and runs"
            " its clients' code; bind 127.0.0.1, or pass --insecure-allow-remote if this"
            " network is trusted"
        )
    app = make_app(entry, seed, settings)
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host} port {port}: {e.strerror}") from None
    sock.listen(128)
    # uvicorn shuts down gracefully on SIGINT / SIGTERM (closing the sandbox), then raises the
    # signal again under the handler that was there before: let that be a quiet exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_quietly)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    print(LISTENING.format(host=host, port=sock.getsockname()[1]), flush=True)
    server.run(sockets=[sock])


def _exit_quietly(signum, frame) -> None:
    raise SystemExit(0)


def parse_entry(text: str) -> dict[str, Any]:
    """A `--source` value: a JSON object (a task-source entry) or a bare source name."""
    text = text.strip()
    if not text.startswith("{"):
        return {"source": text}
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--source: not a JSON object ({e})") from None
    if not isinstance(entry, dict):
        raise ConfigError(f"--source: must be a JSON object, got {entry!r}")
    return entry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's flags (shared by this module's command and a `tirl` subcommand)."""
    parser.add_argument(
        "--source",
        required=True,
        help='a task-source entry (JSON) or name: \'{"source": "races"}\'',
    )
    parser.add_argument("--host", type=bind_host, default="127.0.0.1")
    parser.add_argument(
        "--port", type=number(int, "[0, 65535]"), default=8000, help="0: a free port"
    )
    parser.add_argument(
        "--seed", type=number(int, ">= 0"), default=0, help="the source's seed, if it takes one"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="an OpenEnvSettings key"
    )
    parser.add_argument(
        "--insecure-allow-remote",
        action="store_true",
        help="listen on a non-loopback address (no authentication: trusted networks only)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve as `args` (from `add_arguments`) say; a bad input is one line and exit code 2."""
    try:
        entry = parse_entry(args.source)
        settings = _settings(args.set)
        serve(
            entry,
            args.host,
            args.port,
            seed=args.seed,
            settings=settings,
            allow_remote=args.insecure_allow_remote,
        )
    except ConfigError as e:
        print(f"tirl: error: {e}", file=sys.stderr)
        return 2
    return 0


class _OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line (`tirl openenv-serve` gets the same from tirl's own parser)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tirl: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _OneLineParser(
        prog="python -m tirl.integrations.openenv.server",
        description="Serve a tirl task source as an OpenEnv environment.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _settings(overrides: Sequence[str]):
    """`OpenEnvSettings` from `--set key=value` overrides (checked before openenv is needed)."""
    from tirl.integrations.openenv.settings import OpenEnvSettings

    try:
        data = apply_overrides({}, list(overrides))
    except ConfigError as e:
        raise ConfigError(f"--set: {e}") from None
    try:
        return from_dict(OpenEnvSettings, data, "")
    except ConfigError as e:
        raise ConfigError(f"--set: {e}", e.key) from None


if __name__ == "__main__":
    sys.exit(main())
