"""The rollout engine a run samples with, chosen by `rollout.engine`.

- `hf`: `tirl.backends.hf.HFEngine` on the live policy in this process. It samples from the
  very weights the trainer updates, so it is the engine of SFT -> RL runs.
- `openai`: `tirl.backends.openai.OpenAIEngine` on an OpenAI-compatible server (vLLM, SGLang,
  `tirl serve`), or `tirl.rollout.router.Router` over several (prefix-aware, sticky sessions).
- `vllm`: `tirl.backends.vllm.VLLMEngine`, vLLM in this process, loaded from
  `model.name_or_path` (imported only when chosen).

Weight sync: only `hf` receives the trained weights. The others serve the weights they were
started with, so a run that trains (sft.steps or rl.steps > 0) with them is refused when its
config loads (`RunConfig.check_engine`): it would evaluate, or worse learn from, a stale policy.
Evaluation-only runs (both 0) may use any engine. This module imports no backend until one is
made, so the config can ask `receives_weights` before torch is imported. Close an engine with
`tirl.backends.engine.close_engine`.
"""

from __future__ import annotations

from typing import Any

# engine name -> whether it samples from the weights this process trains. A backend that
# declares `receives_weights` (tirl.backends.engine) is checked against this when made.
RECEIVES_WEIGHTS = {"hf": True, "openai": False, "vllm": False}


def receives_weights(engine: str) -> bool:
    return RECEIVES_WEIGHTS[engine]


def make_engine(cfg, model, eos_id: int, tokenizer=None) -> Any:
    """The engine `cfg.rollout.engine` names (`cfg` a `RunConfig`): for hf, on `model` (the
    live policy); for openai, on `cfg.rollout.urls` with `tokenizer` (the model's own); for
    vllm, from `cfg.model.name_or_path`."""
    kind = cfg.rollout.engine
    if kind == "hf":
        from tirl.backends.hf import HFEngine

        engine = HFEngine(model, eos_id, max_batch=cfg.rollout_batch, seed=cfg.seed)
    elif kind == "openai":
        from tirl.backends.openai import OpenAIEngine
        from tirl.httpauth import client_key

        clients = [
            OpenAIEngine(url, tokenizer, seed=cfg.seed, api_key=client_key())
            for url in cfg.rollout.urls
        ]
        if len(clients) == 1:
            engine = clients[0]
        else:
            from tirl.rollout.router import Router

            engine = Router(clients)
    elif kind == "vllm":
        from tirl.backends.vllm import VLLMEngine

        engine = VLLMEngine(cfg.model.name_or_path, seed=cfg.seed, dtype=cfg.model.dtype)
    else:  # the config's Literal keeps other names out
        raise ValueError(f"unknown rollout engine {kind!r}")
    declared = getattr(engine, "receives_weights", None)
    if declared is not None and bool(declared) != RECEIVES_WEIGHTS[kind]:
        raise AssertionError(f"engine {kind}: receives_weights disagrees with RECEIVES_WEIGHTS")
    return engine
