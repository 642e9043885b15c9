"""An OpenAI-compatible chat client for the teacher and the judge, with a request cache.

- `/v1/chat/completions` first; a server without it (404/405), or whose model has no chat
  template (a 400 saying so, as `tirl serve` and vLLM answer for a base model), gets the
  messages rendered as one plain-text prompt instead, and the client remembers that for later
  requests.
- At most `concurrency` requests in flight (a semaphore); 429, 5xx, timeouts and connection
  errors are retried with exponential backoff (backoff_s, 2 backoff_s, ...); any other status is
  a `TeacherError` with the server's message.
- Every answer is stored in an append-only JSONL cache keyed by a hash of (model, messages,
  parameters) *before* the caller sees it, so a re-run (or a resume after a crash) sends no
  request whose answer it already has. The cache also carries each answer's `usage`, which is
  where the token and cost totals come from (so they survive restarts).
- `max_requests` (for tests and dry runs) refuses to *send* more than that many requests: the
  refusal happens before the network, so an interrupted run never loses a paid-for answer.

Not covered: streaming, `n` > 1, tool-calling APIs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tirl.httpauth import DEFAULT_KEY_ENV, bearer
from tirl.synth.config import EndpointConfig

RETRY_STATUSES = {429, 500, 502, 503, 504}


class TeacherError(RuntimeError):
    """The endpoint refused a request for good (not retryable, or out of retries)."""


class RequestBudgetExceeded(RuntimeError):
    """`max_requests` requests were sent; raised before sending another one."""


@dataclass
class Usage:
    requests: int = 0  # sent over the network by this process
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens: int = 0  # over every answer in the cache (all runs)
    completion_tokens: int = 0

    def cost(self, cfg: EndpointConfig) -> float:
        return (
            self.prompt_tokens * cfg.price_prompt_per_1k
            + self.completion_tokens * cfg.price_completion_per_1k
        ) / 1000


def messages_as_prompt(messages: list[dict[str, str]]) -> str:
    """The plain-text prompt sent to a completions-only server."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"


class RequestCache:
    """Answers by request key, in an append-only JSONL file (a torn last line is ignored)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a write cut short by a crash: that answer is asked for again
                self.entries[entry["key"]] = entry
        path.parent.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, entry: dict[str, Any]) -> None:
        self.entries[entry["key"]] = entry
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


class ChatClient:
    def __init__(
        self, cfg: EndpointConfig, cache_path: Path, max_requests: int | None = None
    ) -> None:
        self.cfg = cfg
        self.base = cfg.url.rstrip("/")
        self.cache = RequestCache(cache_path)
        self.max_requests = max_requests
        self.usage = Usage()
        for entry in self.cache.entries.values():
            self._count(entry.get("usage") or {})
        self._gate = asyncio.Semaphore(cfg.concurrency)
        self._http: aiohttp.ClientSession | None = None
        self._chat = True  # False once the server turned out to lack /v1/chat/completions
        self._model = cfg.model
        self._inflight: dict[str, asyncio.Future] = {}

    def _count(self, usage: dict[str, Any]) -> None:
        self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)

    def key(self, messages: list[dict[str, str]], params: dict[str, Any]) -> str:
        blob = json.dumps(
            {"model": self.cfg.model, "messages": messages, "params": params},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    async def chat(self, messages: list[dict[str, str]], **params: Any) -> str:
        """The assistant's answer text (from the cache when this exact request was answered)."""
        params = {"temperature": self.cfg.temperature, "max_tokens": self.cfg.max_tokens, **params}
        key = self.key(messages, params)
        hit = self.cache.get(key)
        if hit is not None:
            self.usage.cache_hits += 1
            return hit["text"]
        if key in self._inflight:  # the same request from another item: share its answer
            self.usage.cache_hits += 1
            return await asyncio.shield(self._inflight[key])
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            text = await self._ask(key, messages, params)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(e)
                future.exception()  # marked retrieved: no warning when nobody shared it
            raise
        finally:
            del self._inflight[key]
        future.set_result(text)
        return text

    async def _ask(self, key: str, messages, params) -> str:
        async with self._gate:
            if self.max_requests is not None and self.usage.requests >= self.max_requests:
                raise RequestBudgetExceeded(f"max_requests={self.max_requests} reached")
            self.usage.requests += 1
            text, usage = await self._send(messages, params)
        self.cache.put({"key": key, "text": text, "usage": usage})
        self._count(usage)
        return text

    async def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # The key in `api_key_env`; without one, $TIRL_API_KEY (the key of `tirl serve`).
            key_env = self.cfg.api_key_env or DEFAULT_KEY_ENV
            headers = bearer(os.environ.get(key_env) or None)
            timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
            # trust_env=False: never route through a proxy from the environment.
            self._http = aiohttp.ClientSession(timeout=timeout, headers=headers, trust_env=False)
        return self._http

    async def _model_name(self) -> str:
        if self._model is None:
            data = await self._post_or_get("GET", "/v1/models", None)
            self._model = data["data"][0]["id"]
        return self._model

    async def _send(self, messages, params) -> tuple[str, dict[str, Any]]:
        model = await self._model_name()
        if self._chat:
            body = {"model": model, "messages": messages, **params}
            try:
                data = await self._post_or_get("POST", "/v1/chat/completions", body)
                return data["choices"][0]["message"]["content"] or "", data.get("usage") or {}
            except _NoRoute:
                self._chat = False
        body = {"model": model, "prompt": messages_as_prompt(messages), **params}
        data = await self._post_or_get("POST", "/v1/completions", body)
        return data["choices"][0]["text"] or "", data.get("usage") or {}

    async def _post_or_get(self, method: str, path: str, body: dict | None) -> dict[str, Any]:
        http = await self._session()
        for attempt in range(self.cfg.max_retries + 1):
            last = attempt == self.cfg.max_retries
            try:
                async with http.request(method, self.base + path, json=body) as r:
                    if r.status in (404, 405) and path == "/v1/chat/completions":
                        raise _NoRoute
                    if r.status == 200:
                        return await r.json(content_type=None)
                    message = (await r.text())[:300]
                    if r.status == 400 and path == "/v1/chat/completions" and _no_template(message):
                        raise _NoRoute  # a base model's server (tirl serve, vLLM) cannot chat
                    if r.status not in RETRY_STATUSES or last:
                        raise TeacherError(
                            f"{method} {self.base}{path}: HTTP {r.status}: {message}"
                        )
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                if last:
                    raise TeacherError(
                        f"{method} {self.base}{path}: {type(e).__name__}: {e}"
                    ) from None
            self.usage.retries += 1
            await asyncio.sleep(self.cfg.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


class _NoRoute(Exception):
    pass


def _no_template(message: str) -> bool:
    """Whether a 400 says the model has no chat template (tirl serve and vLLM say so)."""
    return "chat template" in message.lower()
