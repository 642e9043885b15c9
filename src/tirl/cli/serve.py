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
            kv_cache_tokens=args.kv_cache_tokens,
            prefill_chunk=args.prefill_chunk,
            step_tokens=args.step_tokens,
            max_queue=args.max_queue,
            drain_timeout_s=args.drain_timeout,
            threads=args.threads,
        )
    return 0


def add_parser(sub) -> None:
    from tirl.apps.serve import (
        DRAIN_TIMEOUT_S,
        KV_MEMORY_SHARE,
        MAX_QUEUE,
        PREFILL_CHUNK,
        STEP_TOKENS,
    )

    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API (completions, chat, streaming)",
        description="Serve a model over an OpenAI-compatible API (see tirl.apps.server)."
        " With $TIRL_API_KEY set, every request must carry 'Authorization: Bearer <key>';"
        " without a key it only binds loopback. Memory follows the load: the KV cache is"
        " bounded by --kv-cache-tokens (requests wait for room, first come first served) and"
        " handed back when idle. SIGTERM or SIGINT drains (new requests get 503, those in"
        " flight finish within --drain-timeout, exit 0); a second signal exits at once.",
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
    p.add_argument(
        "--kv-cache-tokens",
        type=number(int, "[2, 1e12]"),
        default=None,
        metavar="N",
        help="KV cache budget, in token positions (the cache is dense: rows in flight x the"
        " longest of them, each a request's prompt + max_tokens; a position costs 2 x layers x"
        " KV heads x head size x dtype bytes, printed at start). A request waits until it fits"
        " what is left; one that never could is a 400. Default: a"
        f" {KV_MEMORY_SHARE:g} share of the memory available at start, at most --max-batch"
        " full contexts, at least one full context",
    )
    p.add_argument(
        "--prefill-chunk",
        type=number(int, "[1, 1e9]"),
        default=PREFILL_CHUNK,
        metavar="N",
        help="prompt tokens a request feeds per step, so that others keep decoding while a long"
        f" prompt is read (default {PREFILL_CHUNK})",
    )
    p.add_argument(
        "--step-tokens",
        type=number(int, "[1, 1e9]"),
        default=STEP_TOKENS,
        metavar="N",
        help="tokens one step feeds, all requests together (each at least one; default"
        f" {STEP_TOKENS})",
    )
    p.add_argument(
        "--max-queue",
        type=number(int, "[1, 1e9]"),
        default=MAX_QUEUE,
        metavar="N",
        help="choices (prompts x n) held at once, running or waiting; past it a request is a"
        f" 429 (default {MAX_QUEUE})",
    )
    p.add_argument(
        "--drain-timeout",
        type=number(float, "[0, 1e6]"),
        default=DRAIN_TIMEOUT_S,
        metavar="S",
        help="on SIGTERM, seconds the requests in flight get to finish before they are cut"
        f" (default {DRAIN_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--threads",
        type=number(int, "[0, 4096]"),
        default=0,
        metavar="N",
        help="torch threads; 0 (the default) follows the cores other processes leave free"
        " (tirl.cpu)",
    )
    p.set_defaults(func=cmd_serve, config=None, overrides=[])
