"""The translated CIR and AgentMath configs load into verl 0.9.1's own config: Hydra composes
verl's `ppo_trainer` with the overrides (and, as a second form, the generated config file),
verl's `validate_config` accepts the result, and `omega_conf_to_dataclass` builds verl's
FSDPActorConfig, RolloutConfig and AlgoConfig, in which every translated value arrives.

Runs in the verl environment only (tests/verl/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tirl.config import load_config, to_dict
from tirl.integrations.verl import require_verl
from tirl.integrations.verl.config import run_config_from_verl, translate, verl_items
from tirl.run.config import RunConfig

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "verl"
SECTIONS = {  # translated key prefix -> the verl config node converted to a dataclass
    "actor_rollout_ref.actor.": "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout.": "actor_rollout_ref.rollout",
    "algorithm.": "algorithm",
}


@pytest.fixture(scope="module")
def verl_config_dir() -> str:
    require_verl()
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "problems.jsonl"
    path.write_text('{"problem": "What is 2 + 3?", "answer": "5"}\n' * 3)
    return path


def compose(config_dir: str, name: str, overrides: list[str] = ()):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=name, overrides=list(overrides))


def arrived(obj, dotted: str):
    """The value at `dotted` inside a verl dataclass (dict-valued fields included)."""
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@pytest.mark.parametrize("recipe", ["cir", "agentmath"])
def test_the_recipe_loads_into_verls_dataclasses_with_every_value(
    recipe, verl_config_dir, problems
):
    from omegaconf import OmegaConf
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.workers.config import FSDPActorConfig, RolloutConfig

    path, extra = RECIPES / f"{recipe}.yaml", [f"data.train[0].path={problems}"]
    items = verl_items(load_config(RunConfig, path, extra), path, extra)
    cfg = compose(verl_config_dir, "ppo_trainer", translate(path, extra).splitlines())
    validate_config(
        cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )

    built = {
        node: omega_conf_to_dataclass(OmegaConf.select(cfg, node)) for node in SECTIONS.values()
    }
    assert isinstance(built["actor_rollout_ref.actor"], FSDPActorConfig)
    assert isinstance(built["actor_rollout_ref.rollout"], RolloutConfig)
    assert isinstance(built["algorithm"], AlgoConfig)
    in_dataclasses = 0
    for key, value in items.items():
        prefix = next((p for p in SECTIONS if key.startswith(p)), None)
        if prefix is None:  # data.*, trainer.*, model.path, tirl.*: plain config values
            got = OmegaConf.select(cfg, key)
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        else:
            got = arrived(built[SECTIONS[prefix]], key[len(prefix) :])
            in_dataclasses += 1
        assert got == value, f"{key}: translated {value!r}, verl holds {got!r}"
    assert in_dataclasses > 30
    rollout = built["actor_rollout_ref.rollout"]
    # the lengths reach the rollout through verl's own interpolations
    assert rollout.response_length == items["data.max_response_length"]
    assert rollout.prompt_length == items["data.max_prompt_length"]
    assert built["actor_rollout_ref.actor"].rollout_n == items["actor_rollout_ref.rollout.n"]
    # tirl's loop finds the same run config in verl's
    assert to_dict(run_config_from_verl(cfg)) == to_dict(load_config(RunConfig, path, extra))


def test_the_generated_config_file_composes_to_the_same_config(verl_config_dir, problems, tmp_path):
    from omegaconf import OmegaConf

    path, extra = RECIPES / "agentmath.yaml", [f"data.train[0].path={problems}"]
    (tmp_path / "agentmath_verl.yaml").write_text(translate(path, extra, fmt="yaml"))
    from_file = compose(str(tmp_path), "agentmath_verl")
    from_overrides = compose(verl_config_dir, "ppo_trainer", translate(path, extra).splitlines())
    as_plain = lambda c: OmegaConf.to_container(c, resolve=True)  # noqa: E731
    assert as_plain(from_file) == as_plain(from_overrides)


def test_every_translated_estimator_is_one_verl_runs(verl_config_dir, problems):
    """adv_estimator names verl's registry holds once tirl's estimators are registered."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from tirl.integrations.verl.estimators import register_estimators

    register_estimators()
    base = RECIPES / "cir.yaml"
    for advantage in ("grpo", "drgrpo", "rloo", "reinforce++", "reinforce++-baseline"):
        for gamma in (1.0, 0.9) if advantage.startswith("reinforce") else (1.0,):
            extra = [
                f"data.train[0].path={problems}",
                f"rl.advantage={advantage}",
                f"rl.gamma={gamma}",
            ]
            name = verl_items(load_config(RunConfig, base, extra))["algorithm.adv_estimator"]
            assert callable(get_adv_estimator_fn(name)), (advantage, gamma, name)


def test_the_translation_imports_no_verl(problems):
    """`tirl verl config` works without verl: the translation never imports it."""
    code = (
        "import sys; from tirl.integrations.verl.config import translate;"
        f" translate({str(RECIPES / 'cir.yaml')!r}, ['data.train[0].path={problems}']);"
        " assert not [m for m in sys.modules if m == 'verl' or m.startswith('verl.')]"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_module_verl_imports_for_tirl_exists():
    """`actor_rollout_ref.model.external_lib` names a module verl can import."""
    import importlib.util

    from tirl.integrations.verl.config_table import PLUGIN_MODULE

    assert importlib.util.find_spec(PLUGIN_MODULE) is not None


def test_the_curriculum_overrides_compose_and_name_tirls_dataset(verl_config_dir, problems):
    """With rl.curriculum on, verl's own `get_dataset_class` finds tirl's dataset, and the
    dataset reads the recipe's curriculum settings back from the composed data section."""
    from verl.utils.dataset.rl_dataset import get_dataset_class

    from tirl.integrations.verl.curriculum import CurriculumDataset, curriculum_settings

    path = RECIPES / "cir.yaml"
    extra = [
        f"data.train[0].path={problems}",
        "rl.curriculum.enabled=true",
        "rl.curriculum.window=5",
    ]
    cfg = compose(verl_config_dir, "ppo_trainer", translate(path, extra).splitlines())
    assert get_dataset_class(cfg.data) is CurriculumDataset
    assert cfg.data.dataloader_num_workers == 0
    run = load_config(RunConfig, path, extra)
    curriculum, group_size, name = curriculum_settings(cfg.data)
    assert to_dict(curriculum) == to_dict(run.rl.curriculum)
    assert (group_size, name) == (run.rl.group_size, run.name)
