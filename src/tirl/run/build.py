"""A run's parts, built in one place from its config: the sandbox, the engine, the rollout
settings and the evaluation sets that `tirl train`, `eval`, `ablate` and `study` sample with.

- the sandbox: `sandbox.kind` (local, http, ray or a registered transport) through
  `tirl.sandbox.config.make_sandbox`; enter it with `async with`;
- the engine: `rollout.engine` with `rollout.engine_options` through the registry of
  `tirl.rollout.engines`. An engine that serves a saved model (vllm) is started from a copy of
  the live policy saved into the run folder, so it samples the weights the trainer holds now;
  after every update the trainer pushes its new weights into it (`RLTrainer.push_weights`).
  A LoRA policy is sampled as a plain model with its adapters merged (`tirl.models.lora`),
  which takes the merged weights again after every update;
- the rollout settings: the model-visible output limit (`sandbox.max_output_chars`) and the
  protocol (`protocol.name`, `protocol.boundary`) are the run's everywhere; limits, budget and
  temperature are the phase's.

The pipeline (RL's settings: `rl_settings`), the ablation, the study and `tirl eval`
(`tirl.apps.evaluate`) call these instead of building sandboxes, engines or settings by hand,
so every command samples the same way from the same config.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tirl.httpauth import client_key
from tirl.models.lora import is_lora, plain_copy
from tirl.models.sources import model_folder
from tirl.models.tiny import save_policy
from tirl.protocol import Protocol, get_protocol
from tirl.rollout.engines import ENGINES, EngineCapabilities, EngineSpec, make_engine
from tirl.rollout.limits import budget_at
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.run.config import RunConfig
from tirl.sandbox.api import SandboxClient
from tirl.sandbox.config import make_sandbox
from tirl.tasks import Mixture, Task
from tirl.tasks.registry import eval_set_tasks
from tirl.tools import toolset_protocol


def sandbox_for(cfg: RunConfig) -> SandboxClient:
    """The sandbox `sandbox.kind` names; `async with` it (it starts on entering)."""
    return make_sandbox(cfg.sandbox)


def run_protocol(cfg: RunConfig) -> Protocol:
    """The protocol SFT, RL and evaluation all write and read code in, with the run's tools."""
    return toolset_protocol(get_protocol(cfg.protocol.name, cfg.protocol.boundary), cfg.tools)


def rollout_settings(
    cfg: RunConfig,
    use_tools: bool,
    *,
    max_model_tokens: int,
    tool_budget: int,
    temperature: float,
    segment_tokens: int | None = None,
    segment_tool_calls: int | None = None,
) -> RolloutSettings:
    """A phase's settings; what the model is shown and the protocol are the run's."""
    return phase_settings(
        run_protocol(cfg),
        cfg.sandbox.max_output_chars,
        use_tools,
        max_model_tokens=max_model_tokens,
        tool_budget=tool_budget,
        temperature=temperature,
        segment_tokens=segment_tokens,
        segment_tool_calls=segment_tool_calls,
    )


def rl_settings(cfg: RunConfig, use_tools: bool) -> RolloutSettings:
    """RL's sampling: `rl.temperature` and the partial-rollout segments; the token limit and
    tool budget are the first step's (`RLTrainer.step` sets each step's own)."""
    return rollout_settings(
        cfg,
        use_tools,
        max_model_tokens=cfg.rl.max_model_tokens,
        tool_budget=budget_at(cfg.rl.budget_schedule, 0.0),
        temperature=cfg.rl.temperature,
        segment_tokens=cfg.rl.segment_tokens or None,
        segment_tool_calls=cfg.rl.segment_tool_calls or None,
    )


def phase_settings(
    protocol: Protocol,
    max_output_chars: int,
    use_tools: bool,
    *,
    max_model_tokens: int,
    tool_budget: int,
    temperature: float,
    segment_tokens: int | None = None,
    segment_tool_calls: int | None = None,
) -> RolloutSettings:
    """The one place rollout settings are made: `rollout_settings` from a run config, and
    tests and benchmarks that build a phase by hand."""
    return RolloutSettings(
        max_model_tokens=max_model_tokens,
        tool_budget=tool_budget,
        temperature=temperature,
        use_tools=use_tools,
        max_output_chars=max_output_chars,
        protocol=protocol,
        segment_tokens=segment_tokens,
        segment_tool_calls=segment_tool_calls,
    )


def eval_settings(cfg: RunConfig, use_tools: bool) -> RolloutSettings:
    """Evaluation's: `eval.max_model_tokens`, `eval.tool_budget`, greedy (the sampled avg@k
    pass sets its own temperature)."""
    return rollout_settings(
        cfg,
        use_tools,
        max_model_tokens=cfg.eval.max_model_tokens,
        tool_budget=cfg.eval.tool_budget,
        temperature=0.0,
    )


def engine_for(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    eos_id: int,
    policy_dir: Path | None = None,
) -> Any:
    """The engine `rollout.engine` names. `model` is the live policy (None when the run only
    evaluates servers); an engine that serves a saved model is started from `model` saved into
    `policy_dir` (or from `model.name_or_path` when there is no live policy)."""
    kind = ENGINES.get_entry(cfg.rollout.engine)
    model_path = cfg.model.name_or_path and model_folder(cfg.model.name_or_path)
    if "model_path" in kind.needs and model is not None:
        if policy_dir is None:
            raise ValueError(f"engine {cfg.rollout.engine} needs a folder to save the policy in")
        save_policy(model, tokenizer, policy_dir)
        model_path = str(policy_dir)
    if "model" in kind.needs and model is not None:
        if is_lora(model):  # the merged weights, in the base class (the fused path runs it)
            model = plain_copy(model)
        elif cfg.rl.staleness_bound:
            model = copy.deepcopy(model)  # sampled while the trainer updates the original
    spec = EngineSpec(
        model=model,
        model_path=model_path,
        tokenizer=tokenizer,
        eos_id=eos_id,
        dtype=cfg.model.dtype,
        device=cfg.device,
        seed=cfg.seed,
        max_batch=cfg.rollout_batch,
        urls=tuple(cfg.rollout.urls),
        api_key=client_key(),
    )
    return make_engine(cfg.rollout.engine, spec, cfg.rollout.engine_options)


def engine_capabilities(cfg: RunConfig) -> EngineCapabilities:
    """What the RL trainer may rely on from the engine `engine_for` builds: its kind's
    declaration (`tirl.rollout.engines.EngineKind`), and whether that engine samples the
    trained module itself, which `engine_for` decides (a copy under LoRA and
    rl.off_policy_steps >= 1)."""
    kind = ENGINES.get_entry(cfg.rollout.engine)
    copied = cfg.model.lora.rank > 0 or cfg.rl.staleness_bound > 0
    return EngineCapabilities(
        receives_weights=kind.receives_weights,
        logprobs_match_trainer=kind.logprobs_match_trainer,
        samples_trained_model="model" in kind.needs and not copied,
        sleeps_during_update=kind.sleeps(cfg.rollout.engine_options),
    )


def rollout_for(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    eos_id: int,
    sandbox: SandboxClient | None,
    policy_dir: Path | None = None,
) -> Rollout:
    """A `Rollout` over `engine_for(...)` and `sandbox` (None: the text-only variant)."""
    engine = engine_for(cfg, model, tokenizer, eos_id, policy_dir)
    return Rollout(engine, tokenizer, sandbox, max_trajectories=cfg.rollout.max_in_flight or None)


def eval_sets(cfg: RunConfig, mixture: Mixture) -> dict[str, list[Task]]:
    """The tasks of every `data.eval` set, by name (`tirl.tasks.registry.eval_set_tasks`)."""
    return eval_set_tasks(cfg.data.eval, mixture, cfg.seed)
