"""docs/extending.md, run: every code block of every recipe is executed here, and what it
registers is then used through the same path a run takes (config load, `tirl.tasks.make_source`,
`tirl.train.update`), so the page and the code cannot drift apart.

Registrations made here are removed after each test: the registries are left as they were.
"""

from __future__ import annotations

import asyncio
import linecache
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from tirl.algos.advantages import ADVANTAGE_ESTIMATORS, broadcast_to_tokens, group_mean_baseline
from tirl.algos.losses import POLICY_LOSSES, ppo_clip_loss
from tirl.backends.engine import Engine, GenOutput
from tirl.backends.hf import HFEngine
from tirl.backends.openai import OpenAIEngine
from tirl.config import ConfigError, from_dict, load_config
from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.rewards.reward import REWARDS, make_reward
from tirl.rollout.engines import ENGINES
from tirl.rollout.router import Router
from tirl.run.config import RLConfig, RunConfig
from tirl.sandbox.config import SANDBOX_TRANSPORTS, make_sandbox
from tirl.tasks import Mixture, make_source
from tirl.tasks.registry import SOURCES
from tirl.train.batch import collate, token_logprobs
from tirl.train.update import batch_advantages, minibatch_loss_backward

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"


def recipe_blocks(title: str, lang: str) -> list[str]:
    """The fenced `lang` blocks of the section `## <title>` of extending.md, in order."""
    sections = re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)
    (section,) = [s for s in sections if s.startswith(title + "\n")]
    blocks = re.findall(rf"^```{lang}\n(.*?)^```", section, flags=re.M | re.S)
    assert blocks, f"extending.md, '{title}': no {lang} block"
    return blocks


@pytest.fixture()
def run_recipe():
    """Run a recipe's python blocks as one module; remove what they registered afterwards."""
    registries = (
        ADVANTAGE_ESTIMATORS,
        POLICY_LOSSES,
        REWARDS,
        SOURCES,
        ENGINES,
        SANDBOX_TRANSPORTS,
    )
    before = [set(r) for r in registries]
    added_modules, added_sources = [], []

    def run(title: str) -> dict:
        name = "extending_" + re.sub(r"\W", "_", title.lower())
        module = types.ModuleType(name)
        sys.modules[name] = module  # dataclasses and typing look classes up by module
        added_modules.append(name)
        for i, block in enumerate(recipe_blocks(title, "python")):
            filename = f"<extending.md: {title}, block {i + 1}>"
            # inspect.getsource (RACES reads a mapper's source) finds exec'd code through here
            linecache.cache[filename] = (len(block), None, block.splitlines(True), filename)
            added_sources.append(filename)
            exec(compile(block, filename, "exec"), module.__dict__)
        return module.__dict__

    yield run
    for registry, names in zip(registries, before, strict=True):
        for key in set(registry) - names:
            registry.unregister(key)
    for name in added_modules:
        sys.modules.pop(name, None)
    for filename in added_sources:
        linecache.cache.pop(filename, None)


def config_from_recipe(title: str, tmp_path: Path, overrides: list[str] = ()) -> RunConfig:
    """The recipe's YAML block as a config file, loaded as `tirl train FILE` loads it."""
    (text,) = recipe_blocks(title, "yaml")
    path = tmp_path / "extending.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(RunConfig, path, overrides)


def rl_from_recipe(title: str, tmp_path: Path, overrides: list[str] = ()) -> RLConfig:
    return config_from_recipe(title, tmp_path, overrides).rl


def test_every_file_the_page_names_exists():
    """A recipe that points at a moved file misleads; the table names real files."""
    table = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line[:1] == "|"]
    named = set(re.findall(r"`(src/tirl/[\w/]+\.py)`", "\n".join(table)))
    assert named, "the page names no files"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


# ------------------------------------------------------------------------------ task sources


def test_a_task_source_is_built_from_a_config_entry_and_yields_tasks(run_recipe):
    run_recipe("A task source")
    source = make_source({"source": "addition", "digits": 3}, "data.train[0]", seed=7)
    tasks = [source.item("train", i) for i in range(20)]
    assert all(t.source == "addition" and t.score(f"\\boxed{{{t.answer}}}").correct for t in tasks)
    assert not tasks[0].score("\\boxed{-1}").correct
    assert [t.problem for t in tasks] == [source.item("train", i).problem for i in range(20)]
    assert source.item("test", 0).problem != tasks[0].problem  # the splits are apart
    assert len({t.problem for t in tasks}) > 15

    mixture = Mixture.from_entries(
        [{"source": "addition", "weight": 1}, {"source": "arithmetic", "weight": 1}], "data.train"
    )
    assert {t.source for t in mixture.items("train", 4)} == {"addition", "arithmetic"}


def test_a_task_source_checks_its_parameters_in_one_line(run_recipe):
    run_recipe("A task source")
    with pytest.raises(ConfigError) as err:
        make_source({"source": "addition", "digits": 0}, "data.train[0]")
    assert "data.train[0].digits" in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------ environments


def test_an_environment_recipe_passes_the_library_checks(run_recipe, monkeypatch):
    import tirl.envs.core as core
    from tirl.envs.check import check_environment

    monkeypatch.setattr(core, "REGISTRY", core.Environments())  # the real one stays as it was
    run_recipe("An environment (RACES)")
    env = core.REGISTRY.get("numbers.digit_sum_of")
    assert env.apply(1234) == 10
    assert check_environment(env, n=20) == []


# ------------------------------------------------------------------------------ advantages


def _scored_batch(tokenizer, n_groups: int = 2, group_size: int = 3) -> list[Trajectory]:
    """Hand-built trajectories: prompt, model, tool output, model; rewards vary in a group."""
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(5, len(tokenizer) - 1, (n,), generator=g).tolist()

    trajs = []
    for task in range(n_groups):
        for k in range(group_size):
            model = ids(4 + k)
            segments = [
                Segment(SegmentKind.PROMPT, ids(5)),
                Segment(SegmentKind.MODEL, model, logprobs=[-1.0] * len(model)),
                Segment(SegmentKind.TOOL, ids(3)),
                Segment(SegmentKind.MODEL, ids(2), logprobs=[-1.0] * 2),
            ]
            score = Score(float(k % 2 == 0), k % 2 == 0)
            trajs.append(Trajectory(segments, meta={"task": task}, score=score))
    return trajs


def test_an_added_advantage_estimator_gets_its_parameter_from_the_config(
    run_recipe, tokenizer, tmp_path
):
    run_recipe("An advantage estimator")
    cfg = rl_from_recipe("An advantage estimator", tmp_path)
    assert (cfg.advantage, cfg.advantage_params) == ("scaled_baseline", {"scale": 2.0})

    batch = collate(_scored_batch(tokenizer), tokenizer.pad_token_id)
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = batch_advantages(cfg, rewards, groups, batch.loss_mask)  # what the trainer calls

    expected = broadcast_to_tokens(2.0 * group_mean_baseline(rewards, groups), batch.loss_mask)
    torch.testing.assert_close(adv, expected)
    assert adv[batch.loss_mask == 0].abs().sum() == 0
    cfg.advantage_params = {}  # the estimator's default scale, 1: half the advantage
    torch.testing.assert_close(batch_advantages(cfg, rewards, groups, batch.loss_mask), adv / 2)


def test_a_misspelt_parameter_is_one_line_naming_the_key_and_the_accepted_names(run_recipe):
    run_recipe("An advantage estimator")
    with pytest.raises(ConfigError) as err:
        load_config(
            RunConfig, overrides=["rl.advantage=scaled_baseline", "rl.advantage_params.scael=2"]
        )
    message = str(err.value)
    assert "\n" not in message
    assert "rl.advantage_params.scael" in message and "accepted: scale" in message

    with pytest.raises(ConfigError) as err:  # a built-in estimator takes none
        load_config(RunConfig, overrides=["rl.advantage_params.scale=2"])
    assert "rl.advantage_params.scale" in str(err.value) and "takes none" in str(err.value)


def test_an_unknown_name_lists_the_registered_ones_added_ones_included(run_recipe):
    run_recipe("An advantage estimator")
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, overrides=["rl.advantage=scaled_baselin"])
    assert "rl.advantage" in str(err.value)
    assert "scaled_baseline" in str(err.value) and "grpo" in str(err.value)


# ------------------------------------------------------------------------------ policy losses


def _grads_of_update(model, batch, old, adv, cfg: RLConfig) -> list[torch.Tensor]:
    model.zero_grad()
    rows = torch.arange(batch.input_ids.shape[0])
    minibatch_loss_backward(model, batch, rows, old, adv, None, cfg)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _grads_of(model, batch, loss_fn) -> list[torch.Tensor]:
    model.zero_grad()
    logprobs, _ = token_logprobs(model, batch)
    loss_fn(logprobs.float()).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _update_inputs(tiny_model, tokenizer):
    batch = collate(_scored_batch(tokenizer), tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs(tiny_model, batch)
    old = logprobs - 0.7  # every ratio e^0.7 ~ 2.0: above the recipe's cap of 1.5
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = broadcast_to_tokens(group_mean_baseline(rewards, groups), batch.loss_mask)
    return batch, old, adv


def test_the_update_calls_an_added_policy_loss_with_its_parameter(
    run_recipe, tiny_model, tokenizer, tmp_path
):
    recipe = run_recipe("A policy loss")
    cfg = rl_from_recipe("A policy loss", tmp_path)
    assert (cfg.policy_loss, cfg.policy_loss_params) == ("tis_pg", {"cap": 1.5})
    batch, old, adv = _update_inputs(tiny_model, tokenizer)
    loss_fn = recipe["truncated_is_pg_loss"]

    through_update = _grads_of_update(tiny_model, batch, old, adv, cfg)
    direct = _grads_of(
        tiny_model,
        batch,
        lambda lp: loss_fn(lp, old, adv, batch.loss_mask, agg=cfg.loss_agg, cap=1.5)[0],
    )
    uncapped = _grads_of(
        tiny_model,
        batch,
        lambda lp: loss_fn(lp, old, adv, batch.loss_mask, agg=cfg.loss_agg, cap=100.0)[0],
    )
    for a, b in zip(through_update, direct, strict=True):
        torch.testing.assert_close(a, b)
    assert any(not torch.allclose(a, b) for a, b in zip(through_update, uncapped, strict=True))


def test_the_built_in_loss_still_reads_the_clip_keys(tiny_model, tokenizer):
    cfg = from_dict(RLConfig, {"clip_low": 0.1, "clip_high": 0.15, "clip_ratio_c": 3.0}, "rl")
    assert cfg.policy_loss == "ppo_clip"
    batch, old, adv = _update_inputs(tiny_model, tokenizer)
    through_update = _grads_of_update(tiny_model, batch, old, adv, cfg)
    direct = _grads_of(
        tiny_model,
        batch,
        lambda lp: ppo_clip_loss(
            lp, old, adv, batch.loss_mask, clip_low=0.1, clip_high=0.15, clip_ratio_c=3.0
        )[0],
    )
    for a, b in zip(through_update, direct, strict=True):
        torch.testing.assert_close(a, b)


def test_a_parameter_with_a_key_of_its_own_is_refused_in_the_params_dict():
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, overrides=["rl.policy_loss_params.clip_low=0.1"])
    assert "rl.policy_loss_params.clip_low" in str(err.value) and "rl.clip_low" in str(err.value)


# ------------------------------------------------------------------------------ rewards


def test_an_added_reward_is_built_with_its_parameters(run_recipe):
    run_recipe("A reward")
    cfg = from_dict(RLConfig, {"reward": "fewer_calls", "reward_params": {"cost": 0.2}}, "rl")
    reward = make_reward(cfg.reward, **cfg.reward_kwargs())
    assert reward(True, {"num_calls": 2}) == pytest.approx(0.6)
    assert reward(True, {"num_calls": 9}) == 0.5 and reward(False, {"num_calls": 0}) == 0.0
    assert reward.range == (0.0, 1.0)


def test_the_composite_reward_takes_its_parameters_in_reward_params():
    cfg = from_dict(RLConfig, {"reward": "composite", "reward_params": {"beta": 0.1}}, "rl")
    reward = make_reward(cfg.reward, **cfg.reward_kwargs())
    assert reward(True, {"num_calls": 1}) == pytest.approx(1.1)
    with pytest.raises(ConfigError) as err:  # the reward's own check of a value, in one line
        load_config(RunConfig, overrides=["rl.reward=composite", "rl.reward_params.beta=-1"])
    assert str(err.value).startswith("override 'rl.reward_params.beta=-1': rl: rl.reward_params:")
    assert "beta must be >= 0" in str(err.value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("rl.composite_alpha=0.1", "rl.reward_params.alpha"),
        ("rl.composite_beta=0.1", "rl.reward_params.beta"),
        ("rl.composite_max=0.1", "rl.reward_params.r_max"),
        ("rl.boundary=stop_token", "protocol.boundary"),
    ],
)
def test_a_key_of_an_older_config_is_refused_naming_its_new_place(old, new):
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, overrides=[old])
    assert str(err.value) == f"override {old!r}: {old.split('=')[0]} is now {new}"


def test_a_protocol_name_alone_still_sets_the_protocol():
    cfg = load_config(RunConfig, overrides=["protocol=agentmath_tags"])
    assert (cfg.protocol.name, cfg.protocol.boundary) == ("agentmath_tags", "exact_match")
    cfg = load_config(RunConfig, overrides=["protocol.boundary=stop_token"])
    assert (cfg.protocol.name, cfg.protocol.boundary) == ("cir_fences", "stop_token")


# ------------------------------------------------------------------------------ engines


def test_a_backend_has_the_engine_interface_and_says_whether_it_receives_weights(
    run_recipe, tiny_model
):
    recipe = run_recipe("A generation backend")
    engine = recipe["ReplayEngine"]([5, 6, 7])
    assert isinstance(engine, Engine)

    async def two_calls():
        first = await engine.generate("k", [1, 2], max_new_tokens=2)
        second = await engine.generate("k", [9], max_new_tokens=2)
        return first, second

    first, second = asyncio.run(two_calls())
    assert first == GenOutput([5, 6], [0.0, 0.0], "length")
    assert second == GenOutput([7], [0.0], "stop")

    hf = HFEngine(tiny_model, eos_id=0)
    http = OpenAIEngine("http://127.0.0.1:9", tokenizer=None)  # never contacted
    assert isinstance(hf, Engine) and isinstance(http, Engine)
    assert hf.receives_weights and not http.receives_weights
    assert Router([hf, hf]).receives_weights and not Router([hf, http]).receives_weights
    hf.close()


def test_a_registered_engine_is_chosen_by_the_config_with_its_options(
    run_recipe, tiny_model, tokenizer, tmp_path
):
    from tirl.models.tiny import save_policy
    from tirl.run.build import engine_for

    recipe = run_recipe("A generation backend")
    save_policy(tiny_model, tokenizer, tmp_path / "model")
    evaluate_only = ["sft.steps=0", "rl.steps=0", f"model.name_or_path={tmp_path / 'model'}"]
    cfg = config_from_recipe("A generation backend", tmp_path, evaluate_only)
    engine = engine_for(cfg, None, tokenizer, tokenizer.eos_token_id)
    assert isinstance(engine, recipe["ReplayEngine"])
    out = asyncio.run(engine.generate("k", [1], max_new_tokens=50))
    assert tokenizer.decode(out.ids) == "So \\boxed{42}." and out.finish_reason == "stop"

    with pytest.raises(ConfigError, match="rollout.engine_options.colour is not a parameter"):
        config_from_recipe(
            "A generation backend", tmp_path, [*evaluate_only, "rollout.engine_options.colour=1"]
        )
    with pytest.raises(ConfigError, match="cannot receive the trained weights"):
        config_from_recipe("A generation backend", tmp_path, [evaluate_only[2]])


# ------------------------------------------------------------------------------ sandboxes


def test_a_sandbox_transport_runs_forks_and_restores_sessions(run_recipe):
    from tirl.sandbox import Sandbox, SandboxLimits

    recipe = run_recipe("A sandbox transport")

    async def use() -> tuple[list[str], int]:
        limits = SandboxLimits(timeout_s=5.0, memory_mb=512)
        async with recipe["CountingSandbox"](Sandbox(limits, preload=("math",))) as sandbox:
            session = await sandbox.session()
            await session.run("x = 20")
            branch = await session.fork()
            await branch.run("x += 1")
            outputs = [(await s.run("print(x * 2)")).stdout.strip() for s in (session, branch)]
            await branch.close()
            await session.restore()  # a fresh interpreter, the history replayed into it
            outputs.append((await session.run("print(x)")).stdout.strip())
            await session.close()
            return outputs, sandbox.cells

    outputs, cells = asyncio.run(use())
    assert outputs == ["40", "42", "20"]
    assert cells == 7  # 5 cells asked for, 2 replayed by restore


def test_a_registered_transport_is_chosen_by_sandbox_kind(run_recipe, tmp_path):
    recipe = run_recipe("A sandbox transport")
    cfg = config_from_recipe("A sandbox transport", tmp_path).sandbox

    async def use():
        async with make_sandbox(cfg) as sandbox:
            result = await sandbox.run_once("print(6 * 7)")
            return sandbox, result

    sandbox, result = asyncio.run(use())
    assert isinstance(sandbox, recipe["CountingSandbox"]) and sandbox.cells == 1
    assert result.stdout == "42\n" and cfg.timeout_s == 2.0


# ------------------------------------------------------------------------------ shipped models


def test_a_shipped_model_entry_is_accepted_by_name(run_recipe, tmp_path):
    """The entry registers; the config names it; the CLI's check lets it through to be
    fetched at load, and a near miss of it is refused with the name suggested."""
    from tirl.cliargs import check_model_source
    from tirl.config import ConfigError
    from tirl.models.sources import SHIPPED_MODELS

    try:
        run_recipe("A model shipped in a wheel")
        assert SHIPPED_MODELS["my-lab-tiny-instruct"].package == "my-lab-models"
        cfg = config_from_recipe("A model shipped in a wheel", tmp_path)
        assert cfg.model.name_or_path == "my-lab-tiny-instruct"
        check_model_source(cfg.model.name_or_path, "model.name_or_path")
        with pytest.raises(ConfigError, match="did you mean 'my-lab-tiny-instruct'"):
            check_model_source("my-lab-tiny-instuct", "model.name_or_path")
    finally:
        SHIPPED_MODELS.unregister("my-lab-tiny-instruct")


@pytest.mark.parametrize(
    "registry_path,entry,expected",
    [
        ("tirl.rollout.engines:ENGINES", lambda spec: None, "must be a EngineKind, got function"),
        ("tirl.protocol:PROTOCOLS", "cir_fences", "must be a Protocol, got str"),
        ("tirl.rewards.reward:REWARDS", lambda traj: 1.0, "must be a type, got function"),
        ("tirl.algos.losses:POLICY_LOSSES", 0.5, "must be a Callable, got float"),
    ],
)
def test_an_entry_of_the_wrong_type_is_refused_when_registered(registry_path, entry, expected):
    """A registration is type-checked (issue 44): `@ENGINES.register` on a bare factory (the
    old docstring's example) stores no function where an EngineKind is read later."""
    import importlib

    module, name = registry_path.split(":")
    registry = getattr(importlib.import_module(module), name)
    with pytest.raises(TypeError, match=expected):
        registry.add("a_plugins_entry", entry)
    assert "a_plugins_entry" not in registry.entries()


def test_a_scoring_kind_of_a_plugin_travels_as_json_without_editing_tirl():
    """verl's agent loop rebuilds tasks from JSON (`tirl.tasks.serialize`): a plugin's own
    scoring kind registers how its scorer is rebuilt."""
    from tirl.tasks.base import Task
    from tirl.tasks.serialize import SCORINGS, task_from_dict, task_to_dict

    @SCORINGS.register("length")
    def length_scorer(answer, meta, task_id):
        return lambda text: len(text) == int(answer)

    try:
        task = Task(
            id="t0", split="test", problem="Say 3 letters.", answer="3",
            scorer=lambda text: len(text) == 3, source="mine", meta={"scoring": "length"},
        )  # fmt: skip
        again = task_from_dict(task_to_dict(task))
        assert again.scorer("abc") and not again.scorer("abcd")
    finally:
        SCORINGS.unregister("length")
    with pytest.raises(ValueError, match="scoring 'length' cannot be serialized"):
        task_to_dict(task)
