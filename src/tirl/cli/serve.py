"""`tirl serve MODEL`: a model over an OpenAI-compatible API (`tirl.apps.serve`)."""

from __future__ import annotations

import argparse

from tirl.cli.common import add_auth_args, listen_errors, server_key
from tirl.cliargs import bind_host, check_model_source, number


def cmd_serve(args: argparse.Namespace) -> int:
    key = server_key(args)  # before the model loads: a refused bind fails at once
    from tirl.apps.serve import serve_model

    check_model_source(args.model, "model")
    with listen_errors(args):
        serve_model(
            args.model,
            args.host,
            args.port,
            args.max_batch,
            api_key=key,
            insecure_no_auth=args.insecure_no_auth,
        )
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API (completions, chat, streaming)",
        description="Serve a model over an OpenAI-compatible API (see tirl.backends.server)."
        " With $TIRL_API_KEY set, every request must carry 'Authorization: Bearer <key>';"
        " without a key it only binds loopback.",
    )
    p.add_argument("model", help="model folder or hub name")
    p.add_argument(
        "--host", type=bind_host, default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    add_auth_args(p)
    p.add_argument(
        "--port",
        type=number(int, "[0, 65535]"),
        default=8000,
        help="port; 0 picks a free one (default 8000)",
    )
    p.add_argument(
        "--max-batch",
        type=number(int, "[1, 100000]"),
        default=64,
        help="sequences decoded together (default 64)",
    )
    p.set_defaults(func=cmd_serve, config=None, overrides=[])
