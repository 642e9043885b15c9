"""The engine interface (`tirl.backends.engine`), served by vLLM in this process (optional extra).

    pip install 'tirl[vllm]'

`VLLMEngine(model)` builds a `vllm.v1.engine.async_llm.AsyncLLM` (vLLM's asyncio engine with
continuous batching and prefix caching) and answers `generate(key, feed_ids, ...)` like the
other backends. Token ids in, token ids out: each key's ids are kept here and sent as a
`TokensPrompt`; the sampled ids come back as `CompletionOutput.token_ids`, with the sampled
token's log-probability (`SamplingParams(logprobs=0)`). vLLM's prefix cache plays the part of
`HFEngine`'s per-key KV cache, so `release` only forgets the ids.

Code boundaries: vLLM cannot run the rollout's stop function, so, as `OpenAIEngine` does, the
request stops at the protocol's `server_stop` strings (kept in the output) and the function is
checked here; a stop that is not a boundary (a fence that opens a block) continues with one
more request.

After a weight update (`update_weights` in an RL loop), reset vLLM's prefix cache: its
entries were computed under the old weights (see `tirl.rollout.runner` on re-prefill).

Not tested here: vLLM needs a GPU, and it is not a dependency. The request construction and
the output parsing are pure functions with tests; the engine path is a thin loop around them.
"""

from __future__ import annotations

import itertools
from typing import Any

from tirl.backends.engine import GenOutput, StopFn
from tirl.backends.server_stops import generate_with_server_stops

INSTALL_HINT = "VLLMEngine needs vLLM: pip install 'tirl[vllm]' (and a GPU vLLM supports)"


def _import_vllm():
    try:
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm, AsyncLLM


def sampling_kwargs(
    max_tokens: int, temperature: float, stops: tuple[str, ...], seed: int | None
) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one continuation request."""
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": 0,  # the sampled token's log-probability only
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,  # what the model sampled is what we record
        "detokenize": True,  # stop strings are matched on text
    }
    if stops:
        kwargs["stop"] = list(stops)
    if seed is not None:
        kwargs["seed"] = seed
    return kwargs


def parse_completion(completion) -> tuple[list[int], list[float], str | None, object]:
    """(ids, logprobs, finish_reason, stop_reason) of a `vllm.CompletionOutput`.

    `completion.logprobs` holds one {token id: Logprob} dict per sampled token; the sampled
    id's entry is always there when `logprobs=0` was asked for.
    """
    ids = list(completion.token_ids)
    logprobs = [0.0] * len(ids)
    if completion.logprobs is not None and len(completion.logprobs) == len(ids):
        logprobs = [float(step[i].logprob) for i, step in zip(ids, completion.logprobs)]
    return ids, logprobs, completion.finish_reason, completion.stop_reason


class VLLMEngine:
    """An in-process vLLM engine with the `generate(key, feed_ids, ...)` interface.

    `engine_kwargs` go to `vllm.AsyncEngineArgs` (e.g. `gpu_memory_utilization`,
    `tensor_parallel_size`, `enable_prefix_caching`).
    """

    _request_ids = itertools.count()
    receives_weights = False  # tirl implements no weight transfer into vLLM (verl does)

    def __init__(self, model: str, *, seed: int | None = None, **engine_kwargs: Any) -> None:
        vllm, async_llm = _import_vllm()
        self._vllm = vllm
        self.seed = seed
        self.llm = async_llm.from_engine_args(vllm.AsyncEngineArgs(model=model, **engine_kwargs))
        self._history: dict[object, list[int]] = {}

    async def _complete(
        self,
        ids: list[int],
        max_tokens: int,
        temperature: float,
        stops: tuple[str, ...],
        seed: int | None = None,
    ):
        params = self._vllm.SamplingParams(
            **sampling_kwargs(max_tokens, temperature, stops, self.seed if seed is None else seed)
        )
        prompt = self._vllm.TokensPrompt(prompt_token_ids=ids)
        final = None
        async for out in self.llm.generate(prompt, params, f"tirl-{next(self._request_ids)}"):
            final = out  # cumulative outputs: the last one holds the whole completion
        return final.outputs[0]

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
        history = self._history.setdefault(key, [])
        history.extend(feed_ids)

        async def complete(ids, max_tokens, stops, request_seed):
            completion = await self._complete(ids, max_tokens, temperature, stops, request_seed)
            return parse_completion(completion)

        return await generate_with_server_stops(complete, history, max_new_tokens, stop, seed)

    def release(self, key: object) -> None:
        self._history.pop(key, None)

    async def reset_prefix_cache(self) -> None:
        """Drop cached prefixes, e.g. after the policy's weights changed."""
        await self.llm.reset_prefix_cache()

    def close(self) -> None:
        self.llm.shutdown()
