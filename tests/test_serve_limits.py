"""`tirl serve` bounds what one request can cost: a prompt longer than the context can hold is
refused before it is tokenized, and what is tokenized is tokenized off the event loop, so
oversized prompts arriving together do not stall `/health` or valid requests."""

from __future__ import annotations

import asyncio
import copy
import time

import aiohttp
from conftest import tirl_serve

from tirl.apps.server_requests import ModelLimits, token_bytes_bound
from tirl.models.tiny import CHAT_TEMPLATE

MB = 2**20


def test_the_bound_is_never_below_what_a_token_decodes_to(tokenizer):
    bound = token_bytes_bound(tokenizer)
    longest = max(
        len(tokenizer.decode([i]).encode("utf-8")) for i in range(len(tokenizer.get_vocab()))
    )
    assert bound >= longest
    limits = ModelLimits(frozenset({"m"}), 10, 100, bound)
    assert limits.max_text_bytes == 100 * bound


async def _timed_get(http: aiohttp.ClientSession, url: str) -> float:
    start = time.perf_counter()
    async with http.get(url) as r:
        assert r.status == 200
    return time.perf_counter() - start


def test_oversized_prompts_are_refused_without_stalling_the_server(
    scripted_model, tokenizer, tmp_path
):
    big = "Compute 483 * 917 mod 997. " * (4 * MB // 27)  # ~4 MB of text
    # The cost the server no longer pays per request: tokenizing such a prompt here.
    start = time.perf_counter()
    tokenizer.encode(big[: MB // 2], add_special_tokens=False)
    tokenize_4mb_s = (time.perf_counter() - start) * 8

    async def main(url: str):
        async with aiohttp.ClientSession(trust_env=False) as http:
            model = (await (await http.get(f"{url}/v1/models")).json())["data"][0]["id"]

            async def oversized(kind: str) -> tuple[int, str]:
                if kind == "chat":
                    body = {"model": model, "messages": [{"role": "user", "content": big}]}
                    path = "/v1/chat/completions"
                else:
                    body, path = {"model": model, "prompt": big, "max_tokens": 4}, "/v1/completions"
                async with http.post(url + path, json=body) as r:
                    return r.status, (await r.json())["error"]["message"]

            async def valid() -> int:
                body = {"model": model, "prompt": "D:\n", "max_tokens": 8, "temperature": 0}
                async with http.post(f"{url}/v1/completions", json=body) as r:
                    return r.status

            flood = [asyncio.create_task(oversized(k)) for k in ("text", "text", "text", "chat")]
            health = [await _timed_get(http, f"{url}/health") for _ in range(20)]
            answers = await asyncio.gather(*flood)
            return answers, health, await valid()

    chat_tokenizer = copy.deepcopy(tokenizer)  # the session's tokenizer stays template-less
    chat_tokenizer.chat_template = CHAT_TEMPLATE
    with tirl_serve(scripted_model, chat_tokenizer, tmp_path / "model") as url:
        answers, health, valid_status = asyncio.run(main(url))
    for status, message in answers:
        assert status == 400 and "bytes of text: more than the model's context" in message
    assert valid_status == 200
    # /health answered throughout in a small fraction of what tokenizing one prompt costs
    assert max(health) < tokenize_4mb_s / 5, (max(health), tokenize_4mb_s)
