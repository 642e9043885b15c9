"""`tirl sandbox serve`: the Python sandbox served over HTTP (`tirl.sandbox.http`)."""

from __future__ import annotations

import argparse
import sys

from tirl.cli.common import add_auth_args, listen_errors, server_key
from tirl.cliargs import bind_host, number
from tirl.config import ConfigError
from tirl.sandbox.config import SandboxConfig

SANDBOX_DEFAULTS = SandboxConfig()  # `tirl sandbox serve` takes its defaults from the section


def cmd_sandbox_serve(args: argparse.Namespace) -> int:
    key = server_key(args)

    from tirl.sandbox.api import SandboxError
    from tirl.sandbox.config import modules_problem
    from tirl.sandbox.http import serve
    from tirl.sandbox.local import DEFAULT_PRELOAD
    from tirl.sandbox.transports import local_sandbox

    if args.max_timeout_s < args.timeout_s:
        raise ConfigError(
            f"--max-timeout-s ({args.max_timeout_s}) must be at least --timeout-s ({args.timeout_s})"
        )
    preload = DEFAULT_PRELOAD
    if args.preload is not None:
        preload = tuple(m.strip() for m in args.preload.split(",") if m.strip())
    problem = modules_problem(list(preload))
    if problem:
        raise ConfigError(f"--preload {problem}")
    shape = SandboxConfig(  # the sandbox section every command reads (tirl.sandbox.config)
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        preload=list(preload),
        cpu_s=args.cpu_s,
        kill_background=not args.keep_background,
    )
    try:
        with listen_errors(args):
            serve(
                local_sandbox(
                    shape,
                    pool_size=args.pool_size,
                    grace_s=args.grace_s,
                    capture_chars=args.capture_chars,
                ),
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
        " 503); a second signal stops at once.",
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
        "--timeout-s",
        type=number(float, "(0, 86400]"),
        default=SANDBOX_DEFAULTS.timeout_s,
        help=f"default wall-clock limit per cell, in seconds (default: {SANDBOX_DEFAULTS.timeout_s:g})",
    )
    p.add_argument(
        "--max-timeout-s",
        type=number(float, "(0, 86400]"),
        default=60.0,
        help="cap on the timeout_s of a request, in seconds (default: 60)",
    )
    p.add_argument(
        "--grace-s",
        type=number(float, "(0, 3600]"),
        default=0.5,
        help="seconds between the interrupt and the kill (default: 0.5)",
    )
    p.add_argument(
        "--memory-mb",
        type=number(int, "[64, 1048576]"),
        default=SANDBOX_DEFAULTS.memory_mb,
        help=f"memory limit per session, in MB (default: {SANDBOX_DEFAULTS.memory_mb})",
    )
    p.add_argument(
        "--capture-chars",
        type=number(int, "[16, 100000000]"),
        default=8192,
        help="output the sandbox keeps per stream and cell, before a client's formatter cuts"
        " what the model is shown to its sandbox.max_output_chars (default: 8192)",
    )
    p.add_argument(
        "--pool-size",
        type=number(int, "[0, 4096]"),
        default=32,
        help="sessions forked ahead of requests and refilled in the background; size it to the"
        " largest burst of opens this server should answer at once (default: 32)",
    )
    p.add_argument(
        "--preload",
        help="comma-separated modules imported once and shared by all sessions; '' for none"
        " (default: math, numpy, sympy and other math modules)",
    )
    p.add_argument(
        "--idle-ttl-s",
        type=number(float, "(0, 31536000]"),
        default=600.0,
        help="close sessions idle this many seconds (default: 600)",
    )
    p.add_argument(
        "--cpu-s",
        type=number(int, "[1, 86400]"),
        help="CPU seconds per session over its life (RLIMIT_CPU; default: no cap)",
    )
    p.add_argument(
        "--keep-background",
        action="store_true",
        help="let processes a cell starts outlive the cell (default: they are ended)",
    )
    p.set_defaults(func=cmd_sandbox_serve, config=None, overrides=[])  # see _split_overrides
