"""The engine interface (`tirl.backends.engine`), served by an OpenAI-compatible completions
server (vLLM, SGLang, or `tirl serve`).

Token ids in, token ids out: the engine keeps each sequence's ids and sends them as the prompt
(`prompt` as a list of ints), asking for the generated ids back (`return_token_ids`, as vLLM
does) and for the stop string to stay in the output (`include_stop_str_in_output`), so that
what the rollout records is exactly what the model was conditioned on. A server that returns
only text has it re-tokenized with the local tokenizer (then the ids are a best effort, which
is fine for evaluation and wrong for training: the engine says so in `exact_ids`).

Code boundaries: a server cannot run the rollout's stop function (e.g. CIR's exact match on the
closing fence), so the engine asks it to stop at the protocol's `server_stop` strings ("```" for
fences) and checks the function itself. A stop that is not a boundary (a fence that opens a
block) is not one: generation simply continues, one more request.

Context: when the server says how long its context is (`max_model_len` in `/v1/models`, as
vLLM and `tirl serve` do), a request never asks for more tokens than fit, and a sequence that
has filled the context ends with "length" and no request, exactly as `HFEngine` does.

Authentication: `api_key` (default `$TIRL_API_KEY` when set) is sent as
`Authorization: Bearer <key>` with every request (`tirl.httpauth`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tirl.backends.engine import GenOutput, StopFn, check_prompt_fits
from tirl.backends.server_stops import RequestSeeds, generate_with_server_stops
from tirl.httpauth import bearer, client_key

FENCE = "```"


class OpenAIEngine:
    """The engine interface (`tirl.backends.engine.Engine`) over a completions server."""

    receives_weights = False  # the server holds its own weights; tirl cannot push new ones

    def __init__(
        self,
        base_url: str,
        tokenizer,
        *,
        model: str | None = None,
        max_concurrency: int = 64,
        timeout_s: float = 600.0,
        seed: int | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.model = model
        self.seed = seed
        self.seeds = RequestSeeds(seed)
        self.max_model_len: int | None = None  # from /v1/models, when the server says
        self._headers = bearer(client_key(api_key))
        self.exact_ids = True  # False once the server answered with text only
        self._history: dict[object, list[int]] = {}
        self._limit = asyncio.Semaphore(max_concurrency)
        self.timeout_s = timeout_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._described = False

    async def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=self._timeout, trust_env=False, headers=self._headers
            )
        if not self._described:
            await self._describe(self._http)
        return self._http

    async def _describe(self, http: aiohttp.ClientSession) -> None:
        """The model name (unless given) and its context length, from /v1/models."""
        async with http.get(f"{self.base_url}/v1/models") as r:
            if r.status != 200:
                if self.model is not None and r.status in (404, 405):  # no model list: fine
                    self._described = True
                    return
                raise RuntimeError(f"{self.base_url} answered {r.status}: {(await r.text())[:300]}")
            cards = (await r.json())["data"]
        card = next((c for c in cards if c.get("id") == self.model), cards[0])
        if self.model is None:
            self.model = card["id"]
        if isinstance(card.get("max_model_len"), int):
            self.max_model_len = card["max_model_len"]
        self._described = True

    async def _complete(
        self,
        ids: list[int],
        max_tokens: int,
        temperature: float,
        stops: tuple[str, ...],
        seed: int | None = None,
    ):
        http = await self._session()  # first: it learns the model name
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "logprobs": 1,
            "return_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
        if stops:
            body["stop"] = list(stops)
        seed = self.seeds(seed)
        if seed is not None:
            body["seed"] = seed
        if self.max_model_len is not None:  # what HFEngine does: never past the context
            room = self.max_model_len - len(ids)
            if room <= 0:
                return {"token_ids": [], "finish_reason": "length", "logprobs": None}
            body["max_tokens"] = min(max_tokens, room)
        async with self._limit, http.post(f"{self.base_url}/v1/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"{self.base_url} answered {r.status}: {(await r.text())[:300]}")
            return (await r.json())["choices"][0]

    def _ids_of(self, choice: dict) -> tuple[list[int], list[float]]:
        ids = choice.get("token_ids")
        if ids is None:
            self.exact_ids = False
            ids = self.tokenizer.encode(choice["text"], add_special_tokens=False)
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(logprobs) != len(ids):
            logprobs = [0.0] * len(ids)
        return list(ids), [float(x) for x in logprobs]

    async def generate(
        self,
        key: object,
        feed_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        stop: StopFn | None = None,
        seed: int | None = None,
    ) -> GenOutput:
        try:  # a server that stops answering fails the sample after timeout_s, not never
            return await self._generate(key, feed_ids, max_new_tokens, temperature, stop, seed)
        except TimeoutError:
            raise TimeoutError(
                f"{self.base_url} did not answer within {self.timeout_s:g} s (the engine's"
                " timeout_s)"
            ) from None

    async def _generate(self, key, feed_ids, max_new_tokens, temperature, stop, seed) -> GenOutput:
        history = self._history.setdefault(key, [])
        if not history:  # the key's prompt: one that cannot fit is a failed sample
            await self._session()  # learns max_model_len from /v1/models
            check_prompt_fits(len(feed_ids), self.max_model_len)
        history.extend(feed_ids)

        async def complete(ids, max_tokens, stops, request_seed):
            choice = await self._complete(ids, max_tokens, temperature, stops, request_seed)
            return (*self._ids_of(choice), choice.get("finish_reason"), choice.get("stop_reason"))

        return await generate_with_server_stops(
            complete, history, max_new_tokens, stop, seed, default_stops=(FENCE,)
        )

    def release(self, key: object) -> None:
        self._history.pop(key, None)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
