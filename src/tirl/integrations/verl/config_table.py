"""The table behind `tirl verl config` (`tirl.integrations.verl.config`): for every key of
tirl's `RunConfig`, the verl 0.9.1 keys it sets, or the written reason it sets none (tirl's
agent loop applies it, or it has no role in a verl launch); and `FIXED`, what the translation
sets with no tirl key behind it. Tests check that every config key has a row and that the
translation sets no verl key the table does not name."""

from __future__ import annotations

from dataclasses import dataclass

from tirl.integrations.verl import AGENT_LOOP_NAME
from tirl.run.config import RunConfig

# Imported by verl's HFModelConfig (`model.external_lib`) in every process that builds the
# model config -- the agent-loop workers and the trainer: it registers tirl's loop.
PLUGIN_MODULE = "tirl.integrations.verl.agent_loop"
TIRL_SECTION = "tirl"  # the verl config key holding {config: PATH, overrides: [...]}

# `rl.curriculum` under verl: the dataset class (`data.custom_cls`) and the data-config
# section it reads (the curriculum settings, the group size and the run name).
CURRICULUM_MODULE = "tirl.integrations.verl.curriculum"
CURRICULUM_DATASET = "CurriculumDataset"
CURRICULUM_SECTION = "data.tirl_curriculum"
CURRICULUM_KEYS = (
    "key", "band", "window", "min_groups", "explore", "order_by", "widen_share", "lookahead",
)  # fmt: skip
_CURRICULUM_VERL_KEYS = tuple(
    f"{CURRICULUM_SECTION}.{k}"
    for k in (*CURRICULUM_KEYS, "group_size", "run", "batch_size", "metrics_file")
)

# tirl's prompts are short problem statements; verl needs a bound (prompts are left-padded to
# it) and errors on a longer prompt (data.truncation: error), so none is dropped silently.
MAX_PROMPT_TOKENS = 1024

# tirl's `clip_ratio_c: null` (no dual clip) in verl, which always applies one: both clamp the
# log-ratio to [-20, 20] before exp, so the ratio never exceeds e^20 ~ 4.9e8 < 1e9, and
# -A * 1e9 > -A * ratio for every A < 0: the dual-clip bound is never the active one.
DUAL_CLIP_OFF = 1e9


# ---------------------------------------------------------------- the mapping table


@dataclass(frozen=True)
class Row:
    """How one tirl config key reaches verl: `verl` lists the verl keys it sets (empty when
    none); `where` is "verl" (verl applies it), "loop" (tirl's agent loop applies it, from the
    run config it reads) or "none" (no role in a verl launch); `note` says how or why."""

    verl: tuple[str, ...]
    where: str
    note: str


def _verl(*keys: str, note: str = "") -> Row:
    return Row(keys, "verl", note)


def _loop(note: str, also: tuple[str, ...] = ()) -> Row:
    """Applied by tirl's loop; `also` lists verl keys the value bounds or feeds."""
    return Row(also, "loop", note)


def _none(note: str) -> Row:
    return Row((), "none", note)


_AR = "actor_rollout_ref"
_ACTOR = f"{_AR}.actor"
_ROLLOUT = f"{_AR}.rollout"
_RESPONSE = "data.max_response_length"
# The keys a longer trajectory bound moves: the response length and, with dynamic batches,
# the token budget per GPU (at least one whole sequence).
_RESPONSE_KEYS = (_RESPONSE, f"{_ACTOR}.ppo_max_token_len_per_gpu")
_V1 = "trainer.v1"

# One row per RunConfig key (dotted, as `tirl config --keys` lists them). A key ending in
# ".*" covers a whole section that has no role in a verl launch.
MAPPING: dict[str, Row] = {
    # ---- the run
    "plugins": _loop(
        "imported wherever the run config is loaded: by the launch and in the agent loop's"
        " workers, so what they register is there too"
    ),
    "name": _verl(
        "trainer.experiment_name",
        "trainer.default_local_dir",
        f"{CURRICULUM_SECTION}.run",
        f"{CURRICULUM_SECTION}.metrics_file",
        note="with rl.curriculum: names the pass-rate board (a Ray actor) the dataset reads",
    ),
    "out_dir": _verl(
        "trainer.default_local_dir",
        f"{CURRICULUM_SECTION}.metrics_file",
        note="checkpoints in OUT_DIR/NAME/checkpoints; with rl.curriculum, the curriculum's"
        " per-step metrics in OUT_DIR/NAME/curriculum_metrics.jsonl",
    ),
    "seed": _verl(
        "data.seed",
        f"{_ROLLOUT}.seed",
        f"{_ACTOR}.data_loader_seed",
        note="the prompt order (with rl.curriculum: the curriculum's draws), vLLM's sampling"
        " seed and the minibatch order (verl repeats a row n times with the same fields, so"
        " the loop cannot seed each sample apart)",
    ),
    "variants": _loop(
        "one verl launch trains one policy: exactly one variant (code: the interpreter is"
        " offered; text: it is not, and no tool tokens bound the response), run by the loop;"
        " two are refused",
        also=_RESPONSE_KEYS,
    ),
    "device": _verl("trainer.device", note="cuda:N -> cuda: verl places its own workers"),
    "threads": _none("torch threads of tirl's own process; verl's workers set their own"),
    "parallel_variants": _none(
        "tirl's own pipeline, one process per variant; a verl launch trains one policy"
    ),
    "rollout_batch": _none("decode batch of tirl's HF engine; vLLM schedules its own batches"),
    "protocol.name": _loop(
        "how code and tool output are written: the loop's exact-match stops; its output"
        " wrapper counts in the tool replies' bound",
        also=_RESPONSE_KEYS,
    ),
    "protocol.boundary": _loop(
        "exact_match: the loop stops generation at the code block's closing marker (server"
        " stops); stop_token: at the output marker the model writes"
    ),
    "tools": _loop(
        "the tools whose blocks the loop's rollout detects and runs (tirl.tools), all in the"
        " trajectory's one sandbox session"
    ),
    "log_tensorboard": _verl("trainer.logger"),
    "log_wandb": _verl("trainer.logger"),
    # ---- data and prompts
    "data.train": _none(
        "exported to parquet by `tirl verl data`; the launch sets data.train_files to it"
    ),
    "data.eval": _none("exported to parquet by `tirl verl data`; the launch sets data.val_files"),
    "prompt.chat": _loop("the prompt is rendered by tirl from the row's serialized task"),
    "prompt.system": _loop("the prompt is rendered by tirl from the row's serialized task"),
    # ---- engine and model
    "rollout.engine": _none(
        "tirl's own trainer's sampler; under verl, verl's vLLM servers sample"
        " (actor_rollout_ref.rollout.name is fixed to vllm)"
    ),
    "rollout.max_in_flight": _none(
        "tirl's own rollouts; verl's agent-loop workers schedule their requests themselves"
    ),
    "rollout.urls": _none("tirl's own OpenAI-client engine; verl starts and routes its servers"),
    "rollout.engine_options": _none(
        "options of tirl's own engines; verl configures the vLLM servers it starts"
    ),
    "rollout.agent.command": _none(
        "must be empty: an agent program through tirl's gateway samples in tirl's own trainer;"
        " under verl, verl's agent loop samples"
    ),
    "rollout.agent.timeout_s": _none("tirl's own trainer's agent program"),
    "rollout.agent.concurrency": _none("tirl's own trainer's agent program"),
    "model.name_or_path": _verl(f"{_AR}.model.path", note="required: verl loads a saved model"),
    "model.arch": _none("shape of the tiny model tirl makes from scratch, never used by verl"),
    "model.hidden_size": _none("shape of the tiny model tirl makes from scratch"),
    "model.layers": _none("shape of the tiny model tirl makes from scratch"),
    "model.heads": _none("shape of the tiny model tirl makes from scratch"),
    "model.max_positions": _none(
        "context of the tiny model; verl's context is prompt + response length"
    ),
    "model.vocab_size": _none("vocabulary of the tiny model's tokenizer"),
    "model.tokenizer_corpus_items": _none("training corpus of the tiny model's tokenizer"),
    "model.dtype": _verl(
        f"{_ACTOR}.fsdp_config.model_dtype",
        f"{_ACTOR}.fsdp_config.mixed_precision.param_dtype",
        note="the weights' dtype (FSDP's master copy); vLLM serves in verl's default bfloat16,"
        " which shows as the rollout/actor log-prob gap",
    ),
    "model.gradient_checkpointing": _verl(f"{_AR}.model.enable_gradient_checkpointing"),
    "model.lora.rank": _verl(
        f"{_AR}.model.lora_rank",
        f"{_AR}.model.lora_alpha",
        f"{_AR}.model.target_modules",
        note="verl's own LoRA; 0 (full fine-tuning) writes none of them",
    ),
    "model.lora.alpha": _verl(f"{_AR}.model.lora_alpha", note="with model.lora.rank > 0"),
    "model.lora.targets": _verl(f"{_AR}.model.target_modules", note="with model.lora.rank > 0"),
    "model.lora.dropout": _none("verl's LoRA has no dropout: refused unless 0 (with a rank)"),
    # ---- sandbox: the loop opens sessions with these limits
    "sandbox.kind": _loop(
        "where the loop's sessions run: local (each agent-loop worker), ray (a pool in verl's"
        " Ray cluster), http (tirl sandbox serve); +tirl.sandbox.* sets it for one launch"
    ),
    "sandbox.urls": _loop("the sandbox servers of kind http the loop's sessions go to"),
    "sandbox.actors": _loop("sandbox actors per agent-loop worker's pool (kind ray)"),
    "sandbox.timeout_s": _loop("sandbox limits of the loop's sessions"),
    "sandbox.memory_mb": _loop("sandbox limits of the loop's sessions"),
    "sandbox.max_output_chars": _loop(
        "shown tool output; also bounds the tool tokens in data.max_response_length",
        also=_RESPONSE_KEYS,
    ),
    "sandbox.preload": _loop("modules imported once by the loop's sandbox"),
    "sandbox.cpu_s": _loop("sandbox limits of the loop's sessions"),
    "sandbox.kill_background": _loop("sandbox limits of the loop's sessions"),
    "sandbox.grace_s": _loop("sandbox limits of the loop's sessions"),
    "sandbox.capture_chars": _loop("sandbox limits of the loop's sessions"),
    "sandbox.file_size_mb": _loop("sandbox limits of the loop's sessions"),
    "sandbox.max_open_files": _loop("sandbox limits of the loop's sessions"),
    "sandbox.max_processes": _loop("sandbox limits of the loop's sessions"),
    "sandbox.disk_mb": _loop("sandbox limits of the loop's sessions"),
    "sandbox.options": _loop("a plugin transport's own settings"),
    # ---- SFT: a separate verl launch
    "sft.*": _none(
        "SFT is its own launch: `tirl verl sft-data` exports the demonstrations for verl's SFT"
        " trainer, and RL starts from model.name_or_path"
    ),
    # ---- RL
    "rl.steps": _verl(
        "trainer.total_training_steps",
        "trainer.total_epochs",
        "trainer.save_freq",
        "trainer.test_freq",
        note="total_epochs = steps, so the parquet's passes never end the run first (tirl's"
        " sources cycle); the budget schedule's fraction of training is version / steps",
    ),
    "rl.prompts_per_step": _verl(
        "data.train_batch_size",
        f"{_ACTOR}.ppo_mini_batch_size",
        f"{CURRICULUM_SECTION}.batch_size",
        note="prompts per step",
    ),
    "rl.group_size": _verl(
        f"{_ROLLOUT}.n",
        f"{CURRICULUM_SECTION}.group_size",
        note="with rl.curriculum: the samples a group needs before its pass rate counts",
    ),
    "rl.lr": _verl(f"{_ACTOR}.optim.lr"),
    "rl.warmup_steps": _verl(
        f"{_ACTOR}.optim.lr_warmup_steps",
        note="verl steps its scheduler once per training step, as tirl's warm-up counts; verl's"
        " ramp starts at lr 0, tirl's at lr / (warmup_steps * updates_per_step)",
    ),
    "rl.temperature": _verl(f"{_ROLLOUT}.temperature"),
    "rl.max_model_tokens": _loop(
        "the loop stops a trajectory at this many model tokens (tool tokens not counted);"
        " verl's response length bounds model + tool tokens, so it is this plus the tool"
        " replies' bound; with seq-mean-token-sum-norm it is verl's loss_scale_factor",
        also=(*_RESPONSE_KEYS, f"{_ACTOR}.loss_scale_factor"),
    ),
    "rl.advantage": _verl(
        "algorithm.adv_estimator",
        "algorithm.norm_adv_by_std_in_grpo",
        note="grpo -> grpo; drgrpo -> grpo without std; rloo -> rloo; reinforce++-baseline ->"
        " reinforce_plus_plus_baseline (gamma 1) or tirl_reinforce_plus_plus_baseline;"
        " reinforce++ -> tirl_reinforce_plus_plus (tirl.integrations.verl.estimators);"
        " anything else is refused",
    ),
    "rl.advantage_params": _none("must be empty: verl passes no extra estimator parameters"),
    "rl.gamma": _verl("algorithm.gamma", note="refused != 1 for the outcome estimators, as tirl"),
    "rl.reward": _loop("the loop scores the model's text and returns reward_score"),
    "rl.reward_params": _loop(
        "parameters of the loop's reward (composite: AgentMath's alpha, beta, r_max)"
    ),
    "rl.overlong_buffer": _loop(
        "DAPO's overlong penalty over model tokens, subtracted by the loop (verl's DAPO reward"
        " manager counts tool tokens too, and is bypassed)"
    ),
    "rl.overlong_penalty": _loop("DAPO's overlong penalty, subtracted by the loop"),
    "rl.policy_loss": _verl(
        f"{_ACTOR}.policy_loss.loss_mode", note="ppo_clip -> vanilla; any other is refused"
    ),
    "rl.policy_loss_params": _none("must be empty: ppo_clip's parameters have keys of their own"),
    "rl.clip_low": _verl(f"{_ACTOR}.clip_ratio_low"),
    "rl.clip_high": _verl(f"{_ACTOR}.clip_ratio_high"),
    "rl.clip_ratio_c": _verl(
        f"{_ACTOR}.clip_ratio_c", note=f"null -> {DUAL_CLIP_OFF:g}, a bound that is never active"
    ),
    "rl.loss_agg": _verl(
        f"{_ACTOR}.loss_agg_mode",
        f"{_ACTOR}.loss_scale_factor",
        note="same mode names in both; seq-mean-token-sum-norm divides by rl.max_model_tokens"
        " (loss_scale_factor), as tirl's trainer does",
    ),
    "rl.kl_coef": _verl(
        f"{_ACTOR}.use_kl_loss",
        f"{_ACTOR}.kl_loss_coef",
        note="tirl's KL is a loss term to the initial policy, never a reward term",
    ),
    "rl.kl_estimator": _verl(f"{_ACTOR}.kl_loss_type", note="k1 / k2 / k3 in both"),
    "rl.entropy_coef": _verl(f"{_ACTOR}.entropy_coeff"),
    "rl.mask_tool_output": _loop(
        "the loop's response_mask: 0 on interpreter tokens (1 when false); verl trains on"
        " mask-1 tokens only"
    ),
    "rl.updates_per_step": _verl(
        f"{_ACTOR}.ppo_mini_batch_size",
        f"{_ACTOR}.ppo_epochs",
        note="ppo_mini_batch_size = prompts_per_step / updates_per_step (it must divide; verl"
        " multiplies it by rollout.n into sequences), one epoch",
    ),
    "rl.micro_batch_size": _verl(
        f"{_ACTOR}.use_dynamic_bsz",
        f"{_ACTOR}.ppo_micro_batch_size_per_gpu",
        f"{_ACTOR}.ppo_max_token_len_per_gpu",
        f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        f"{_AR}.ref.log_prob_micro_batch_size_per_gpu",
        note="N -> N sequences per GPU and forward pass; 0 (all) -> verl's token-packed dynamic"
        " batches of at most one full sequence's length",
    ),
    "rl.micro_batch_tokens": _verl(
        f"{_ACTOR}.use_dynamic_bsz",
        f"{_ACTOR}.ppo_max_token_len_per_gpu",
        note="N > 0 -> verl's token-packed dynamic batches of at most N tokens per GPU (over"
        " rl.micro_batch_size)",
    ),
    "rl.max_grad_norm": _verl(f"{_ACTOR}.optim.clip_grad"),
    "rl.skip_zero_advantage": _none(
        "tirl's own trainer only: verl's actor runs every row, those without an advantage too"
        " (the gradient is the same; a verl step costs their passes)"
    ),
    "rl.old_logprobs": _verl(
        "algorithm.rollout_correction.bypass_mode",
        note="sampler -> verl's bypass mode: the rollout's log-probs are the old ones, PPO clip;"
        " auto -> recomputed (verl samples with vLLM or SGLang, whose numbers differ)",
    ),
    "rl.off_policy_steps": _none(
        "tirl's own trainer only: a verl launch samples on-policy (verl's one-step-off-policy"
        " and fully async recipes, staleness_threshold, are separate entry points)"
    ),
    "rl.one_step_off_policy": _none(
        "tirl's own trainer only (rl.off_policy_steps: 1): a verl launch samples on-policy"
    ),
    "rl.tis_cap": _verl(
        "algorithm.rollout_correction.rollout_is",
        "algorithm.rollout_correction.rollout_is_threshold",
        note="token-level truncated IS in verl's decoupled mode: rollout_is token, the cap as"
        " its threshold; null -> no rollout correction",
    ),
    "rl.bf16": _verl(
        f"{_ACTOR}.fsdp_config.mixed_precision.param_dtype",
        note="true: FSDP computes in bfloat16; false: in the weights' dtype",
    ),
    "rl.budget_schedule": _loop(
        "the loop's tool budget from the policy version verl reports per request (fraction ="
        " version / rl.steps); its largest budget bounds the response length",
        also=_RESPONSE_KEYS,
    ),
    "rl.segment_tokens": _verl(
        f"{_V1}.trainer_mode",
        f"{_V1}.sampler.max_off_policy_threshold",
        note="> 0 turns on partial rollouts: verl's colocate_async mode, where a step's"
        " unfinished requests are aborted and resumed under the next weights. verl ends a"
        " segment when the step's batch is complete, not after L_seg tokens: the size itself"
        " has no verl counterpart",
    ),
    "rl.segment_tool_calls": _verl(
        f"{_V1}.trainer_mode",
        f"{_V1}.sampler.max_off_policy_threshold",
        note="> 0 turns on partial rollouts (as segment_tokens); the count itself has no verl"
        " counterpart",
    ),
    "rl.max_staleness": _verl(
        f"{_V1}.sampler.max_off_policy_threshold",
        note="with partial rollouts: the versions a trajectory may span = max_staleness + 1"
        " (null: no bound); verl drops a stale group and samples a fresh prompt, where tirl"
        " restarts the same prompt",
    ),
    "rl.adaptive_batch": _verl(
        "algorithm.filter_groups.enable",
        "algorithm.filter_groups.metric",
        note="groups whose rewards (verl: rm_scores, the loop's reward) are all equal are"
        " dropped and refilled",
    ),
    "rl.max_refill_rounds": _none(
        "verl 0.9.1's v1 sampler refills until the batch is full; it has no cap on rounds"
        " (it ignores filter_groups.max_num_gen_batches)"
    ),
    "rl.stages": _loop(
        "AgentMath's stage expansion: the loop's model-token and tool limits per stage, moved"
        " on by truncation rates shared across workers; the last stage bounds the response",
        also=_RESPONSE_KEYS,
    ),
    "rl.expansion_threshold": _loop("truncation rate that moves the loop to the next stage"),
    "rl.checkpoint_every": _verl("trainer.save_freq", note="0: only at the end (= rl.steps)"),
    "rl.curriculum.enabled": _verl(
        "data.custom_cls.path",
        "data.custom_cls.name",
        "data.dataloader_num_workers",
        *_CURRICULUM_VERL_KEYS,
        note="tirl's dataset class draws each row by the curriculum and reads the pass rates"
        " the loop reports (tirl.integrations.verl.curriculum); dataloading in the trainer's"
        " process so draws follow the finished steps. Synchronous trainer only: refused with"
        " rl.adaptive_batch or partial rollouts",
    ),
    **{
        f"rl.curriculum.{name}": _verl(
            f"{CURRICULUM_SECTION}.{name}", note="read by the curriculum dataset"
        )
        for name in CURRICULUM_KEYS
    },
    # ---- evaluation: verl's validation pass
    "eval.samples_per_item": _verl(
        f"{_ROLLOUT}.val_kwargs.n",
        f"{_ROLLOUT}.val_kwargs.do_sample",
        f"{_ROLLOUT}.val_kwargs.temperature",
        note="k > 0: avg@k sampled at eval.temperature (verl runs one validation pass, so"
        " tirl's extra greedy pass is not run); 0: one greedy sample",
    ),
    "eval.temperature": _verl(f"{_ROLLOUT}.val_kwargs.temperature"),
    "eval.max_model_tokens": _loop(
        "the loop's model-token limit on validation requests", also=_RESPONSE_KEYS
    ),
    "eval.tool_budget": _loop("the loop's tool budget on validation requests", also=_RESPONSE_KEYS),
    "eval.saved_samples": _verl("trainer.log_val_generations"),
    "eval.every_rl_steps": _verl(
        "trainer.test_freq",
        "trainer.val_before_train",
        note="0: before and after RL only (test_freq = rl.steps; verl always validates at its"
        " last step when test_freq > 0)",
    ),
    "eval.max_failed_share": _none("exit rule of `tirl eval`; verl fails on a failed request"),
    "eval.base": _none(
        "a phase of tirl's pipeline (the model before SFT); verl trains one model and"
        " validates it before training (trainer.val_before_train)"
    ),
}

# verl keys the translation sets whatever the tirl config says, and why.
FIXED: dict[str, str] = {
    f"{_ROLLOUT}.name": "vLLM serves the policy (SGLang: override it after these)",
    f"{_ROLLOUT}.mode": "agent loops need verl's async servers",
    f"{_ROLLOUT}.multi_turn.enable": "a trajectory alternates model and interpreter turns",
    f"{_ROLLOUT}.agent.default_agent_loop": f"every row runs tirl's loop ('{AGENT_LOOP_NAME}')",
    f"{_ROLLOUT}.calculate_log_probs": "rollout log-probs for the rollout/actor gap check",
    f"{_AR}.model.external_lib": f"imports {PLUGIN_MODULE} in verl's workers and trainer",
    "algorithm.use_kl_in_reward": "tirl never puts the KL into the reward (rl.kl_coef is a loss)",
    f"{_ACTOR}.optim.weight_decay": "tirl's RL optimizer is AdamW without weight decay",
    f"{_ACTOR}.optim.lr_scheduler_type": "tirl's RL learning rate is constant after warm-up",
    f"{_ACTOR}.shuffle": "tirl draws minibatches from a random permutation of the sequences",
    "data.max_prompt_length": f"a bound of {MAX_PROMPT_TOKENS} tokens; a longer prompt errors",
    "data.filter_overlong_prompts": "verl's filter templates the `prompt` column itself and, for a"
    " tokenizer without a chat template (plain prompts), drops every row without a word; the loop"
    " renders tirl's prompt and stops at one longer than data.max_prompt_length",
    "trainer.project_name": "runs are grouped under 'tirl' in the loggers",
    f"{TIRL_SECTION}.config": "the run config's absolute path, which tirl's loop reads",
    f"{TIRL_SECTION}.overrides": "the command-line overrides given with it",
}


def mapping_key(key: str) -> str | None:
    """The MAPPING row that covers config key `key` (itself or its section's "X.*"), or None."""
    if key in MAPPING:
        return key
    section = key.split(".", 1)[0] + ".*"
    return section if "." in key and section in MAPPING else None


def unmapped_keys(schema: type = RunConfig) -> list[str]:
    """The keys of config class `schema` that no MAPPING row covers (a new field shows up
    here until it gets a row: its verl keys or the reason it has none)."""
    from tirl.config import describe

    return [d.key for d in describe(schema) if d.type != "section" and not mapping_key(d.key)]


def mapped_verl_keys() -> set[str]:
    """Every verl key a MAPPING row or FIXED names."""
    return {k for row in MAPPING.values() for k in row.verl} | set(FIXED)
