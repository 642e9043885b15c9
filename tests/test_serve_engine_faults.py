"""Faults inside the engine's step loop: what one request's failure may take down with it.

In-process `HFEngine`s on the tiny model, and a `CompletionServer` on aiohttp's test server
(127.0.0.1, a port the OS picks). What must hold: a request whose stop function raises fails
alone, the others in its steps get exactly their usual tokens, and the loop serves the next
request; a step that fails (a token id the model has no embedding for, let through on purpose
by widening the server's vocabulary check) is a 500 for that request while the server stays
healthy; a loop that died all the same (only a BaseException can kill it) makes `/health` 503.

Not covered: faults of the model process itself (out of memory, a killed process): those are
the router's failover (tests/test_router.py, tests/test_rollout_isolation.py).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tirl.apps.server import CompletionServer
from tirl.backends.hf import HFEngine

PROMPTS = ["A:\n", "D:\n", "Compute 12 * 34."]
NO_HANG_S = 120.0  # bound on what must not hang (not a speed requirement)


class Poison(BaseException):
    """Not an Exception: the one kind of error the step loop lets through."""


def _engine(model, tokenizer) -> HFEngine:
    return HFEngine(model, tokenizer.eos_token_id, max_batch=8)


async def _generate(engine, tokenizer, prompt, stop=None, key=None):
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    out = await engine.generate(key or prompt, ids, max_new_tokens=12, temperature=0.0, stop=stop)
    engine.release(key or prompt)
    return out.ids


def test_a_stop_function_that_raises_fails_only_its_own_request(scripted_model, tokenizer):
    def explode(new_ids):
        if len(new_ids) == 3:
            raise ValueError("a broken stop function")
        return False

    async def main():
        engine = _engine(scripted_model, tokenizer)
        alone = [await _generate(engine, tokenizer, p) for p in PROMPTS]
        together = await asyncio.wait_for(  # a generous bound: before the fix, this hung
            asyncio.gather(
                _generate(engine, tokenizer, "A:\n", stop=explode, key="bad"),
                *(_generate(engine, tokenizer, p) for p in PROMPTS),
                return_exceptions=True,
            ),
            NO_HANG_S,
        )
        after = await _generate(engine, tokenizer, "D:\n")  # the loop still serves
        alive = engine.loop_alive()
        engine.close()
        return alone, together, after, alive

    alone, (bad, *others), after, alive = asyncio.run(main())
    assert isinstance(bad, ValueError)
    assert others == alone  # the same tokens as when each ran alone
    assert after == alone[1] and alive


@pytest.fixture()
def tiny_server(tiny_model, tokenizer):
    """A CompletionServer over a fresh engine, with an aiohttp client on loopback."""

    async def start():
        engine = _engine(tiny_model, tokenizer)
        server = CompletionServer(engine, tokenizer, "tiny")
        client = TestClient(TestServer(server.app(), host="127.0.0.1"))
        await client.start_server()
        return engine, server, client

    return start


def test_a_step_that_fails_is_a_500_for_its_request_and_the_server_stays_healthy(
    tiny_server, tokenizer
):
    async def main():
        engine, server, client = await tiny_server()
        # Let an id through that the model has no embedding row for: its forward pass fails.
        server.limits = dataclasses.replace(server.limits, vocab_size=10**6)
        failed = await client.post("/v1/completions", json={"prompt": [10**5], "max_tokens": 3})
        ok = await client.post("/v1/completions", json={"prompt": "D:\n", "max_tokens": 3})
        health = await client.get("/health")
        result = (failed.status, await failed.json(), ok.status, health.status, await health.json())
        await client.close()
        engine.close()
        return result

    failed_status, failed_body, ok_status, health_status, health = asyncio.run(main())
    assert failed_status == 500 and failed_body["error"]["type"] == "server_error"
    assert ok_status == 200 and health_status == 200
    assert health["status"] == "ok" and health["failed_requests"] == 1


def test_health_is_503_once_the_step_loop_has_died(tiny_server, tokenizer):
    def poison(new_ids):
        raise Poison()

    async def main():
        engine, server, client = await tiny_server()
        before = await client.get("/health")
        stuck = asyncio.ensure_future(_generate(engine, tokenizer, "D:\n", stop=poison))

        async def dead() -> None:  # the loop dies at its first step
            while engine.loop_alive():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(dead(), NO_HANG_S)
        after = await client.get("/health")
        result = (before.status, after.status, await after.json())
        stuck.cancel()
        engine._loop_task.exception()  # retrieved: no "never retrieved" warning at exit
        await client.close()
        engine.close()
        return result

    before, after, body = asyncio.run(main())
    assert before == 200
    assert after == 503 and body["status"] == "unhealthy" and "step loop" in body["reason"]
