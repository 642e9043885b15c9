"""`tirl verl config`: every tirl switch has a verl mapping or a written reason, each switch
moves exactly the verl keys its row names, the CIR and AgentMath recipes translate to the
papers' settings (hand-checked values), and what verl cannot express is a one-line error.

Runs without verl (main environment); tests/verl/test_verl_config_loads.py loads the same
translations into verl's own config classes."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import yaml

from tirl.algos.advantages import ADVANTAGE_ESTIMATORS, register_advantage
from tirl.config import ConfigError, apply_overrides, from_dict, load_config, setting, to_dict
from tirl.integrations.verl.config import (
    hydra_value,
    run_config_command,
    run_config_from_verl,
    translate,
    verl_items,
    verl_overrides,
    verl_settings,
)
from tirl.integrations.verl.config_table import (
    DUAL_CLIP_OFF,
    FIXED,
    MAPPING,
    MAX_PROMPT_TOKENS,
    mapped_verl_keys,
    mapping_key,
    unmapped_keys,
)
from tirl.run.config import RLConfig, RunConfig

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "verl"
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"


def write_problems(path: Path) -> Path:
    rows = [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42"), ("What is 9 - 4?", "5")]
    path.write_text("".join(f'{{"problem": "{p}", "answer": "{a}"}}\n' for p, a in rows))
    return path


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> Path:
    return write_problems(tmp_path_factory.mktemp("data") / "problems.jsonl")


def recipe_overrides(problems: Path) -> list[str]:
    return [f"data.train[0].path={problems}"]


# A small CIR-like run on arithmetic tasks (no files), REINFORCE++, every switch at a value
# from which each perturbation below moves it.
BASE = {
    "name": "t",
    "variants": ["code"],
    "device": "cuda",
    "model": {"name_or_path": "org/model"},
    "data": {"train": [{"source": "arithmetic"}]},
    "sft": {"steps": 0},
    "rl": {"steps": 20, "prompts_per_step": 8, "group_size": 4, "advantage": "reinforce++"},
    "eval": {"max_model_tokens": 32, "tool_budget": 2},
}


CURRICULUM_ON = "rl.curriculum.enabled=true"


def settings_of(overrides: list[str]) -> dict:
    return verl_settings(from_dict(RunConfig, apply_overrides(BASE, overrides)))


# ---------------------------------------------------------------- the table is complete


def test_every_run_config_key_has_a_mapping_row():
    """A key of RunConfig without a row (its verl keys, or the reason it has none) fails
    here; so does a row for a key that no longer exists."""
    assert unmapped_keys() == []
    from tirl.config import describe

    keys = {d.key for d in describe(RunConfig)}
    stale = [k for k in MAPPING if not k.endswith(".*") and k not in keys]
    assert stale == []
    for key, row in MAPPING.items():
        assert row.where in ("verl", "loop", "none"), key
        if row.where == "verl":
            assert row.verl, f"{key}: a verl row names its verl keys"
        else:
            assert len(row.note) > 20, f"{key}: a row without verl keys says why"


# The schema of a later tirl with one more RL switch (module level: config schemas must be).
@dataclasses.dataclass
class RLPlus(RLConfig):
    new_switch: float = setting(0.5, "[0, 1]", "a switch added later")


@dataclasses.dataclass
class RunPlus(RunConfig):
    rl: RLPlus = setting(factory=RLPlus, doc="reinforcement learning")


def test_a_new_config_field_without_a_row_is_reported():
    """The check above is not vacuous: a schema with one more RL field has it unmapped."""
    assert unmapped_keys(RunPlus) == ["rl.new_switch"]
    assert mapping_key("sft.length_window") == "sft.*"  # a whole section can have one reason


@pytest.mark.parametrize("recipe", ["cir.yaml", "agentmath.yaml"])
def test_translation_sets_only_verl_keys_the_table_names(recipe, problems):
    items = verl_items(load_config(RunConfig, RECIPES / recipe, recipe_overrides(problems)))
    assert set(items) <= mapped_verl_keys()
    assert set(FIXED) - {"tirl.config", "tirl.overrides"} <= set(items)


# Each tirl key is moved from BASE (with `context` overrides applied to both sides) and the
# verl keys that change must be exactly among its row's, and not none of them for a "verl" row.
PERTURBATIONS: list[tuple[str, object, list[str]]] = [
    ("name", "other", []),
    ("out_dir", "elsewhere", []),
    ("seed", 7, []),
    ("variants", ["text"], []),
    ("device", "cpu", []),
    ("threads", 3, []),
    ("parallel_variants", True, []),
    ("rollout.max_in_flight", 64, []),
    ("rollout_batch", 5, []),
    ("plugins", ["json"], []),  # any importable module: a plugin that registers nothing
    ("protocol.name", "agentmath_tags", []),
    ("tools", ["python", "shell"], []),
    ("log_tensorboard", True, []),
    ("log_wandb", True, []),
    ("data.train", [{"source": "arithmetic", "digits": 2}], []),
    ("data.eval", [{"name": "other", "items": 5}], []),
    ("prompt.chat", True, []),
    ("prompt.system", "Be brief.", []),
    ("rollout.engine_options", {"kv_cache": "padded"}, []),
    ("rollout.agent.timeout_s", 30.0, []),
    ("rollout.agent.concurrency", 2, []),
    ("model.name_or_path", "org/other", []),
    ("model.arch", "gpt2", []),
    ("model.hidden_size", 64, []),
    ("model.layers", 2, []),
    ("model.heads", 2, []),
    ("model.max_positions", 4096, []),
    ("model.vocab_size", 500, []),
    ("model.tokenizer_corpus_items", 10, []),
    ("model.dtype", "bfloat16", []),
    ("model.gradient_checkpointing", True, []),
    ("model.lora.rank", 8, []),
    ("model.lora.alpha", 16.0, ["model.lora.rank=8"]),
    ("model.lora.targets", ["q_proj", "v_proj"], ["model.lora.rank=8"]),
    ("model.lora.dropout", 0.1, []),  # without a rank nothing changes; with one, refused
    ("sandbox.kind", "ray", []),
    (
        "sandbox.urls",
        ["http://127.0.0.1:2"],
        ["sandbox.kind=http", 'sandbox.urls=["http://127.0.0.1:1"]'],
    ),
    ("sandbox.actors", 3, []),
    ("sandbox.timeout_s", 9.0, []),
    ("sandbox.memory_mb", 2048, []),
    ("sandbox.max_output_chars", 300, []),
    ("sandbox.preload", ["math"], []),
    ("sandbox.cpu_s", 10, []),
    ("sandbox.kill_background", False, []),
    ("sandbox.grace_s", 1.0, []),
    ("sandbox.capture_chars", 4096, []),
    ("sandbox.file_size_mb", 32, []),
    ("sandbox.max_open_files", 128, []),
    ("sandbox.max_processes", 16, []),
    ("sandbox.disk_mb", 128, []),
    ("sft.steps", 3, []),
    ("rl.steps", 10, []),
    ("rl.prompts_per_step", 16, []),
    ("rl.group_size", 6, []),
    ("rl.lr", 2e-6, []),
    ("rl.warmup_steps", 3, []),
    ("rl.temperature", 0.7, []),
    ("rl.max_model_tokens", 100, []),
    ("rl.max_model_tokens", 100, ["rl.loss_agg=seq-mean-token-sum-norm"]),
    ("protocol.boundary", "stop_token", []),
    ("rl.advantage", "grpo", []),
    ("rl.advantage", "drgrpo", []),
    ("rl.advantage", "reinforce++-baseline", []),
    ("rl.gamma", 0.9, []),
    ("rl.reward", "composite", []),
    ("rl.reward_params", {"alpha": 0.1, "beta": 0.1, "r_max": 0.5}, ["rl.reward=composite"]),
    ("rl.overlong_buffer", 8, []),
    ("rl.overlong_penalty", 0.5, []),
    ("rl.clip_low", 0.1, []),
    ("rl.clip_high", 0.3, []),
    ("rl.clip_ratio_c", 3.0, []),
    ("rl.loss_agg", "seq-mean-token-mean", []),
    ("rl.loss_agg", "seq-mean-token-sum-norm", []),
    ("rl.kl_coef", 0.1, []),
    ("rl.kl_estimator", "k1", []),
    ("rl.entropy_coef", 0.01, []),
    ("rl.mask_tool_output", False, []),
    ("rl.updates_per_step", 4, []),
    ("rl.micro_batch_size", 2, []),
    ("rl.micro_batch_tokens", 512, []),
    ("rl.max_grad_norm", 0.5, []),
    ("rl.skip_zero_advantage", False, []),
    ("rl.old_logprobs", "sampler", []),
    ("rl.tis_cap", 2.0, []),
    ("rl.one_step_off_policy", True, []),
    ("rl.off_policy_steps", 2, []),
    ("rl.bf16", True, []),
    ("rl.budget_schedule", [[0.0, 6]], []),
    ("rl.segment_tokens", 16, []),
    ("rl.segment_tool_calls", 1, []),
    ("rl.max_staleness", 2, ["rl.segment_tokens=16"]),
    ("rl.adaptive_batch", True, []),
    ("rl.max_refill_rounds", 5, []),
    ("rl.stages", [{"max_model_tokens": 80, "tool_budget": 5}], []),
    ("rl.expansion_threshold", 0.2, []),
    ("rl.checkpoint_every", 5, []),
    ("rl.curriculum.enabled", True, []),
    ("rl.curriculum.key", ["size"], [CURRICULUM_ON]),
    ("rl.curriculum.band", [0.1, 0.9], [CURRICULUM_ON]),
    ("rl.curriculum.window", 4, [CURRICULUM_ON]),
    ("rl.curriculum.min_groups", 1, [CURRICULUM_ON]),
    ("rl.curriculum.explore", 0.2, [CURRICULUM_ON]),
    ("rl.curriculum.order_by", None, [CURRICULUM_ON]),
    ("rl.curriculum.widen_share", 0.8, [CURRICULUM_ON]),
    ("rl.curriculum.lookahead", 16, [CURRICULUM_ON]),
    ("rl.group_size", 6, [CURRICULUM_ON]),
    ("name", "u", [CURRICULUM_ON]),
    ("eval.samples_per_item", 0, []),
    ("eval.temperature", 0.5, []),
    ("eval.max_model_tokens", 200, []),
    ("eval.tool_budget", 9, []),
    ("eval.saved_samples", 3, []),
    ("eval.every_rl_steps", 5, []),
    ("eval.max_failed_share", 0.1, []),
    ("eval.base", True, []),
]

# Keys no perturbation moves: refused when set (tests below) or, for rollout.engine, refused
# by tirl's own config for a training run.
NOT_PERTURBED = {
    "rl.advantage_params": "refused when set",
    "rl.policy_loss": "refused unless ppo_clip",
    "rl.policy_loss_params": "refused when set",
    "rollout.engine": "only hf trains without an engine installed (vllm), openai cannot train",
    "rollout.urls": "read only by engines that are clients, which cannot train",
    "rollout.agent.command": "refused when set",
    "sandbox.options": "no built-in transport takes options",
}


def test_the_perturbations_cover_every_mapped_key():
    covered = {mapping_key(key) for key, _, _ in PERTURBATIONS}
    assert set(MAPPING) - covered == set(NOT_PERTURBED)


@pytest.mark.parametrize(
    "key,value,context", PERTURBATIONS, ids=[f"{k}={v}" for k, v, _ in PERTURBATIONS]
)
def test_each_switch_moves_exactly_the_verl_keys_of_its_row(key, value, context):
    before = settings_of(context)
    after = settings_of([*context, f"{key}={json.dumps(value)}"])
    changed = {k for k in before.keys() | after.keys() if before.get(k, "∅") != after.get(k, "∅")}
    row = MAPPING[mapping_key(key)]
    assert changed <= set(row.verl), f"{key} moved {sorted(changed - set(row.verl))}"
    if row.where == "verl":
        assert changed, f"{key} is mapped to {row.verl} but moved none of them"


# ---------------------------------------------------------------- the recipes, hand-checked


def test_cir_recipe_translates_to_the_papers_switches(problems):
    cfg = load_config(RunConfig, RECIPES / "cir.yaml", recipe_overrides(problems))
    s = verl_settings(cfg)
    expected = {
        "algorithm.adv_estimator": "tirl_reinforce_plus_plus",  # REINFORCE++ (§3.1)
        "algorithm.gamma": 1.0,
        "algorithm.use_kl_in_reward": False,  # no KL (§2.3.2)
        f"{A}.use_kl_loss": False,
        f"{A}.entropy_coeff": 0.0,  # no entropy bonus
        f"{A}.clip_ratio_low": 0.2,  # clip-higher
        f"{A}.clip_ratio_high": 0.28,
        f"{A}.clip_ratio_c": DUAL_CLIP_OFF,  # no dual clip
        f"{A}.loss_agg_mode": "token-mean",
        f"{A}.policy_loss.loss_mode": "vanilla",
        f"{A}.optim.lr": 1e-6,
        f"{A}.optim.weight_decay": 0.0,
        f"{A}.ppo_mini_batch_size": 32,  # 64 prompts / 2 updates
        f"{A}.ppo_epochs": 1,
        f"{A}.use_dynamic_bsz": True,
        f"{R}.n": 8,
        f"{R}.temperature": 1.0,
        f"{R}.agent.default_agent_loop": "tirl",
        f"{R}.multi_turn.enable": True,
        f"{R}.name": "vllm",
        f"{R}.val_kwargs.n": 16,  # avg@16 at temperature 1.0
        f"{R}.val_kwargs.temperature": 1.0,
        "data.train_batch_size": 64,
        "data.max_prompt_length": MAX_PROMPT_TOKENS,
        # 2048 model tokens + 4 calls x (200 shown chars + 4 + the 16-byte output fence)
        "data.max_response_length": 2048 + 4 * (200 + 4 + len("\n```output\n\n```\n")),
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-Math-7B",
        "trainer.total_training_steps": 300,
    }
    assert {k: s[k] for k in expected} == expected
    assert s["data.max_response_length"] + MAX_PROMPT_TOKENS <= 4096  # Qwen2.5-Math-7B's context
    assert "algorithm.filter_groups.enable" not in s  # no adaptive batches in CIR
    assert "trainer.v1.trainer_mode" not in s  # synchronous, on-policy


def test_agentmath_recipe_translates_to_the_papers_switches(problems):
    cfg = load_config(RunConfig, RECIPES / "agentmath.yaml", recipe_overrides(problems))
    s = verl_settings(cfg)
    expected = {
        "algorithm.adv_estimator": "grpo",  # GRPO (§3.2)
        "algorithm.norm_adv_by_std_in_grpo": True,
        "algorithm.filter_groups.enable": True,  # adaptive batches (§3.2)
        "algorithm.filter_groups.metric": "reward",
        "trainer.v1.trainer_mode": "colocate_async",  # partial rollouts (§3.3)
        "trainer.v1.sampler.max_off_policy_threshold": None,
        f"{A}.optim.lr": 1e-6,  # §3.3
        "data.train_batch_size": 64,
        f"{R}.n": 8,
        f"{A}.ppo_mini_batch_size": 64,
        f"{A}.clip_ratio_high": 0.2,
        f"{R}.val_kwargs.n": 32,  # avg@32
        # the last stage: 96k model tokens + 96 calls x (512 + 4 + the 31-byte interpreter tags)
        "data.max_response_length": 98304 + 96 * (512 + 4 + 31),
    }
    assert {k: s[k] for k in expected} == expected
    assert len("\n<interpreter>\n" + "\n</interpreter>\n") == 31


# ---------------------------------------------------------------- refusals: one line, the key


@pytest.fixture(scope="module")
def custom_estimator() -> str:
    """An estimator registered in tirl (as docs/extending.md shows) that verl does not have."""
    name = "test_scaled_grpo"
    if name not in ADVANTAGE_ESTIMATORS:

        @register_advantage(name)
        def scaled(rewards, group_ids, mask, *, gamma, kl, kl_coef, scale: float = 1.0):
            grpo = ADVANTAGE_ESTIMATORS["grpo"]
            return scale * grpo(rewards, group_ids, mask, gamma=gamma, kl=kl, kl_coef=kl_coef)

    return name


REFUSALS = [
    ("model.name_or_path", ["model.name_or_path=null"]),
    ("model.lora.dropout", ["model.lora.rank=8", "model.lora.dropout=0.05"]),
    ("rl.steps", ["rl.steps=0"]),
    ("variants", ["variants=[code, text]"]),
    ("rl.gamma", ["rl.advantage=grpo", "rl.gamma=0.9"]),
    ("rl.updates_per_step", ["rl.updates_per_step=3"]),
    (
        "rl.loss_agg",
        [
            "rl.loss_agg=seq-mean-token-sum-norm",
            "rl.stages=[{max_model_tokens: 80, tool_budget: 4}]",
        ],
    ),
    ("device", ["device=mps"]),
    ("rl.curriculum.enabled", [CURRICULUM_ON, "rl.adaptive_batch=true"]),
    ("rl.curriculum.enabled", [CURRICULUM_ON, "rl.segment_tokens=16"]),
    ("rollout.agent.command", ["rollout.agent.command=[python, agent.py]"]),
]


@pytest.mark.parametrize("key,overrides", REFUSALS, ids=[k for k, _ in REFUSALS])
def test_a_switch_verl_cannot_express_is_a_one_line_error_naming_it(key, overrides):
    with pytest.raises(ConfigError) as err:
        settings_of(overrides)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ") and "\n" not in str(err.value)


def test_an_estimator_neither_verl_nor_tirl_registers_there_is_refused(custom_estimator):
    with pytest.raises(ConfigError) as err:
        settings_of([f"rl.advantage={custom_estimator}"])
    assert err.value.key == "rl.advantage" and "\n" not in str(err.value)
    assert custom_estimator in str(err.value) and "reinforce++-baseline" in str(err.value)
    with pytest.raises(ConfigError) as err:  # its own parameters have no verl route either
        settings_of([f"rl.advantage={custom_estimator}", "rl.advantage_params={scale: 2.0}"])
    assert err.value.key == "rl.advantage_params"


def test_the_command_reports_a_refusal_in_one_line(tmp_path, problems, capsys):
    """Through the CLI's error path: the file and override that set the key are named by
    tirl's config loader; the translation's refusal names the key."""
    bad = ["rl.gamma=0.9", "rl.advantage=rloo", *recipe_overrides(problems)]
    with pytest.raises(ConfigError) as err:
        run_config_command(str(RECIPES / "agentmath.yaml"), bad)
    assert str(err.value).splitlines() == [str(err.value)] and "rl.gamma" in str(err.value)
    assert capsys.readouterr().out == ""  # nothing printed before the error


# ---------------------------------------------------------------- output forms


def test_the_printed_forms_carry_the_same_settings(problems, capsys):
    path, extra = RECIPES / "cir.yaml", recipe_overrides(problems)
    cfg = load_config(RunConfig, path, extra)
    items = verl_items(cfg, path, extra)
    lines = translate(path, extra).splitlines()
    assert lines == verl_overrides(cfg, path, extra) and len(lines) == len(items)
    assert "+tirl.config=" + str(path.resolve()) in lines
    assert f"+tirl.overrides=['data.train[0].path={problems}']" in lines
    assert "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16" in lines

    shell = translate(path, extra, fmt="shell")
    assert shlex.split(shell.replace("\\\n", " "))[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    assert shlex.split(shell.replace("\\\n", " "))[3:] == lines

    doc = yaml.safe_load(translate(path, extra, fmt="yaml"))
    assert doc.pop("defaults") == ["ppo_trainer", "_self_"]
    assert doc.pop("hydra") == {"searchpath": ["pkg://verl.trainer.config"]}

    def flat(tree, prefix=""):
        for k, v in tree.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]

    assert dict(flat(doc)) == items

    assert run_config_command(str(path), extra) == 0
    assert capsys.readouterr().out.splitlines() == lines
    with pytest.raises(ConfigError, match="--format"):
        translate(path, extra, fmt="toml")


def test_hydra_values_are_quoted_only_when_needed():
    assert hydra_value("Qwen/Qwen2.5-Math-7B") == "Qwen/Qwen2.5-Math-7B"
    assert hydra_value("true") == "'true'"  # a string, not a bool
    assert hydra_value("it's a b\\c") == "'it\\'s a b\\\\c'"
    assert hydra_value("data.train[0].path=x") == "'data.train[0].path=x'"
    assert hydra_value(1e-6) == "1e-06" and hydra_value(3) == "3" and hydra_value(None) == "null"
    assert hydra_value([True, "console", 0.5]) == "[true,console,0.5]"
    with pytest.raises(ValueError):
        hydra_value(float("nan"))


def test_the_loop_rebuilds_the_run_config_from_the_verl_section(problems):
    path, extra = RECIPES / "agentmath.yaml", [*recipe_overrides(problems), "rl.steps=7"]
    items = verl_items(load_config(RunConfig, path, extra), path, extra)
    verl_config = {"tirl": {"config": items["tirl.config"], "overrides": items["tirl.overrides"]}}
    rebuilt = run_config_from_verl(verl_config)
    assert to_dict(rebuilt) == to_dict(load_config(RunConfig, path, extra))
    assert rebuilt.rl.steps == 7
    with pytest.raises(ConfigError) as err:
        run_config_from_verl({"trainer": {}})
    assert err.value.key == "tirl.config" and "\n" not in str(err.value)


def test_the_curriculum_runs_in_tirls_dataset_with_its_settings_in_the_data_section():
    extra = [CURRICULUM_ON, "rl.curriculum.key=[size]", "rl.curriculum.band=[0.1, 0.9]"]
    cfg = from_dict(RunConfig, apply_overrides(BASE, extra))
    lines = verl_overrides(cfg)
    expected = [
        "data.custom_cls.path='pkg://tirl.integrations.verl.curriculum'",
        "data.custom_cls.name=CurriculumDataset",
        "data.dataloader_num_workers=0",  # draws happen in the trainer's process, in step order
        "+data.tirl_curriculum.key=[size]",
        "+data.tirl_curriculum.band=[0.1,0.9]",
        "+data.tirl_curriculum.order_by=size",
        "+data.tirl_curriculum.group_size=4",
        "+data.tirl_curriculum.run=t",
        "+data.tirl_curriculum.batch_size=8",  # rl.prompts_per_step: a step's rows
        "+data.tirl_curriculum.metrics_file=runs/t/curriculum_metrics.jsonl",
    ]
    assert set(expected) <= set(lines)
    assert not any("tirl_curriculum" in line or "custom_cls" in line for line in
                   verl_overrides(from_dict(RunConfig, apply_overrides(BASE, []))))  # fmt: skip
