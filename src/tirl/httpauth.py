"""API keys for tirl's HTTP servers (`tirl serve`, `tirl sandbox serve`) and their clients.

One shared secret per server, the OpenAI convention: the client sends
`Authorization: Bearer <key>`, the server compares it in constant time (`hmac.compare_digest`)
and answers 401 otherwise. The key lives in an environment variable, `TIRL_API_KEY` unless told
otherwise, never on a command line (where `ps` shows it to every user of the machine).

- Servers: `key_from_env` reads the key (None: no authentication), `bind_refusal` says why a
  bind must be refused (a non-loopback address without a key), `auth_middleware` guards every
  route. `/health` stays open so that load balancers can probe it, but a request without the
  key gets only its status (`redact_health`); the details (limits, counters, pid) need the key.
- Clients: `client_key(api_key)` is the key to send, an explicit argument first, else
  `TIRL_API_KEY` when set; `bearer(key)` the header.
- Stopping: `stop_signals(say)`, the one way both servers stop: the first SIGTERM or SIGINT
  sets an event (the server drains), a second ends the process at once.

Whether an address is loopback is decided from the host string alone: a numeric literal
(`127.0.0.1`, `127.1`, `::1`, `[::1]`) is parsed with `getaddrinfo(..., AI_NUMERICHOST)`, which
never touches the network, and `localhost` counts as loopback (RFC 6761). Any other name is
treated as public, since resolving it would mean a lookup and it may resolve elsewhere later.

Limits: no TLS (put a TLS-terminating proxy in front for traffic that leaves the machine; the
key crosses the network in clear text otherwise), one key per server, no rate limiting of
wrong guesses (use a long random key: `python -c "import secrets; print(secrets.token_urlsafe(32))"`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import re
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

DEFAULT_KEY_ENV = "TIRL_API_KEY"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: safe in a header
OPEN_PATHS = frozenset({"/health"})  # answered without the key, with nothing sensitive in them
# Where the middleware notes whether a request carried the key (a typed key on aiohttp >= 3.12).
_AUTHORIZED: Any = (
    web.RequestKey("tirl_authorized", bool) if hasattr(web, "RequestKey") else "tirl_authorized"
)


class APIKeyError(ValueError):
    """The key's environment variable is misnamed, unset when it was asked for, or unusable."""


def check_env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name or ""):
        raise APIKeyError(f"{name!r} is not an environment variable name (letters, digits, _)")
    return name


def key_from_env(name: str | None = None) -> str | None:
    """The server key from environment variable `name` (default `TIRL_API_KEY`).

    With the default name, an unset or empty variable means no authentication (None). A name
    given explicitly must hold a key: asking for one that is not there is an error, not a
    silently open server."""
    explicit = name is not None
    name = check_env_name(name if explicit else DEFAULT_KEY_ENV)
    key = os.environ.get(name, "")
    if not key:
        if explicit:
            raise APIKeyError(
                f"environment variable {name} is not set or empty (it must hold the key)"
            )
        return None
    if not _KEY_CHARS.fullmatch(key):
        raise APIKeyError(f"the key in {name} must be printable ASCII without spaces")
    return key


def client_key(api_key: str | None = None) -> str | None:
    """The key a client sends: `api_key` if given, else `$TIRL_API_KEY` if set, else none."""
    if api_key:
        return api_key
    return os.environ.get(DEFAULT_KEY_ENV) or None


def bearer(key: str | None) -> dict[str, str]:
    """The request headers that carry `key` (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def is_loopback(host: str) -> bool:
    """Whether binding `host` listens on loopback only (127.0.0.0/8, ::1), from the string alone."""
    host = host.strip()
    if host.lower().rstrip(".") == "localhost":
        return True
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    literal = literal.split("%", 1)[0]  # an IPv6 zone id names an interface, not an address
    if not literal:
        return False  # "" binds every interface
    try:
        infos = socket.getaddrinfo(literal, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return False  # a name, not a literal: it is not looked up, so it counts as public
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not address.is_loopback:
            return False
    return bool(infos)


def bind_refusal(host: str, key: str | None, insecure_no_auth: bool, env_flag: str) -> str | None:
    """Why binding `host` must be refused (a one-line message), or None if it may go ahead."""
    if key is not None or insecure_no_auth or is_loopback(host):
        return None
    return (
        f"refusing to listen on {host!r} without an API key: anyone who can reach the port"
        f" could use it. Set {DEFAULT_KEY_ENV} (or name another variable with {env_flag}),"
        " bind 127.0.0.1, or pass --insecure-no-auth if this network is trusted"
    )


def key_matches(header: str | None, key: str) -> bool:
    """Whether an `Authorization` header carries `key`, compared in constant time."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    try:
        given_bytes = given.strip().encode("utf-8", "surrogateescape")
    except UnicodeError:
        given_bytes = b""
    return hmac.compare_digest(given_bytes, key.encode("utf-8"))


ErrorResponse = Callable[[int, str], web.StreamResponse]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(key: str | None, error: ErrorResponse) -> Any:
    """An aiohttp middleware answering `error(401, ...)` to a request without `key`; with no
    key it lets everything through. `/health` is always let through: its handler calls
    `authorized(request)` to decide how much to say."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[_AUTHORIZED] = key is None or key_matches(request.headers.get("Authorization"), key)
        if request[_AUTHORIZED] or request.path in OPEN_PATHS:
            return await handler(request)
        response = error(
            401,
            "missing or wrong API key: send the header 'Authorization: Bearer <key>'"
            f" (tirl's clients send ${DEFAULT_KEY_ENV} when it is set)",
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    return middleware


def authorized(request: web.Request) -> bool:
    """Whether the request carried the key (True when the server has none)."""
    return bool(request.get(_AUTHORIZED, True))


def redact_health(request: web.Request, details: dict[str, Any]) -> dict[str, Any]:
    """`details` for a request with the key; only the status for one without."""
    return details if authorized(request) else {"status": details.get("status", "ok")}


def stop_signals(say: Callable[[str], None]) -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT (the server then drains); a second one ends
    the process at once, exit code 128 + the signal: whoever signals twice will not wait for
    a drain (`say` tells the terminal)."""
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            say("stopping now (second signal)")
            os._exit(128 + signum)  # no drain, no cleanup: what the second signal asks
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    return stop


async def wait_idle(idle: asyncio.Event, timeout_s: float) -> bool:
    """A drain's wait: True once `idle` is set (every request answered), False after
    `timeout_s` without it."""
    try:
        await asyncio.wait_for(idle.wait(), timeout_s)
    except asyncio.TimeoutError:
        return False
    return True
