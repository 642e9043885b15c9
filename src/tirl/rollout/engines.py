"""Engines by name: the registry `rollout.engine` reads, and the built-in entries.

Each entry (`EngineKind`) holds a factory `(EngineSpec, **options) -> Engine`, whether the
engine receives the trainer's weights (`tirl.backends.engine`), and which parts of the spec it
needs. `rollout.engine_options` are the factory's keyword options, checked against its
signature when the config loads, so each engine documents its own knobs in one place.

- `hf`: `tirl.backends.hf.HFEngine` on the live policy in this process. It samples from the
  very weights the trainer updates.
- `vllm`: `tirl.backends.vllm.VLLMEngine`, vLLM in this process's engine processes, started
  from a saved copy of the policy; after every update the trainer pushes its weights into it.
- `openai`: `tirl.backends.openai.OpenAIEngine` on an OpenAI-compatible server (vLLM, SGLang,
  `tirl serve`), or `tirl.rollout.router.Router` over several (prefix-aware, sticky
  sessions). Servers hold their own weights: evaluation only.

An engine of your own is one file: its class (the interface of `tirl.backends.engine`) and a
factory decorated with `@register_engine("name", receives_weights=..., needs=(...))`. The
factories import their backend only when called, so the config can check names, options and
`receives_weights` before torch or vLLM is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tirl.backends.engine import Engine
from tirl.registry import Registry


@dataclass(frozen=True)
class EngineSpec:
    """What a run hands an engine factory; each engine reads the parts it needs."""

    model: Any = None  # the live policy in this process (a torch module), when there is one
    model_path: str | None = None  # a folder (or hub name) holding the weights to serve
    tokenizer: Any = None
    eos_id: int | None = None  # the id that ends a reply (a chat template's end of turn)
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    max_batch: int = 128  # sequences decoded together, where the engine batches itself
    urls: tuple[str, ...] = ()  # servers, for engines that are clients
    api_key: str | None = None  # bearer key for those servers


@dataclass(frozen=True)
class EngineCapabilities:
    """What a trainer must know of the engine that samples for it, declared by the engine's
    kind (`EngineKind`) and completed by the builder (`tirl.run.build.engine_capabilities`),
    never found out by probing an engine's attributes."""

    receives_weights: bool = False
    """The trainer awaits `engine.load_weights(model)` after every update and after a restored
    checkpoint (`tirl.backends.engine`: HF and vLLM engines; a server over HTTP does not)."""

    logprobs_match_trainer: bool = False
    """The engine's sampled log-probabilities are the trainer's own numbers (the trained weights
    or a copy, in their dtype, untempered), so `rl.old_logprobs: auto` may take them as pi_old
    and skip a scoring pass (tirl's HF engine)."""

    samples_trained_model: bool = False
    """The engine samples the very module being trained, not a copy: it cannot sample while
    that module updates, which `rl.off_policy_steps` >= 1 needs."""

    sleeps_during_update: bool = False
    """The engine frees memory through `await engine.pause()` before each update and wakes
    in `load_weights` (vLLM's sleep mode, `sleep_during_update`): it cannot sample during the
    update either."""


def _never(options: Mapping[str, Any]) -> bool:
    return False


@dataclass(frozen=True)
class EngineKind:
    """A registered engine: its factory, what it can do, and what a config must know before
    building it."""

    build: Callable[..., Engine]
    receives_weights: bool  # the trainer can push its weights into it after every update
    needs: tuple[str, ...] = ()  # EngineSpec fields that must be set
    # (options, device) -> why the engine cannot be built here, or None; run when the config
    # loads, so a missing package or a bad option is one line before any work starts
    check: Callable[[dict[str, Any], str], str | None] | None = None
    logprobs_match_trainer: bool = False  # see EngineCapabilities
    under_torchrun: bool = False  # each rank of a torchrun job samples with its own engine
    sleeps: Callable[[Mapping[str, Any]], bool] = _never  # (options) -> sleeps during updates


ENGINES: Registry[EngineKind] = Registry("rollout engine", entry_type=EngineKind)


def register_engine(
    name: str,
    *,
    receives_weights: bool,
    needs: tuple[str, ...] = (),
    check: Callable[[dict[str, Any], str], str | None] | None = None,
    logprobs_match_trainer: bool = False,
    under_torchrun: bool = False,
    sleeps: Callable[[Mapping[str, Any]], bool] = _never,
) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    """Decorator: register an engine factory `(spec: EngineSpec, **options) -> Engine` with
    what it can do (`EngineKind`)."""

    def add(build: Callable[..., Engine]) -> Callable[..., Engine]:
        kind = EngineKind(
            build, receives_weights, tuple(needs), check, logprobs_match_trainer,
            under_torchrun, sleeps,
        )  # fmt: skip
        ENGINES.add(name, kind)
        return build

    return add


def make_engine(name: str, spec: EngineSpec, options: Mapping[str, Any] | None = None) -> Engine:
    """Build the engine registered as `name` from `spec` and its keyword `options`."""
    kind = ENGINES.get_entry(name)
    missing = [need for need in kind.needs if getattr(spec, need) in (None, ())]
    if missing:
        raise ValueError(f"engine {name} needs {', '.join(missing)}")
    engine = kind.build(spec, **(options or {}))
    declared = getattr(engine, "receives_weights", None)
    if declared is not None and bool(declared) != kind.receives_weights:
        raise AssertionError(f"engine {name}: receives_weights disagrees with its registration")
    return engine


# ---------------------------------------------------------------- the built-in engines


def _hf_problem(options: dict[str, Any], device: str) -> str | None:
    """The HF engine's option values, checked when the config is (their names are checked
    against `hf_engine`'s signature)."""
    from tirl.backends.hf import KV_CACHES

    kv_cache, fused = options.get("kv_cache", "auto"), options.get("fused")
    threads = options.get("threads", 0)
    if kv_cache not in KV_CACHES:
        return f"engine_options.kv_cache is one of {', '.join(KV_CACHES)}, not {kv_cache!r}"
    if fused is not None and type(fused) is not bool:
        return f"engine_options.fused is true, false or null, not {fused!r}"
    if type(threads) is not int or threads < 0:
        return f"engine_options.threads is an integer >= 0 (0: the run's threads), not {threads!r}"
    return None


@register_engine(
    "hf",
    receives_weights=True,
    needs=("model", "eos_id"),
    check=_hf_problem,
    logprobs_match_trainer=True,
    under_torchrun=True,
)
def hf_engine(
    spec: EngineSpec, *, kv_cache: str = "auto", fused: bool | None = None, threads: int = 0
) -> Engine:
    """The live policy, continuously batched in this process. `kv_cache`: auto | slots |
    padded; `fused`: the slot cache's forward pass run from the weights (None: where the
    model is supported, `tirl.backends.fused`; false: through the model's modules);
    `threads`: at most this many torch threads for its steps (0: the run's; 1 is faster on
    the quickstart's tiny model, 2 on SmolLM2) (`tirl.backends.hf`)."""
    from tirl.backends.hf import HFEngine

    return HFEngine(
        spec.model,
        spec.eos_id,
        max_batch=spec.max_batch,
        seed=spec.seed,
        kv_cache=kv_cache,
        fused=fused,
        threads=threads,
    )


@register_engine("openai", receives_weights=False, needs=("urls", "tokenizer"))
def openai_engine(spec: EngineSpec, *, timeout_s: float = 600.0) -> Engine:
    """OpenAI-compatible servers; several are load-balanced by tirl's prefix-aware, sticky
    router. `timeout_s`: the longest one request may take."""
    from tirl.backends.openai import OpenAIEngine

    clients = [
        OpenAIEngine(url, spec.tokenizer, seed=spec.seed, api_key=spec.api_key, timeout_s=timeout_s)
        for url in spec.urls
    ]
    if len(clients) == 1:
        return clients[0]
    from tirl.rollout.router import Router

    return Router(clients)


def _vllm_problem(options: dict[str, Any], device: str) -> str | None:
    from tirl.backends.vllm import setup_problem

    return setup_problem(device=device, **options)


@register_engine(
    "vllm",
    receives_weights=True,
    needs=("model_path", "eos_id"),
    check=_vllm_problem,
    sleeps=lambda options: bool(options.get("sleep_during_update")),
)
def vllm_engine(
    spec: EngineSpec,
    *,
    dtype: str | None = None,
    kv_cache_gb: float | None = None,
    gpu_memory_utilization: float = 0.5,
    max_model_len: int | None = None,
    enforce_eager: bool = True,
    sleep_during_update: bool = False,
) -> Engine:
    """vLLM in this process (its engine runs in processes of its own), from `model_path`.
    `dtype`: the engine's, when it should differ from model.dtype (a bf16 sampler for an fp32
    trainer); `kv_cache_gb`: the KV cache (default 1 on CPU; on a GPU,
    `gpu_memory_utilization` of it); `max_model_len`: default the model's context;
    `enforce_eager`: no CUDA graphs or torch.compile (starts in seconds); `sleep_during_update`:
    on a GPU, free the KV cache while the trainer updates (vLLM's sleep mode) and wake it for
    the next rollout (`tirl.backends.vllm`)."""
    from tirl.backends.vllm import VLLMEngine

    return VLLMEngine(
        spec.model_path,
        eos_id=spec.eos_id,
        seed=spec.seed,
        dtype=dtype or spec.dtype,
        device=spec.device,
        kv_cache_gb=kv_cache_gb,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        sleep_during_update=sleep_during_update,
    )
