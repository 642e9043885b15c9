"""What the RL trainer must know of the engine that samples for it
(`tirl.rollout.engines.EngineCapabilities`), and the refusals that follow from it.

The trainer once found these out by probing the engine's attributes at run time
(`getattr(engine, "sleep_during_update", False)` and four more). It is now given them
(`RLTrainer(..., capabilities=...)`): a run's come from its engine kind's declaration and its
config (`tirl.run.build.engine_capabilities`). An engine built by hand (tests, benchmarks) and
handed in without them is read by `probe_capabilities`, in this one place.
"""

from __future__ import annotations

import torch

from tirl.config import ConfigError
from tirl.rollout.engines import EngineCapabilities
from tirl.run.config import RLConfig
from tirl.train.distributed import DistContext


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
    """Refuse a staleness bound k >= 1 (`rl.off_policy_steps`, `rl.one_step_off_policy`)
    where nothing may sample while the policy updates."""
    if not cfg.staleness_bound:
        return
    key = cfg.off_policy_key
    if dist is not None:
        raise ConfigError(f"{key} does not run under torch.distributed yet", key)
    if engine.samples_trained_model:
        raise ConfigError(
            f"{key} needs an engine that samples a copy of the weights, not the model being"
            " trained (tirl train makes one)",
            key,
        )
    if engine.sleeps_during_update:
        raise ConfigError(
            f"{key} samples during the update, so the engine cannot sleep through it: drop"
            " sleep_during_update from rollout.engine_options",
            key,
        )
