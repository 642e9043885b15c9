"""`tirl sandbox serve`: the Python sandbox served over HTTP (`tirl.sandbox.http`).

The flags that shape the served sessions (limits and preloads) are made from the settings of
the `sandbox:` section (`tirl.sandbox.config.SERVED_SETTINGS`): one flag per setting, with its
range, default and doc, so a limit added there is a flag here at once and a server's sessions
default to a run's. The flags of the server itself (address, key, pool, timeouts of requests
and idle sessions) are its own, below.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable

from tirl.cli.common import add_auth_args, listen_errors, server_key
from tirl.cliargs import bind_host, number
from tirl.config import ConfigError
from tirl.sandbox.config import SERVED_SETTINGS, SandboxConfig

SANDBOX_DEFAULTS = SandboxConfig()  # the served sessions' defaults are a run's


def cmd_sandbox_serve(args: argparse.Namespace) -> int:
    key = server_key(args)

    from tirl.sandbox.api import SandboxError
    from tirl.sandbox.http import serve
    from tirl.sandbox.transports import local_sandbox

    if args.max_timeout_s < args.timeout_s:
        raise ConfigError(
            f"--max-timeout-s ({args.max_timeout_s}) must be at least --timeout-s ({args.timeout_s})"
        )
    try:
        with listen_errors(args):
            serve(
                local_sandbox(served_settings(args), pool_size=args.pool_size),
                args.host,
                args.port,
                args.max_timeout_s,
                args.idle_ttl_s,
                api_key=key,
                insecure_no_auth=args.insecure_no_auth,
            )
    except SandboxError as err:
        print(f"tirl: error: {err}", file=sys.stderr)
        return 1
    return 0


def served_settings(args: argparse.Namespace) -> SandboxConfig:
    """The served sessions' settings: a sandbox section with the session flags' values."""
    return SandboxConfig(**{name: getattr(args, name) for name in SERVED_SETTINGS})


def add_setting_flags(
    parser: argparse.ArgumentParser, schema: type, names: tuple[str, ...], defaults: object
) -> None:
    """One flag per setting of dataclass `schema` in `names` (`--timeout-s` for `timeout_s`):
    its type and range checked as the config checks them, its default from `defaults`, its doc
    as the help. Numbers, `X | None`, bools (`--x` / `--no-x`) and lists of names
    (comma-separated) are understood; anything else is a programming error."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        doc = f.metadata.get("doc", "").replace("%", "%%")
        bounds = f.metadata.get("range")
        tp = _without_none(hints[f.name])
        if tp is bool:
            shown = "on" if default else "off"
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{doc} (default: {shown})",
            )
        elif tp in (int, float):
            if bounds is None:
                raise TypeError(f"setting {f.name} has no range to check its flag against")
            shown = "none" if default is None else f"{default:g}"
            parser.add_argument(
                flag,
                type=number(tp, str(bounds)),
                default=default,
                metavar=tp.__name__.upper(),
                help=f"{doc}; {_range_words(str(bounds))} (default: {shown})",
            )
        elif tp == list[str]:
            parser.add_argument(
                flag,
                type=_names(f.metadata.get("check")),
                default=list(default),
                metavar="A,B,...",
                help=f"{doc}; comma-separated, '' for none (default: {','.join(default)})",
            )
        else:
            raise TypeError(f"setting {f.name}: no flag for {hints[f.name]!r}")


def _without_none(tp: object) -> object:
    """`int | None` -> int; other annotations unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _range_words(bounds: str) -> str:
    return f"in {bounds}" if bounds[0] in "[(" else bounds


def _names(check: Callable[[list[str]], str | None] | None) -> Callable[[str], list[str]]:
    """An argparse `type=`: comma-separated names as a list, checked by the setting's check."""

    def parse(text: str) -> list[str]:
        found = [name.strip() for name in text.split(",") if name.strip()]
        problem = check(found) if check is not None else None
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return found

    return parse


def add_parser(sub) -> None:
    sandbox = sub.add_parser(
        "sandbox", help="serve the Python sandbox to other machines or processes over HTTP"
    )
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    p = sandbox_sub.add_parser(
        "serve",
        help="serve sandbox sessions over HTTP until SIGTERM or Ctrl-C",
        description="Serve stateful sandbox sessions over a JSON HTTP API (see"
        " tirl.sandbox.http). Anyone who can use it can run code as you: with $TIRL_API_KEY"
        " set, every request must carry 'Authorization: Bearer <key>'; without a key it only"
        " binds loopback. SIGTERM or Ctrl-C lets the running cells finish (new requests get"
        " 503); a second signal stops at once. The session flags are the settings of a run's"
        " sandbox section, with the same ranges and defaults.",
    )
    p.add_argument(
        "--host", type=bind_host, default="127.0.0.1", help="address to bind (default: 127.0.0.1)"
    )
    add_auth_args(p)
    p.add_argument(
        "--port",
        type=number(int, "[0, 65535]"),
        default=8765,
        help="port to bind; 0 picks a free one (default: 8765)",
    )
    p.add_argument(
        "--max-timeout-s",
        type=number(float, "(0, 86400]"),
        default=60.0,
        help="cap on the timeout_s of a request, in seconds (default: 60)",
    )
    p.add_argument(
        "--pool-size",
        type=number(int, "[0, 4096]"),
        default=32,
        help="sessions forked ahead of requests and refilled in the background; size it to the"
        " largest burst of opens this server should answer at once (default: 32)",
    )
    p.add_argument(
        "--idle-ttl-s",
        type=number(float, "(0, 31536000]"),
        default=600.0,
        help="close sessions idle this many seconds (default: 600)",
    )
    sessions = p.add_argument_group("the served sessions (the settings of a run's sandbox section)")
    add_setting_flags(sessions, SandboxConfig, SERVED_SETTINGS, SANDBOX_DEFAULTS)
    sessions.add_argument(
        "--keep-background",
        dest="kill_background",
        action="store_false",
        help="the same as --no-kill-background (its older name)",
    )
    p.set_defaults(func=cmd_sandbox_serve, config=None, overrides=[])  # see _split_overrides
