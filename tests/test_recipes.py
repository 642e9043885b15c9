"""Every `tirl train` recipe in recipes/ loads as a valid run config, and the RACES recipe keeps
what its comment promises (issue 32): staged SFT, the curriculum over sizes, a held-out set per
size."""

from __future__ import annotations

from pathlib import Path

import pytest

from tirl.config import ConfigError, load_config
from tirl.run.config import RunConfig

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


# recipes that need an input made first: loading stops at exactly that input, so every other
# key was read and is valid
NEEDS = {
    "math_dataset.yaml": "path: problems.jsonl: no such file",  # data.train[0].path=...
    "synth_races.yaml": "no such SFT file",  # `tirl synth races` output, made first
    "verifiers.yaml": "needs the verifiers package",  # its side suite runs it
}


@pytest.mark.parametrize("name", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_train_recipe_loads(name):
    if name in NEEDS:
        with pytest.raises(ConfigError, match=NEEDS[name]):
            load_config(RunConfig, RECIPES / name)
        return
    assert load_config(RunConfig, RECIPES / name).variants


def test_the_races_recipe_trains_in_stages_and_draws_by_size():
    cfg = load_config(RunConfig, RECIPES / "races.yaml")
    assert [s.steps for s in cfg.sft.stages] == [700, 300]
    assert [s.data[0]["max_size"] for s in cfg.sft.stages] == [2, 3]
    assert cfg.rl.curriculum.enabled and cfg.rl.curriculum.key == ["size"]
    assert [e["name"] for e in cfg.data.eval] == ["size1", "size2", "size3", "size4"]
    pool = cfg.data.train[0]["envs"]
    assert all(e["envs"] == pool for e in cfg.data.eval)
