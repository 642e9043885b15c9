"""What the RL trainer must know of the engine that samples for it, as one frozen value.

The trainer once found these out by probing the engine's attributes at run time
(`getattr(engine, "sleep_during_update", False)` and four more). It is now given them
(`RLTrainer(..., capabilities=...)`), so each switch says plainly what it depends on and a test
can set it without building an engine. Until the engine kinds declare them
(`tirl.rollout.engines`), `probe_capabilities` reads them off the engine as the probes did, in
this one place, so that leaving `capabilities` out changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tirl.config import ConfigError
from tirl.run.config import RLConfig
from tirl.train.distributed import DistContext


@dataclass(frozen=True)
class EngineCapabilities:
    """The engine's answers to the trainer's questions; the defaults fit no engine at all
    (an update on a batch handed in, as tests and benchmarks make)."""

    receives_weights: bool = False
    """The trainer awaits `engine.load_weights(model)` after every update and after a restored
    checkpoint (`tirl.backends.engine`: HF and vLLM engines; a server over HTTP does not)."""

    logprobs_match_trainer: bool = False
    """The engine's sampled log-probabilities are the trainer's own numbers (the trained weights
    or a copy, in their dtype, untempered), so `rl.old_logprobs: auto` may take them as pi_old
    and skip a scoring pass (tirl's HF engine)."""

    samples_trained_model: bool = False
    """The engine samples the very module being trained, not a copy: it cannot sample while
    that module updates, which `rl.one_step_off_policy` needs."""

    sleeps_during_update: bool = False
    """The engine frees memory through `await engine.pause()` before each update and wakes
    in `load_weights` (vLLM's sleep mode, `sleep_during_update`): it cannot sample during the
    update either."""


def probe_capabilities(engine: object | None, model: torch.nn.Module) -> EngineCapabilities:
    """The capabilities of `engine` (None: none) sampling for the trainer of `model`, read off
    its attributes exactly as the trainer's probes did before it was given them."""
    if engine is None:
        return EngineCapabilities()
    return EngineCapabilities(
        receives_weights=callable(getattr(engine, "load_weights", None)),
        logprobs_match_trainer=bool(getattr(engine, "logprobs_match_trainer", False)),
        samples_trained_model=getattr(engine, "model", None) is model,
        sleeps_during_update=bool(getattr(engine, "sleep_during_update", False)),
    )


def check_overlap(cfg: RLConfig, dist: DistContext | None, engine: EngineCapabilities) -> None:
    """Refuse `rl.one_step_off_policy` where nothing may sample while the policy updates."""
    if not cfg.one_step_off_policy:
        return
    if dist is not None:
        raise ConfigError("rl.one_step_off_policy does not run under torch.distributed yet")
    if engine.samples_trained_model:
        raise ConfigError(
            "rl.one_step_off_policy needs an engine that samples a copy of the"
            " weights, not the model being trained (tirl train makes one)"
        )
    if engine.sleeps_during_update:
        raise ConfigError(
            "rl.one_step_off_policy samples during the update, so the engine cannot"
            " sleep through it: drop sleep_during_update from rollout.engine_options"
        )
