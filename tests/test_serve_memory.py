"""`tirl serve`'s memory follows its load (issue 43): the KV cache stays within its budget,
requests beyond it wait (first come, first served) instead of failing, one that could never
fit is a 400 naming the budget, a full queue is a 429, the cache is handed back when idle,
a long prompt is prefilled a chunk a step so that others keep decoding, and a client that
hangs up has its work dropped within a step.

In-process `HFEngine`s on the tiny models (256 positions), with budgets of a few hundred
positions so that the limits bind at this scale, and a `CompletionServer` on aiohttp's test
server (127.0.0.1, a port the OS picks). Order is checked by engine steps, never by clocks:
`Steps` records each step's rows and what the cache held, and can hold the engine before a
step until the test lets it go.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from tirl.apps.server import CompletionServer
from tirl.backends.hf import HFEngine, KVBudgetError

NO_HANG_S = 120.0  # bound on what must not hang (not a speed requirement)
PROMPTS = ["A:\n", "D:\n", "Compute 12 * 34."]


class Steps:
    """Wraps an engine's step: records, per step, its keys, the tokens each fed, and the KV
    positions reserved and allocated; with `gated`, each step first waits for `allow`."""

    def __init__(self, engine: HFEngine, gated: bool = False) -> None:
        self.engine = engine
        self.log: list[dict] = []
        self._gate = threading.Semaphore(0) if gated else None
        self._original = engine._step
        engine._step = self._step

    def _step(self, batch, feeds):
        if self._gate is not None:
            assert self._gate.acquire(timeout=NO_HANG_S), "the test never let this step run"
        out = self._original(batch, feeds)
        engine = self.engine
        self.log.append(
            {
                "keys": [r.key for r in batch],
                "fed": [len(f) for f in feeds],
                "reserved": engine.kv_reserved,
                "allocated": engine.kv_allocated,
                "slots": list(getattr(engine.kv, "row_keys", [])),
            }
        )
        return out

    def allow(self, steps: int = 1) -> None:
        self._gate.release(steps)

    def first_step_of(self, key) -> int:
        return next(i for i, s in enumerate(self.log) if key in s["keys"])

    def last_step_of(self, key) -> int:
        return max(i for i, s in enumerate(self.log) if key in s["keys"])


async def _until(condition, what: str) -> None:
    """Wait (yielding to the loop) until `condition()` holds; fail after NO_HANG_S."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(poll(), NO_HANG_S)
    except asyncio.TimeoutError:
        pytest.fail(f"never: {what}")


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _assert_full_pass_log_probs(model, prompt: list[int], out) -> None:
    """`out`'s log-probs are what one pass of `model` over prompt + its ids gives them."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    picked = expected.gather(1, torch.tensor(out.ids)[:, None])[:, 0]
    assert torch.allclose(picked, torch.tensor(out.logprobs), atol=1e-4)


async def _greedy(engine: HFEngine, key, ids: list[int], max_new_tokens: int, stop=None):
    out = await engine.generate(key, ids, max_new_tokens=max_new_tokens, temperature=0.0, stop=stop)
    engine.release(key)
    return out


# -- the budget -------------------------------------------------------------------------------


def test_requests_beyond_the_budget_wait_their_turn_and_get_their_usual_tokens(
    scripted_model, tokenizer
):
    """Twelve requests of 3 or 10 prompt tokens + 30 under a budget of 120: at most three rows
    at a time (the dense cache: rows x the longest), the cache never past the budget, every
    request answered with the tokens it gets alone, the cache handed back once all are
    released."""

    async def main():
        alone_engine = HFEngine(scripted_model, tokenizer.eos_token_id, max_batch=8)
        alone = [(await _greedy(alone_engine, p, _ids(tokenizer, p), 30)).ids for p in PROMPTS]
        engine = HFEngine(scripted_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(kv_budget=120)
        steps = Steps(engine)
        jobs = [_greedy(engine, i, _ids(tokenizer, PROMPTS[i % 3]), 30) for i in range(12)]
        outs = await asyncio.wait_for(asyncio.gather(*jobs), NO_HANG_S)
        return alone, [o.ids for o in outs], steps.log, engine

    alone, together, log, engine = asyncio.run(main())
    assert together == [alone[i % 3] for i in range(12)]
    assert max(len(s["keys"]) for s in log) == 3  # 4 x 33 > 120: a fourth waited
    assert max(s["reserved"] for s in log) <= 120
    assert max(s["allocated"] for s in log) <= 120
    assert engine.kv_allocated == 0 and not engine.kv.cache.layers  # handed back when idle
    assert engine.running == engine.queued == 0


def test_a_big_request_is_not_overtaken_by_small_ones_that_came_after_it(tiny_model, tokenizer):
    """FIFO: a request that needs most of the budget waits for room, and the small ones sent
    after it wait behind it, so it is never starved."""

    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(kv_budget=200)
        steps = Steps(engine)
        small = [7, 8, 9]
        first = [asyncio.ensure_future(_greedy(engine, f"s{i}", small, 20)) for i in range(4)]
        await asyncio.sleep(0)  # the four are queued (and admitted) first
        big = asyncio.ensure_future(_greedy(engine, "big", list(range(5, 155)), 30))
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(_greedy(engine, f"l{i}", small, 20)) for i in range(4)]
        await asyncio.wait_for(asyncio.gather(*first, big, *later), NO_HANG_S)
        return steps

    steps = asyncio.run(main())
    big_first = steps.first_step_of("big")
    assert big_first > 0  # it waited: 180 positions did not fit beside the first four
    assert all(steps.first_step_of(f"l{i}") >= big_first for i in range(4))
    assert max(s["allocated"] for s in steps.log) <= 200


def test_a_request_larger_than_the_whole_budget_is_refused_at_once(tiny_model, tokenizer):
    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(kv_budget=64)
        with pytest.raises(KVBudgetError, match="more than the engine's budget of 64"):
            await engine.generate("k", list(range(5, 45)), max_new_tokens=30)
        assert engine.queued == engine.running == 0

    asyncio.run(main())


# -- over HTTP --------------------------------------------------------------------------------


async def _start(engine: HFEngine, tokenizer, **server_args):
    server = CompletionServer(engine, tokenizer, "tiny", **server_args)
    client = TestClient(TestServer(server.app(), host="127.0.0.1"))
    await client.start_server()
    return server, client


async def _complete(client, prompt, max_tokens: int, **extra) -> tuple[int, dict]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = await client.post("/v1/completions", json=body)
    return response.status, await response.json()


def test_a_batch_of_near_context_prompts_runs_within_the_budget_and_is_handed_back(
    tiny_model, tokenizer
):
    """Issue 43's S5 at tiny scale: 64 prompts of 255 token ids (the context is 256) with
    max_tokens 1, under a budget of four contexts: one 200 with 64 choices, never more than
    the budget allocated, nothing allocated once done; then small requests all succeed."""

    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=64)
        engine.set_limits(kv_budget=4 * 256, prefill_chunk=64, step_tokens=256)
        steps = Steps(engine)
        server, client = await _start(engine, tokenizer)
        prompts = [[5 + (i + j) % 300 for j in range(255)] for i in range(64)]
        big = await _complete(client, prompts, 1)
        idle, big_steps = engine.kv_allocated, list(steps.log)
        small = await asyncio.gather(*(_complete(client, "D:\n", 4) for _ in range(20)))
        health = await (await client.get("/health")).json()
        await client.close()
        return big, idle, small, big_steps, health

    (status, body), idle, small, log, health = asyncio.run(main())
    assert status == 200 and len(body["choices"]) == 64
    assert max(s["allocated"] for s in log) <= 4 * 256
    assert max(len(s["keys"]) for s in log) <= 4
    assert idle == 0
    assert [s for s, _ in small] == [200] * 20
    assert health["kv_budget"] == 1024 and health["kv_allocated"] == 0


def test_past_the_budget_or_the_queue_requests_get_a_400_or_a_429_naming_the_limit(
    tiny_model, tokenizer
):
    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(kv_budget=100)
        steps = Steps(engine, gated=True)
        server, client = await _start(engine, tokenizer, max_queue=2)
        too_long = await _complete(client, list(range(5, 65)), 50)  # 110 > 100
        prompt_alone = await _complete(client, list(range(5, 125)), 1)  # 120 > 100
        models = await (await client.get("/v1/models")).json()
        held = [asyncio.ensure_future(_complete(client, "D:\n", 3)) for _ in range(2)]
        await _until(lambda: server.choices == 2, "two choices held")
        full = await _complete(client, "D:\n", 3)
        too_many = await _complete(client, "D:\n", 3, n=3)
        steps.allow(100)
        done = await asyncio.gather(*held)
        after = await _complete(client, "D:\n", 3)
        await client.close()
        return too_long, prompt_alone, models, full, too_many, done, after

    too_long, prompt_alone, models, full, too_many, done, after = asyncio.run(main())
    status, body = too_long
    assert status == 400 and body["error"]["param"] == "max_tokens"
    message = body["error"]["message"]
    assert "60 tokens and max_tokens is 50" in message and "budget of 100" in message
    status, body = prompt_alone
    assert status == 400 and body["error"]["param"] == "prompt"
    assert "120 tokens" in body["error"]["message"] and "budget 100" in body["error"]["message"]
    assert models["data"][0]["max_model_len"] == 100  # what a client may ask for at most
    status, body = full
    assert status == 429 and body["error"]["code"] == "queue_full"
    assert "limit of 2" in body["error"]["message"]
    status, body = too_many
    assert status == 400 and body["error"]["param"] == "n"
    assert [s for s, _ in done] == [200, 200] and after[0] == 200


# -- chunked prefill and cancellation ---------------------------------------------------------


def test_a_long_prompt_does_not_hold_back_the_tokens_of_rows_already_decoding(
    tiny_model, tokenizer
):
    """A short request decodes one token every step while a 240-token prompt that joins it
    is prefilled 8 tokens a step: the short one finishes before the long one's first token."""

    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(prefill_chunk=8, step_tokens=16)
        steps = Steps(engine)
        token_steps: list[int] = []
        long_ids = [5 + i % 300 for i in range(240)]
        started: list[asyncio.Future] = []

        def on_short_token(new_ids) -> bool:
            token_steps.append(engine.steps)
            if len(new_ids) == 1:  # the short one decodes: now the long prompt arrives
                started.append(asyncio.ensure_future(_greedy(engine, "long", long_ids, 3)))
            return False

        short = await _greedy(engine, "short", [7, 8, 9], 20, stop=on_short_token)
        long = await asyncio.wait_for(started[0], NO_HANG_S)
        return short, long, token_steps, steps, long_ids

    short, long, token_steps, steps, long_ids = asyncio.run(main())
    assert len(short.ids) == 20 or short.finish_reason == "stop"
    assert token_steps == list(range(1, len(token_steps) + 1))  # a token every step
    long_first = steps.first_step_of("long")
    fed = [s["fed"][s["keys"].index("long")] for s in steps.log[long_first:]]
    assert fed[:3] == [8, 8, 8]  # a chunk a step, beside the short row's token
    prefilled = long_first + next(i for i in range(len(fed)) if sum(fed[: i + 1]) == 240)
    assert steps.last_step_of("short") < prefilled  # done before the long one's first token
    # What the chunks computed is what one pass over the whole prompt computes.
    _assert_full_pass_log_probs(tiny_model, long_ids, long)


def test_rows_decoding_on_both_sides_of_a_prefilling_row_get_a_full_passs_log_probs(
    tiny_model, tokenizer
):
    """Slots a, long, b: while `long` is fed in chunks, a and b decode as one group read over
    the span of slots around it (no copy of their keys); every token is what a full pass
    gives it."""

    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(prefill_chunk=8, step_tokens=32)
        steps = Steps(engine)
        long_ids, b_ids = [5 + i % 240 for i in range(200)], [10, 11, 12]
        joined: dict[str, asyncio.Future] = {}

        def on_a_token(new_ids) -> bool:  # a's 1st token: long joins; its 2nd: b joins
            if len(new_ids) == 1:
                joined["long"] = asyncio.ensure_future(_greedy(engine, "long", long_ids, 4))
            if len(new_ids) == 2:
                joined["b"] = asyncio.ensure_future(_greedy(engine, "b", b_ids, 12))
            return False

        a = await _greedy(engine, "a", [7, 8, 9], 20, stop=on_a_token)
        others = await asyncio.wait_for(asyncio.gather(joined["long"], joined["b"]), NO_HANG_S)
        return a, others, long_ids, b_ids, steps.log

    a, (long, b), long_ids, b_ids, log = asyncio.run(main())
    fed = [dict(zip(s["keys"], s["fed"])) for s in log]
    around = [f for f, s in zip(fed, log) if s["slots"] == ["a", "long", "b"] and f["long"] > 1]
    assert [f for f in around if f["a"] == f["b"] == 1]  # a and b decoding around it
    for prompt, out in (([7, 8, 9], a), (long_ids, long), (b_ids, b)):
        _assert_full_pass_log_probs(tiny_model, prompt, out)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_has_its_prefill_dropped_within_a_step(
    tiny_model, tokenizer, stream
):
    """A 240-token prompt prefilled 4 tokens a step (60 steps): the client leaves after two
    steps; the engine drops the request at the next step, its row and budget freed and the
    cache handed back, and serves the next request."""

    async def main():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8)
        engine.set_limits(kv_budget=512, prefill_chunk=4, step_tokens=8)
        steps = Steps(engine, gated=True)
        server, client = await _start(engine, tokenizer)
        body = {"prompt": [5 + i % 300 for i in range(240)], "max_tokens": 8, "stream": stream}
        leaving = asyncio.ensure_future(client.post("/v1/completions", json=body))
        steps.allow(2)
        await _until(lambda: len(steps.log) == 2, "two prefill steps")
        if stream:  # the headers are in: the client closes the connection unread
            (await leaving).close()
        else:  # still waiting for the response: the client gives up, closing the connection
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
        await _until(lambda: engine._active[0].future.cancelled(), "the request cancelled")
        steps.allow(100)
        await _until(lambda: engine.running == engine.queued == 0, "the request dropped")
        fed = sum(s["fed"][0] for s in steps.log)
        after_drop = (len(steps.log), fed, engine.kv_reserved, engine.kv_allocated)
        next_one = await _complete(client, "D:\n", 3)
        await client.close()
        return after_drop, next_one

    (stepped, fed, reserved, allocated), (status, _) = asyncio.run(main())
    assert stepped <= 3  # at most the step already let go when it left; 60 without the drop
    assert fed <= 3 * 4  # of the prompt's 240 tokens
    assert reserved == 0 and allocated == 0
    assert status == 200
