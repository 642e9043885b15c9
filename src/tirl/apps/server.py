"""`tirl serve`: the HF backend behind an OpenAI-compatible API.

It exists so the HTTP path (`tirl.backends.openai.OpenAIEngine`, which also talks to vLLM and
SGLang) is exercised against a real server, and so a small model can be shared by several
evaluation processes. Endpoints:

- `GET /v1/models` (with vLLM's `max_model_len`), `GET /v1/models/{id}`;
- `POST /v1/completions`: `prompt` as text, token ids, or a list of either;
- `POST /v1/chat/completions`: `messages` rendered with the tokenizer's chat template
  (`add_generation_prompt=True`); 400 when the tokenizer has none. With `tools`, OpenAI tool
  calls as vLLM's hermes parser serves them (`tirl.apps.server_tools`): the tools and the
  conversation's calls rendered by the template, or the way tirl's `hermes_tools` writes them
  where the template is plain ChatML; the completion's `<tool_call>` blocks come back as
  `message.tool_calls` with `finish_reason: "tool_calls"` (streamed: the completion's text
  and calls come whole at its end, a content delta and a tool_calls delta);
- `GET /health`: 200 while the engine's step loop serves requests, 503 once it has died or
  while the server drains; with the key it also says what is running, queued and held.

Both generation endpoints take `max_tokens`, `temperature`, `n` (each choice has its own seed
stream: choice 0 uses `seed` itself, so `n = 1` is the same request as before), `stop`, `seed`,
`stream` (server-sent events as the OpenAI API sends them: `data: {chunk}` lines, then
`data: [DONE]`; `stream_options.include_usage` adds a usage chunk) and vLLM's
`return_token_ids`, `include_stop_str_in_output`, `skip_special_tokens`; completions also take
`logprobs` (0 or 1). What the server accepts, and the 400 for everything else, is in
`tirl.apps.server_requests`: every request is checked whole before it joins the engine's
continuous batch, so no request can fail another.

Load (`HFEngine.set_limits`, set by `tirl.apps.serve`): the KV cache is bounded by a budget
of positions; a request waits in the engine's queue, first come first served, until its
prompt + max_tokens fits what the requests in flight leave of it, and one that could never
fit is a 400 naming the budget. The server holds at most `max_queue` choices (prompts x n)
at once, running or waiting: beyond that a request is a 429 naming the limit. Prompts are
prefilled a chunk a step, so a long one does not stall the others' tokens, and a client
that hangs up (aiohttp cancels its handler) has its choices dropped within a step, their
rows and budget freed. When nothing is in flight the KV cache is handed back, so the
process's memory follows its load.

Shutdown (`serve`): the first SIGTERM or SIGINT drains: new generation requests get 503,
requests in flight (streams too, to their `data: [DONE]`) finish within `drain_timeout_s`,
then the process exits 0; a second signal exits at once (128 + its number).

Failures: a request whose generation fails gets a 500 of its own; the step loop goes on (see
`HFEngine`: a step that fails fails only that step's requests). Every error is JSON,
`{"error": {"message", "type", "param", "code"}}`, `param` naming the field at fault.

Authentication (`tirl.httpauth`): with an API key every route but `/health` needs
`Authorization: Bearer <key>` (401 otherwise); `/health` without the key says only its status.

Limits: log-probs are those of the unscaled policy (temperature 1) and only of the sampled
tokens; streamed text is held back while it could still become a stop string or an incomplete
UTF-8 character, and assumes the tokenizer's decoding of a prefix is a prefix of the decoding
of the whole (true of byte-level BPE); no top_p/top_k, penalties, logit bias, echo.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tirl.apps.server_requests import (
    BadRequest,
    GenerationRequest,
    ModelLimits,
    parse_body,
    parse_chat,
    parse_completion,
    token_bytes_bound,
)
from tirl.backends.hf import HFEngine
from tirl.httpauth import (
    auth_middleware,
    bind_refusal,
    is_loopback,
    redact_health,
    stop_signals,
    wait_idle,
)

MAX_BODY_BYTES = 16 << 20


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    kind: str | None = None,
) -> web.Response:
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    if code is None and status == 401:
        code = "invalid_api_key"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own errors (no such route, wrong method, body too large) as JSON too, and an
    unexpected exception as a 500 of this request alone."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if e.status == 413:
            return error_response(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", "body")
        response = error_response(e.status, f"{e.reason}: {request.method} {request.path}")
        if "Allow" in e.headers:
            response.headers["Allow"] = e.headers["Allow"]
        return response
    except (ConnectionError, asyncio.CancelledError):
        raise  # the client went away: there is nobody to answer
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        return error_response(500, f"internal error: {type(e).__name__}: {e}")


@dataclass
class _Choice:
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: str | None


def choice_seed(seed: int | None, j: int) -> int | None:
    """The seed of choice `j` of a request with `seed`: the seed itself for choice 0 (so `n = 1`
    is unchanged), a hash of (seed, j) in [0, 2**63) for the others, so that choice j of seed s
    never equals choice 0 of another seed s + j."""
    if seed is None or j == 0:
        return seed
    digest = hashlib.sha256(f"tirl-serve-choice:{seed}:{j}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# Called from the engine's step loop with (new ids so far, their decoded text); must not block.
TokenHook = Callable[[list[int], str], None]


class CompletionServer:
    def __init__(
        self,
        engine: HFEngine,
        tokenizer,
        model_name: str,
        api_key: str | None = None,
        max_queue: int | None = None,
    ) -> None:
        """`max_queue`: choices (prompts x n) held at once, running or waiting for room
        (None: no bound)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.api_key = api_key
        self.max_queue = max_queue
        vocab = engine.model.get_input_embeddings().num_embeddings
        self.limits = ModelLimits(
            frozenset({model_name}),
            vocab,
            engine.max_len,
            token_bytes_bound(tokenizer),
            engine.kv_budget,
        )
        self.requests = 0  # accepted generation requests
        self.failures = 0  # of which failed in the engine (answered 500)
        self.choices = 0  # choices held now (running or waiting in the engine)
        self.created = int(time.time())
        self.draining = False  # after SIGTERM: new generation requests get 503
        self._handling = 0  # generation requests being handled (streams to their end)
        self._idle = asyncio.Event()
        self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new generation requests and wait, at most `timeout_s`, until those being
        handled have been answered in full (a stream to its `[DONE]`); True if they were."""
        self.draining = True
        return await wait_idle(self._idle, timeout_s)

    def application(self) -> web.Application:
        """An app with this server's body limit, JSON errors and authentication, no routes."""
        return web.Application(
            client_max_size=MAX_BODY_BYTES,
            middlewares=[_json_errors, auth_middleware(self.api_key, error_response)],
        )

    def app(self) -> web.Application:
        app = self.application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    # -- small endpoints ---------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "tirl",
            "max_model_len": self.limits.max_request,  # the budget, if below the context
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.model_name:
            return error_response(
                404, f"the model {name!r} does not exist here", "model", "model_not_found"
            )
        return web.json_response(self._model_card())

    async def health(self, request: web.Request) -> web.Response:
        alive = self.engine.loop_alive()
        engine = self.engine
        details: dict[str, Any] = {
            "status": "ok" if alive and not self.draining else "unhealthy",
            "model": self.model_name,
            "requests": self.requests,
            "failed_requests": self.failures,
            "running": engine.running,
            "queued": engine.queued,
            "kv_budget": engine.kv_budget,
            "kv_reserved": engine.kv_reserved,
            "kv_allocated": engine.kv_allocated,
        }
        if self.draining:
            details["status"] = "draining"
            details["reason"] = "the server is shutting down: requests in flight finish"
        if not alive:
            details["reason"] = "the engine's step loop died: requests in flight cannot finish"
        ok = alive and not self.draining
        return web.json_response(redact_health(request, details), status=200 if ok else 503)

    # -- generation --------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_completion)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, parse_chat)

    async def _serve(self, request: web.Request, parse) -> web.StreamResponse:
        """A generation request, counted from its first byte to its last (what `drain`
        waits for)."""
        if self.draining:
            response = error_response(503, "the server is shutting down; retry elsewhere")
            response.force_close()
            return response
        self._handling += 1
        self._idle.clear()
        try:
            return await self._generate(request, parse)
        finally:
            self._handling -= 1
            if not self._handling:
                self._idle.set()

    async def _generate(self, request: web.Request, parse) -> web.StreamResponse:
        raw = await request.read()  # over MAX_BODY_BYTES: a 413 from the middleware
        try:  # JSON decoding and tokenizing in a thread: a long prompt never stalls the loop
            req = await asyncio.to_thread(
                lambda: parse(parse_body(raw), self.limits, self.tokenizer)
            )
        except BadRequest as e:
            return error_response(e.status, str(e), e.param, e.code)
        choices = req.n * len(req.prompts)
        refusal = self._queue_refusal(choices, "n" if req.n > 1 else "prompt")
        if refusal is not None:
            return refusal
        self.requests += 1
        self.choices += choices
        try:
            return await self._answer(request, req)
        finally:
            self.choices -= choices

    def _queue_refusal(self, choices: int, param: str) -> web.Response | None:
        """A 429 when `choices` more would overfill the queue (a 400 naming `param` when they
        never fit)."""
        limit = self.max_queue
        if limit is None:
            return None
        if choices > limit:
            return error_response(
                400,
                f"this request has {choices} choices (prompts x n): more than this server"
                f" holds at once ({limit}, tirl serve --max-queue)",
                param,
            )
        if self.choices + choices > limit:
            response = error_response(
                429,
                f"the server is full: {self.choices} choices are running or waiting and this"
                f" request adds {choices}, past the limit of {limit} (tirl serve --max-queue);"
                " retry later",
                code="queue_full",
                kind="rate_limit_error",
            )
            response.headers["Retry-After"] = "1"
            return response
        return None

    async def _answer(self, request: web.Request, req: GenerationRequest) -> web.StreamResponse:
        rid = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex
        if req.stream:
            return await self._stream(request, req, rid)
        jobs = [
            self._choice(req, ids, m, choice_seed(req.seed, j))
            for ids, m in zip(req.prompts, req.max_tokens)
            for j in range(req.n)
        ]
        try:
            choices = await _all_or_none(jobs)
        except Exception as e:  # the engine failed this request; the loop serves the others
            self.failures += 1
            traceback.print_exc(file=sys.stderr)
            return error_response(500, f"generation failed: {type(e).__name__}: {e}")
        body = self._envelope(req, rid)
        body["choices"] = [self._choice_json(req, i, c) for i, c in enumerate(choices)]
        body["usage"] = self._usage(req, choices)
        return web.json_response(body)

    async def _choice(
        self,
        req: GenerationRequest,
        ids: list[int],
        max_tokens: int,
        seed: int | None,
        on_token: TokenHook | None = None,
    ) -> _Choice:
        """One choice through the engine's continuous batch."""
        key = uuid.uuid4().hex
        hit: list[str | None] = []  # the stop string found (None: a closed tool call)
        at_call = req.tools is not None and req.tools.stop_at_call

        def decode(new_ids: list[int]) -> str:
            return self.tokenizer.decode(new_ids, skip_special_tokens=req.skip_special)

        def stop_fn(new_ids: list[int]) -> bool:
            # The stop strings are matched in the text as it will be returned (same
            # skip_special_tokens), so the one found is always there to cut at.
            text = decode(new_ids)
            found = [s for s in req.stops if s in text]
            if found:
                hit.append(min(found, key=text.index))
                return True
            if at_call and req.tools.closed(text):  # parallel_tool_calls false: one call
                hit.append(None)
                return True
            if on_token is not None:
                on_token(new_ids, text)
            return False

        try:
            out = await self.engine.generate(
                key,
                ids,
                max_new_tokens=max_tokens,
                temperature=req.temperature,
                stop=stop_fn if req.stops or on_token or at_call else None,
                seed=seed,
            )
        finally:
            self.engine.release(key)
        text = decode(out.ids)
        finish, stop_reason = out.finish_reason, None
        if finish == "boundary":
            finish, stop_reason = "stop", hit[-1]
            if stop_reason is not None and not req.include_stop:
                cut = text.find(stop_reason)
                text = text if cut < 0 else text[:cut]
        choice = _Choice(out.ids, out.logprobs, text, finish, stop_reason)
        if req.on_choice is not None:
            req.on_choice(ids, choice)
        return choice

    def _envelope(self, req: GenerationRequest, rid: str, chunk: bool = False) -> dict[str, Any]:
        kind = "chat.completion" if req.chat else "text_completion"
        return {
            "id": rid,
            "object": kind + ".chunk" if chunk and req.chat else kind,
            "created": int(time.time()),
            "model": self.model_name,
        }

    def _choice_json(self, req: GenerationRequest, index: int, c: _Choice) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        finish = c.finish_reason
        if req.chat:
            # With tools, the calls the completion holds; its text (what the gateway splices
            # the next prompt with) stays the completion as sampled.
            called = req.tools.message(c.text) if req.tools is not None else None
            out["message"] = called or {"role": "assistant", "content": c.text}
            finish = "tool_calls" if called else finish
            out["logprobs"] = None
        else:
            out["text"] = c.text
            out["logprobs"] = None
            if req.logprobs:
                out["logprobs"] = {
                    "tokens": [self.tokenizer.decode([i]) for i in c.ids],
                    "token_logprobs": c.logprobs,
                    "top_logprobs": None,
                }
        out["finish_reason"] = finish
        out["stop_reason"] = c.stop_reason
        if req.return_token_ids:
            out["token_ids"] = c.ids
        return out

    @staticmethod
    def _usage(req: GenerationRequest, choices: list[_Choice]) -> dict[str, int]:
        prompt = sum(len(p) for p in req.prompts)
        completion = sum(len(c.ids) for c in choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(
        self, request: web.Request, req: GenerationRequest, rid: str
    ) -> web.StreamResponse:
        """Server-sent events: one chunk per choice and new text, a last chunk per choice with
        its finish_reason, a usage chunk if asked, then `data: [DONE]`."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        events: asyncio.Queue = asyncio.Queue()
        specs = [
            (ids, m, choice_seed(req.seed, j))
            for ids, m in zip(req.prompts, req.max_tokens)
            for j in range(req.n)
        ]
        tasks = [
            asyncio.ensure_future(self._streamed_choice(req, index, *spec, events))
            for index, spec in enumerate(specs)
        ]
        finished = 0

        async def send(data: dict[str, Any] | str) -> None:
            text = data if isinstance(data, str) else json.dumps(data)
            await response.write(f"data: {text}\n\n".encode())

        try:
            if req.chat:  # the role comes first, as the OpenAI API sends it
                for index in range(len(specs)):
                    await send(self._chunk(req, rid, index, "", [], None, None, role=True))
            while finished < len(specs):
                kind, index, payload = await events.get()
                if kind == "error":
                    self.failures += 1
                    traceback.print_exception(payload, file=sys.stderr)
                    message = f"generation failed: {type(payload).__name__}: {payload}"
                    await send({"error": {"message": message, "type": "server_error"}})
                    break
                await send(self._chunk(req, rid, index, *payload))
                finished += kind == "end"
            else:
                if req.include_usage:
                    usage = self._envelope(req, rid, chunk=True)
                    usage.update(choices=[], usage=self._usage(req, [t.result() for t in tasks]))
                    await send(usage)
            await send("[DONE]")
            await response.write_eof()
        except ConnectionError:
            pass  # the client left; the finally below stops its generations
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return response

    async def _streamed_choice(
        self,
        req: GenerationRequest,
        index: int,
        ids: list[int],
        max_tokens: int,
        seed: int | None,
        events: asyncio.Queue,
    ) -> _Choice:
        # Text is sent only once it cannot become part of a stop string (the longest one's
        # length - 1 characters are held back) nor turn out to be half a UTF-8 character.
        hold = 0 if req.include_stop or not req.stops else max(map(len, req.stops)) - 1
        sent_chars = sent_ids = 0

        def on_token(new_ids: list[int], text: str) -> None:
            nonlocal sent_chars, sent_ids
            end = len(text) - hold
            while end > sent_chars and text[end - 1] == "\ufffd":
                end -= 1
            delta = text[sent_chars:end] if end > sent_chars else ""
            fresh = new_ids[sent_ids:] if req.return_token_ids else []
            if delta or fresh:
                events.put_nowait(("delta", index, (delta, fresh, None, None, None)))
                sent_chars, sent_ids = max(end, sent_chars), len(new_ids)

        # With tools, text may turn out to be a call, known only once the completion is
        # whole: it is sent at the end, as content and tool_calls deltas (vLLM's order).
        hook = None if req.tools is not None else on_token
        try:
            c = await self._choice(req, ids, max_tokens, seed, hook)
        except Exception as e:
            events.put_nowait(("error", index, e))
            raise
        rest_ids = c.ids[sent_ids:] if req.return_token_ids else []
        text, finish, calls = c.text[sent_chars:], c.finish_reason, None
        called = req.tools.message(c.text) if req.tools is not None else None
        if called:
            text, finish, calls = called["content"] or "", "tool_calls", called["tool_calls"]
        events.put_nowait(("end", index, (text, rest_ids, finish, c.stop_reason, calls)))
        return c

    def _chunk(
        self,
        req: GenerationRequest,
        rid: str,
        index: int,
        text: str,
        ids: list[int],
        finish: str | None,
        stop_reason: str | None,
        calls: list[dict] | None = None,
        role: bool = False,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if req.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            if calls:  # whole calls, each with its index in the message, as deltas carry them
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        if finish is not None:
            choice["stop_reason"] = stop_reason
        if req.return_token_ids and not role:
            choice["token_ids"] = ids
        return {**self._envelope(req, rid, chunk=True), "choices": [choice]}


async def _all_or_none(jobs: list) -> list:
    """Await every job; if one fails, cancel the others and raise its error."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def serve(
    engine: HFEngine,
    tokenizer,
    model_name: str,
    host: str,
    port: int,
    api_key: str | None = None,
    insecure_no_auth: bool = False,
    *,
    max_queue: int | None,
    drain_timeout_s: float,
) -> None:
    """Serve `engine` (the model `model_name`, built through the engine registry by
    `tirl.apps.serve`) until SIGTERM or SIGINT, then drain (the module docstring) and close
    it; prints `tirl serve: listening on http://HOST:PORT` when ready. Refuses (ValueError) a
    non-loopback `host` without `api_key` unless `insecure_no_auth`; an address it cannot
    bind raises OSError."""
    refusal = bind_refusal(host, api_key, insecure_no_auth, "--api-key-env")
    if refusal:
        raise ValueError(refusal)

    async def main() -> None:
        server = CompletionServer(engine, tokenizer, model_name, api_key, max_queue)
        stop = stop_signals(_say)
        # handler_cancellation: a client that hangs up stops its generation at the next step.
        # The drain has already waited for the handlers: cleanup waits no more.
        runner = web.AppRunner(
            server.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            bound = runner.addresses[0][1]  # the real port when port is 0
            url_host = f"[{host}]" if ":" in host else host
            print(f"tirl serve: listening on http://{url_host}:{bound}", flush=True)
            if not is_loopback(host):
                what = (
                    "no API key: anyone who can reach this port can use it"
                    if api_key is None
                    else "no TLS: the API key and the traffic cross the network in clear text"
                )
                _say(f"warning: listening on {host} with {what}")
            await stop.wait()
            _say(
                f"stopping: finishing {server.choices} choices in flight (at most"
                f" {drain_timeout_s:g} s; a second signal stops at once)"
            )
            if not await server.drain(drain_timeout_s):
                _say(f"stopping: {server.choices} choices cut after {drain_timeout_s:g} s")
        finally:
            await runner.cleanup()
            engine.close()

    with contextlib.suppress(KeyboardInterrupt):  # a Ctrl-C before the handlers are set
        asyncio.run(main())


def _say(message: str) -> None:
    print(f"tirl serve: {message}", file=sys.stderr, flush=True)
