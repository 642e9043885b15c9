"""`tirl verl config`: a tirl run config (`tirl.run.config.RunConfig`) as Hydra overrides of
verl 0.9.1's `ppo_trainer` config, for `python -m verl.trainer.main_ppo`.

Every key of `RunConfig` has a row in `MAPPING`: the verl keys it sets, or the written reason
it has none (tirl's agent loop applies it, or it has no role in a verl launch). A test fails
when a config key has no row, and another when the translation sets a verl key no row names.
What the translation sets without a tirl key behind it (the agent loop's name, no KL in the
reward, AdamW without weight decay as tirl's trainer runs it, ...) is listed in `FIXED` with
its reason. A switch verl cannot express (an estimator neither verl nor
`tirl.integrations.verl.estimators` registers, a policy loss other than PPO-clip, an
estimator's extra parameters, ...) is a one-line `ConfigError` naming the key.

The agent loop reads the tirl config itself: the overrides carry its absolute path and the
command-line overrides given with it as `tirl.config` / `tirl.overrides`, and
`run_config_from_verl(verl_config)` rebuilds the same `RunConfig` in a verl worker. The file
must be readable where verl's workers run (a shared path on a multi-node cluster, like the
data files and the model).

verl names checked against verl 0.9.1: `trainer/config/_generated_ppo_trainer.yaml`,
`workers/config/actor.py` (FSDPActorConfig), `workers/config/rollout.py` (RolloutConfig),
`workers/config/optimizer.py`, `trainer/config/algorithm.py` (AlgoConfig), and the v1 trainer
(`trainer/ppo/v1`: `trainer.v1.trainer_mode`, `trainer.v1.sampler`). Not covered: Megatron
(`actor.megatron.*`), LoRA, the cluster shape (`trainer.nnodes`, `trainer.n_gpus_per_node`,
`rollout.tensor_model_parallel_size`) and the data files (`data.train_files`,
`data.val_files`, written by `tirl verl data`): the launch command adds those. Overrides
appended after these win (Hydra keeps the last value of a key).

Partial rollouts (`rl.segment_tokens` / `segment_tool_calls` > 0) select the v1 trainer's
`colocate_async` mode (verl 0.9.1 `trainer/ppo/v1/trainer_colocate_async.py`: at the end of
a step's sampling the unfinished requests are aborted and resumed under the new weights by
`FullyAsyncLLMServerClient`). A multi-node run with rollout GPUs of its own appends
`trainer.v1.trainer_mode=separate_async` and its resources (`trainer/ppo/v1/
trainer_separate_async.py`; it needs train_batch_size = parameter_sync_step *
ppo_mini_batch_size and a non-naive checkpoint engine). The pass-rate curriculum
(`rl.curriculum`) sets `data.custom_cls` to tirl's `CurriculumDataset`
(`tirl.integrations.verl.curriculum`), which needs the synchronous trainer: it is refused with
partial rollouts or `rl.adaptive_batch`. The older
`verl.experimental.fully_async_policy` entry point (`async_training.partial_rollout`) is not
targeted. The v1 trainer imports `transfer_queue` (verl's `verl-core` extra, package
TransferQueue), as do the async modes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping as MappingABC
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tirl.cliargs import check_model_source
from tirl.config import ConfigError, load_config
from tirl.integrations.verl import AGENT_LOOP_NAME
from tirl.integrations.verl.config_table import (
    _ACTOR,
    _AR,
    _RESPONSE,
    _ROLLOUT,
    _V1,
    CURRICULUM_DATASET,
    CURRICULUM_KEYS,
    CURRICULUM_MODULE,
    CURRICULUM_SECTION,
    DUAL_CLIP_OFF,
    MAX_PROMPT_TOKENS,
    PLUGIN_MODULE,
    TIRL_SECTION,
)
from tirl.models.sources import model_folder
from tirl.run.config import RunConfig

VERL_ENTRYPOINT = "verl.trainer.main_ppo"

# Keys verl's schema does not have: Hydra needs `+key=value` to add them.
_ADDED_KEYS = (
    TIRL_SECTION,
    CURRICULUM_SECTION,
    "actor_rollout_ref.actor.fsdp_config.mixed_precision",
)

_OUTCOME_ESTIMATORS = ("grpo", "drgrpo", "rloo")

_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


# ---------------------------------------------------------------- what verl cannot express


def _refusal(key: str, why: str) -> ConfigError:
    return ConfigError(f"{key}: {why} (tirl verl config)", key)


def verl_estimator(advantage: str, gamma: float) -> tuple[str, bool]:
    """(verl's `algorithm.adv_estimator`, `norm_adv_by_std_in_grpo`) for tirl's estimator
    `advantage`; ConfigError when verl has none. The tirl_* names are registered by
    `tirl.integrations.verl.estimators.register_estimators`."""
    from tirl.integrations.verl.estimators import TIRL_ESTIMATOR_NAMES

    native = {"grpo": ("grpo", True), "drgrpo": ("grpo", False), "rloo": ("rloo", True)}
    if gamma == 1.0:  # verl's REINFORCE++-baseline ignores gamma; at 1 it equals tirl's
        native["reinforce++-baseline"] = ("reinforce_plus_plus_baseline", True)
    if advantage in native:
        return native[advantage]
    if advantage in TIRL_ESTIMATOR_NAMES:
        return TIRL_ESTIMATOR_NAMES[advantage], True
    known = ", ".join(sorted({*native, *TIRL_ESTIMATOR_NAMES}))
    raise _refusal(
        "rl.advantage",
        f"{advantage!r} has no verl estimator; tirl's under verl: {known} (add one to"
        " tirl.integrations.verl.estimators)",
    )


def check_expressible(cfg: RunConfig) -> None:
    """ConfigError (one line, naming the key) for a switch a verl launch cannot honour."""
    rl = cfg.rl
    if cfg.model.name_or_path is None:
        raise _refusal(
            "model.name_or_path",
            "verl trains a saved model: set a model folder or hub name (tirl's tiny model made"
            " from scratch exists only in tirl's own trainer)",
        )
    check_model_source(cfg.model.name_or_path, "model.name_or_path")
    if rl.steps == 0:
        raise _refusal("rl.steps", "is 0: a verl RL launch needs at least one step")
    if len(cfg.variants) != 1:
        raise _refusal("variants", f"one verl launch trains one policy; pick one of {cfg.variants}")
    if rl.advantage_params:
        raise _refusal("rl.advantage_params", "verl passes no extra parameters to an estimator")
    if cfg.rollout.agent.command:
        raise _refusal(
            "rollout.agent.command",
            "verl samples with its own agent loop, not an agent program through tirl's gateway",
        )
    if cfg.model.lora.rank and cfg.model.lora.dropout:
        raise _refusal("model.lora.dropout", "verl's LoRA has no dropout: set it to 0")
    if rl.advantage in _OUTCOME_ESTIMATORS and rl.gamma != 1.0:
        raise _refusal("rl.gamma", f"{rl.advantage!r} is an outcome estimator: gamma must be 1")
    verl_estimator(rl.advantage, rl.gamma)
    if rl.policy_loss != "ppo_clip":
        raise _refusal("rl.policy_loss", f"{rl.policy_loss!r}: verl runs tirl's ppo_clip only")
    if rl.policy_loss_params:
        raise _refusal("rl.policy_loss_params", "ppo_clip takes no extra parameters in verl")
    if rl.prompts_per_step % rl.updates_per_step:
        raise _refusal(
            "rl.updates_per_step",
            f"{rl.updates_per_step} must divide rl.prompts_per_step ({rl.prompts_per_step}):"
            " verl sizes its minibatches in prompts (actor.ppo_mini_batch_size)",
        )
    if rl.loss_agg == "seq-mean-token-sum-norm" and rl.stages:
        raise _refusal(
            "rl.loss_agg",
            "seq-mean-token-sum-norm with rl.stages: tirl divides by the current stage's"
            " model-token limit, verl's loss_scale_factor is one constant",
        )
    if rl.curriculum.enabled and rl.adaptive_batch:
        raise _refusal(
            "rl.curriculum.enabled",
            "with rl.adaptive_batch: verl refills dropped groups in the middle of a step, so"
            " the curriculum would draw on whichever groups happened to finish (docs/verl.md)",
        )
    if rl.curriculum.enabled and _partial_rollouts(cfg):
        raise _refusal(
            "rl.curriculum.enabled",
            "with partial rollouts: verl's asynchronous trainer fetches prompts ahead of the"
            " pass rates they should depend on; the curriculum needs the synchronous trainer",
        )
    if not re.fullmatch(r"cuda(:\d+)?|cpu", cfg.device):
        raise _refusal("device", f"{cfg.device!r}: verl runs on cuda (or cpu for checks)")


# ---------------------------------------------------------------- the translation


def tool_reply_tokens(cfg: RunConfig) -> int:
    """An upper bound on the tokens of one interpreter reply: the shown output (at most
    `sandbox.max_output_chars` characters, truncation marker included) plus the protocol's
    output wrapper. It counts one token per byte, true of byte-level BPE (every token covers
    at least one byte) for ASCII output; the marker's two '…' add 4 bytes. Non-ASCII output
    can exceed it: the loop then stops the trajectory at verl's response length."""
    from tirl.protocol import get_protocol

    protocol = get_protocol(cfg.protocol.name, cfg.protocol.boundary)
    wrapper = len((protocol.output_open + protocol.output_close).encode())
    return cfg.sandbox.max_output_chars + 4 + wrapper


def max_response_tokens(cfg: RunConfig) -> int:
    """verl's `data.max_response_length`: model plus interpreter tokens of the longest
    trajectory any limit allows (training stages or schedule, and evaluation). verl pads
    responses to it and cuts longer ones, so it must hold everything tirl's loop produces."""
    rl = cfg.rl
    model_limits = [cfg.eval.max_model_tokens, *(s.max_model_tokens for s in rl.stages)]
    budgets = [cfg.eval.tool_budget, *(s.tool_budget for s in rl.stages)]
    if not rl.stages:
        model_limits.append(rl.max_model_tokens)
        budgets += [int(budget) for _, budget in rl.budget_schedule]
    if cfg.variants == ["text"]:
        budgets = [0]
    return max(model_limits) + max(budgets) * tool_reply_tokens(cfg)


def _partial_rollouts(cfg: RunConfig) -> bool:
    return cfg.rl.segment_tokens > 0 or cfg.rl.segment_tool_calls > 0


def verl_settings(cfg: RunConfig) -> dict[str, Any]:
    """The verl settings of `cfg`: dotted verl key -> value (the tirl section aside).

    Raises ConfigError for a switch verl cannot express (`check_expressible`).
    """
    check_expressible(cfg)
    rl, ev = cfg.rl, cfg.eval
    response = max_response_tokens(cfg)
    estimator, norm_by_std = verl_estimator(rl.advantage, rl.gamma)
    compute_dtype = "bf16" if rl.bf16 else _DTYPES[cfg.model.dtype]
    loggers = ["console"] + ["tensorboard"] * cfg.log_tensorboard + ["wandb"] * cfg.log_wandb
    s: dict[str, Any] = {
        # model
        f"{_AR}.model.path": model_folder(cfg.model.name_or_path),  # a .gguf: its folder
        f"{_AR}.model.enable_gradient_checkpointing": cfg.model.gradient_checkpointing,
        f"{_AR}.model.external_lib": PLUGIN_MODULE,
        f"{_ACTOR}.fsdp_config.model_dtype": _DTYPES[cfg.model.dtype],
        f"{_ACTOR}.fsdp_config.mixed_precision.param_dtype": compute_dtype,
        # rollout: verl's servers, tirl's loop
        f"{_ROLLOUT}.name": "vllm",
        f"{_ROLLOUT}.mode": "async",
        f"{_ROLLOUT}.multi_turn.enable": True,
        f"{_ROLLOUT}.agent.default_agent_loop": AGENT_LOOP_NAME,
        f"{_ROLLOUT}.calculate_log_probs": True,
        f"{_ROLLOUT}.n": rl.group_size,
        f"{_ROLLOUT}.temperature": rl.temperature,
        f"{_ROLLOUT}.seed": cfg.seed,
        "data.max_prompt_length": MAX_PROMPT_TOKENS,
        "data.filter_overlong_prompts": False,
        _RESPONSE: response,
        "data.train_batch_size": rl.prompts_per_step,
        "data.seed": cfg.seed,
        # the policy loss
        f"{_ACTOR}.policy_loss.loss_mode": "vanilla",
        f"{_ACTOR}.clip_ratio_low": rl.clip_low,
        f"{_ACTOR}.clip_ratio_high": rl.clip_high,
        f"{_ACTOR}.clip_ratio_c": DUAL_CLIP_OFF if rl.clip_ratio_c is None else rl.clip_ratio_c,
        f"{_ACTOR}.loss_agg_mode": rl.loss_agg,
        f"{_ACTOR}.entropy_coeff": rl.entropy_coef,
        f"{_ACTOR}.use_kl_loss": rl.kl_coef > 0,
        f"{_ACTOR}.kl_loss_coef": rl.kl_coef,
        f"{_ACTOR}.kl_loss_type": rl.kl_estimator,
        "algorithm.use_kl_in_reward": False,
        # the update
        f"{_ACTOR}.ppo_mini_batch_size": rl.prompts_per_step // rl.updates_per_step,
        f"{_ACTOR}.ppo_epochs": 1,
        f"{_ACTOR}.shuffle": True,
        f"{_ACTOR}.data_loader_seed": cfg.seed,
        f"{_ACTOR}.optim.lr": rl.lr,
        f"{_ACTOR}.optim.lr_warmup_steps": rl.warmup_steps,
        f"{_ACTOR}.optim.lr_scheduler_type": "constant",
        f"{_ACTOR}.optim.weight_decay": 0.0,
        f"{_ACTOR}.optim.clip_grad": rl.max_grad_norm,
        # advantages
        "algorithm.adv_estimator": estimator,
        "algorithm.norm_adv_by_std_in_grpo": norm_by_std,
        "algorithm.gamma": rl.gamma,
        # the schedule, checkpoints, validation, logging
        "trainer.total_training_steps": rl.steps,
        "trainer.total_epochs": rl.steps,
        "trainer.save_freq": rl.checkpoint_every or rl.steps,
        "trainer.test_freq": ev.every_rl_steps or rl.steps,
        "trainer.val_before_train": True,
        "trainer.log_val_generations": ev.saved_samples,
        "trainer.project_name": "tirl",
        "trainer.experiment_name": cfg.name,
        "trainer.default_local_dir": f"{cfg.out_dir}/{cfg.name}/checkpoints",
        "trainer.logger": loggers,
        "trainer.device": cfg.device.split(":")[0],
    }
    if rl.loss_agg == "seq-mean-token-sum-norm":  # tirl divides by the model-token limit
        s[f"{_ACTOR}.loss_scale_factor"] = rl.max_model_tokens
    if rl.micro_batch_tokens > 0:
        s[f"{_ACTOR}.use_dynamic_bsz"] = True
        s[f"{_ACTOR}.ppo_max_token_len_per_gpu"] = rl.micro_batch_tokens
    elif rl.micro_batch_size > 0:
        s[f"{_ACTOR}.use_dynamic_bsz"] = False
        for key in (
            f"{_ACTOR}.ppo_micro_batch_size_per_gpu",
            f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu",
            f"{_AR}.ref.log_prob_micro_batch_size_per_gpu",
        ):
            s[key] = rl.micro_batch_size
    else:
        s[f"{_ACTOR}.use_dynamic_bsz"] = True
        s[f"{_ACTOR}.ppo_max_token_len_per_gpu"] = MAX_PROMPT_TOKENS + response
    if rl.tis_cap is not None:  # verl's decoupled mode with token-level TIS
        s["algorithm.rollout_correction.rollout_is"] = "token"
        s["algorithm.rollout_correction.rollout_is_threshold"] = rl.tis_cap
    if rl.old_logprobs == "sampler":
        s["algorithm.rollout_correction.bypass_mode"] = True
    if rl.adaptive_batch:
        s["algorithm.filter_groups.enable"] = True
        s["algorithm.filter_groups.metric"] = "reward"
    if _partial_rollouts(cfg):
        s[f"{_V1}.trainer_mode"] = "colocate_async"
        staleness = rl.max_staleness
        s[f"{_V1}.sampler.max_off_policy_threshold"] = None if staleness is None else staleness + 1
    if rl.curriculum.enabled:
        s.update(curriculum_settings(cfg))
    lora = cfg.model.lora
    if lora.rank:  # verl's own LoRA (peft in its FSDP workers; vLLM serves the adapters)
        s[f"{_AR}.model.lora_rank"] = lora.rank
        s[f"{_AR}.model.lora_alpha"] = lora.alpha
        all_linear = lora.targets == ["all-linear"]
        s[f"{_AR}.model.target_modules"] = "all-linear" if all_linear else list(lora.targets)
    if ev.samples_per_item > 0:
        val = {"n": ev.samples_per_item, "do_sample": True, "temperature": ev.temperature}
    else:
        val = {"n": 1, "do_sample": False, "temperature": 0.0}
    s.update({f"{_ROLLOUT}.val_kwargs.{k}": v for k, v in val.items()})
    return s


def curriculum_settings(cfg: RunConfig) -> dict[str, Any]:
    """The verl settings of `rl.curriculum` (`tirl.integrations.verl.curriculum`): tirl's
    dataset class, dataloading in the trainer's process, and what the dataset reads (with the
    rows of a step and the file its per-step metrics go to)."""
    cur = cfg.rl.curriculum
    s: dict[str, Any] = {
        "data.custom_cls.path": f"pkg://{CURRICULUM_MODULE}",
        "data.custom_cls.name": CURRICULUM_DATASET,
        "data.dataloader_num_workers": 0,
    }
    for name in CURRICULUM_KEYS:
        s[f"{CURRICULUM_SECTION}.{name}"] = getattr(cur, name)
    s[f"{CURRICULUM_SECTION}.group_size"] = cfg.rl.group_size
    s[f"{CURRICULUM_SECTION}.run"] = cfg.name
    s[f"{CURRICULUM_SECTION}.batch_size"] = cfg.rl.prompts_per_step
    s[f"{CURRICULUM_SECTION}.metrics_file"] = f"{cfg.out_dir}/{cfg.name}/curriculum_metrics.jsonl"
    return s


def tirl_section(config_path: str | Path | None, overrides: Sequence[str] = ()) -> dict:
    """The `tirl` section of the verl config (dotted keys): where tirl's agent loop finds the
    run config. Empty without a path."""
    if config_path is None:
        return {}
    return {
        f"{TIRL_SECTION}.config": str(Path(config_path).resolve()),
        f"{TIRL_SECTION}.overrides": list(overrides),
    }


# ---------------------------------------------------------------- output forms

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_RESERVED = {"true", "false", "null", "nan", "inf"}


def hydra_value(value: Any) -> str:
    """`value` in Hydra's override grammar: bools as true/false, None as null, numbers as
    Python writes them (Hydra reads `1e-06` as a float), lists as [a,b], strings bare when
    they are plain names or paths and otherwise single-quoted, with a backslash before a quote
    or a backslash."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no finite float: {value}")
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED:
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    raise TypeError(f"no Hydra form for {type(value).__name__}")


def _override(key: str, value: Any) -> str:
    added = any(key == k or key.startswith(k + ".") for k in _ADDED_KEYS)
    return f"{'+' if added else ''}{key}={hydra_value(value)}"


def verl_items(
    cfg: RunConfig, config_path: str | Path | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Dotted verl key -> value: `verl_settings(cfg)` plus, with `config_path`, the `tirl`
    section telling tirl's agent loop where the run config is (and the `overrides` given
    with it)."""
    return {**verl_settings(cfg), **tirl_section(config_path, overrides)}


def verl_overrides(
    cfg: RunConfig, config_path: str | Path | None = None, overrides: Sequence[str] = ()
) -> list[str]:
    """`cfg` as Hydra override strings for verl's `ppo_trainer`, one `key=value` each (`+key`
    for keys verl's schema lacks), in `verl_items`' order."""
    return [_override(k, v) for k, v in verl_items(cfg, config_path, overrides).items()]


def nested(items: MappingABC[str, Any]) -> dict:
    """Dotted keys -> a nested mapping (`{"a.b": 1}` -> `{"a": {"b": 1}}`)."""
    tree: dict = {}
    for key, value in items.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def verl_yaml(items: MappingABC[str, Any]) -> str:
    """A Hydra config file holding these settings on top of verl's `ppo_trainer`: run it with
    `python -m verl.trainer.main_ppo --config-path DIR --config-name NAME` (NAME without
    `.yaml`). Keys verl's schema lacks are merged in like the others."""
    import yaml

    head = {
        "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
        "defaults": ["ppo_trainer", "_self_"],
    }
    return yaml.safe_dump({**head, **nested(items)}, sort_keys=False)


# ---------------------------------------------------------------- command and loop entry points

FORMATS = ("lines", "yaml", "shell")


def translate(
    source: str | Path | RunConfig, overrides: Sequence[str] = (), fmt: str = "lines"
) -> str:
    """The verl overrides of a run config (a YAML file plus `overrides`, or a `RunConfig`):
    `lines` one per line, `shell` a launch command, `yaml` a Hydra config file."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if isinstance(source, RunConfig):
        if overrides:
            raise ConfigError("overrides apply to a config file, not to a RunConfig object")
        cfg, path = source, None
    else:
        cfg, path = load_config(RunConfig, source, overrides), source
    if fmt == "yaml":
        return verl_yaml(verl_items(cfg, path, overrides))
    lines = verl_overrides(cfg, path, overrides)
    if fmt == "shell":
        import shlex

        args = " \\\n    ".join(shlex.quote(line) for line in lines)
        return f"python -m {VERL_ENTRYPOINT} \\\n    {args}\n"
    return "\n".join(lines) + "\n"


def run_config_command(config_path: str, overrides: Sequence[str] = (), fmt: str = "lines") -> int:
    """`tirl verl config CONFIG [key=value ...] [--format lines|yaml|shell]`: print the verl
    overrides; 0 on success (a ConfigError propagates to the CLI's one-line error)."""
    print(translate(config_path, overrides, fmt), end="")
    return 0


def run_config_from_verl(verl_config: MappingABC) -> RunConfig:
    """The tirl run config a verl launch was translated from, rebuilt from verl's config (the
    `tirl` section these overrides add): what tirl's agent loop runs with."""
    section = verl_config.get(TIRL_SECTION) if hasattr(verl_config, "get") else None
    if not section or not section.get("config"):
        raise ConfigError(
            f"the verl config has no {TIRL_SECTION}.config: launch verl with the overrides"
            " `tirl verl config CONFIG` prints",
            f"{TIRL_SECTION}.config",
        )
    return load_config(RunConfig, section["config"], list(section.get("overrides") or ()))
