"""What `tirl serve MODEL` runs: the saved policy loaded, its HF engine built through the engine
registry (`tirl.rollout.engines`, as every run's engine is), bounded for serving
(`HFEngine.set_limits`: a KV cache budget, chunked prefill) and served over the
OpenAI-compatible API of `tirl.apps.server`. Light to import (the CLI reads its defaults
for `--help`): the server, torch and the model load inside `serve_model`."""

from __future__ import annotations

import sys

KV_MEMORY_SHARE = 0.25  # of the memory available at start, for the KV cache by default
PREFILL_CHUNK = 256  # prompt tokens a row feeds per step
STEP_TOKENS = 512  # tokens one step feeds, all rows together (each at least one)
MAX_QUEUE = 1024  # choices (prompts x n) held at once, running or waiting
DRAIN_TIMEOUT_S = 60.0  # on SIGTERM, for the requests in flight to finish


def mem_available() -> int | None:
    """Bytes the kernel says are available without swapping (MemAvailable), or None where
    there is no /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_kv_budget(
    position_bytes: int, max_len: int, max_batch: int, available: int | None
) -> int:
    """KV positions for `tirl serve` when --kv-cache-tokens is not given: KV_MEMORY_SHARE of
    the `available` memory, at `position_bytes` a position; never more than max_batch full
    contexts (no more can be in flight), never less than one (else a request the context
    allows could never run: on a machine that small, pass --kv-cache-tokens)."""
    most = max_batch * max_len
    if available is None:
        return most
    return max(max_len, min(most, int(available * KV_MEMORY_SHARE) // position_bytes))


def serve_model(
    model_path: str,
    host: str,
    port: int,
    max_batch: int = 64,
    seed: int = 0,
    api_key: str | None = None,
    insecure_no_auth: bool = False,
    kv_cache_tokens: int | None = None,
    prefill_chunk: int = PREFILL_CHUNK,
    step_tokens: int = STEP_TOKENS,
    max_queue: int = MAX_QUEUE,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
    threads: int = 0,
) -> None:
    """Run until SIGTERM/SIGINT (then drain: `tirl.apps.server.serve`). Refuses
    (ValueError) a non-loopback `host` without `api_key` unless `insecure_no_auth`, before the
    model loads. `kv_cache_tokens`: the KV cache budget in positions (None:
    `default_kv_budget`). `threads`: torch's threads, 0 to follow the cores other processes
    leave free (`tirl.cpu`: a chunked prefill is many small steps, and on a shared machine
    each would wait for a thread that a neighbour holds)."""
    from tirl.httpauth import bind_refusal

    refusal = bind_refusal(host, api_key, insecure_no_auth, "--api-key-env")
    if refusal:
        raise ValueError(refusal)
    from tirl.apps.server import serve
    from tirl.backends.hf import position_bytes
    from tirl.cpu import configure_threads
    from tirl.models.tiny import load_policy
    from tirl.rollout.engines import EngineSpec, make_engine

    configure_threads(threads)
    model, tokenizer = load_policy(model_path)
    model.eval()
    spec = EngineSpec(model=model, eos_id=tokenizer.eos_token_id, max_batch=max_batch, seed=seed)
    engine = make_engine("hf", spec)
    per_position = position_bytes(model)
    budget = kv_cache_tokens or default_kv_budget(
        per_position, engine.max_len, max_batch, mem_available()
    )
    engine.set_limits(kv_budget=budget, prefill_chunk=prefill_chunk, step_tokens=step_tokens)
    print(
        f"tirl serve: KV cache budget {budget} positions ({budget * per_position / 2**30:.2f}"
        f" GiB at {per_position} bytes each); prefill {prefill_chunk} tokens a row and"
        f" {step_tokens} a step",
        file=sys.stderr,
        flush=True,
    )
    serve(
        engine,
        tokenizer,
        model_path,
        host,
        port,
        api_key=api_key,
        insecure_no_auth=insecure_no_auth,
        max_queue=max_queue,
        drain_timeout_s=drain_timeout_s,
    )
