"""`tirl serve`: the HF backend behind an OpenAI-compatible completions API, on loopback.

It exists so the HTTP path (`tirl.backends.openai.OpenAIEngine`, which also talks to vLLM and
SGLang) is exercised against a real server, and so a small model can be shared by several
evaluation processes. Endpoints: `GET /v1/models`, `GET /health`, `POST /v1/completions` with
`prompt` (text or token ids), `max_tokens`, `temperature`, `stop` (strings), `seed`, and the vLLM
extensions `return_token_ids`, `include_stop_str_in_output` and `logprobs`. Every request joins
the engine's continuous batch. One choice per request (`n` = 1); no streaming.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from tirl.backends.hf import HFEngine


def _bad(message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error"}}, status=400
    )


class CompletionServer:
    def __init__(self, engine: HFEngine, tokenizer, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 << 20)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model_name, "object": "model"}]}
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "model": self.model_name, "requests": self.requests}
        )

    async def completions(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _bad("the body is not JSON")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            ids = list(prompt)
        else:
            return _bad("prompt must be a string or a non-empty list of token ids")
        max_tokens = body.get("max_tokens", 16)
        temperature = body.get("temperature", 1.0)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _bad("max_tokens must be a positive integer")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            return _bad("temperature must be a non-negative number")
        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            return _bad("seed must be an integer")
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        self.requests += 1
        key = uuid.uuid4().hex
        hit: list[str] = []

        def stop_fn(new_ids: list[int]) -> bool:
            text = self.tokenizer.decode(new_ids, skip_special_tokens=False)
            found = [s for s in stops if s in text]
            if found:
                hit.append(min(found, key=text.index))
            return bool(found)

        try:
            out = await self.engine.generate(
                key,
                ids,
                max_new_tokens=max_tokens,
                temperature=float(temperature),
                stop=stop_fn if stops else None,
                seed=seed,
            )
        finally:
            self.engine.release(key)
        text = self.tokenizer.decode(
            out.ids, skip_special_tokens=bool(body.get("skip_special_tokens", True))
        )
        finish, stop_reason = out.finish_reason, None
        if finish == "boundary":
            finish, stop_reason = "stop", hit[-1]
            if not body.get("include_stop_str_in_output", False):
                text = text[: text.index(stop_reason)]
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = out.ids
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"token_logprobs": out.logprobs}
        return web.json_response(
            {
                "id": f"cmpl-{key}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(ids),
                    "completion_tokens": len(out.ids),
                    "total_tokens": len(ids) + len(out.ids),
                },
            }
        )


def serve(model_path: str, host: str, port: int, max_batch: int = 64, seed: int = 0) -> None:
    """Run until SIGINT/SIGTERM; prints `tirl serve: listening on http://HOST:PORT` when ready."""
    from tirl.models.tiny import load_policy

    model, tokenizer = load_policy(model_path)
    model.eval()
    engine = HFEngine(model, tokenizer.eos_token_id, max_batch=max_batch, seed=seed)
    server = CompletionServer(engine, tokenizer, model_path)

    async def main() -> None:
        runner = web.AppRunner(server.app())
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # the real port when port is 0
        print(f"tirl serve: listening on http://{host}:{bound}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()
            engine.close()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
