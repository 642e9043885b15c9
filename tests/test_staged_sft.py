"""Staged SFT (`sft.stages`): each stage's own mixture and steps, in order, on one optimizer;
the config's bad inputs; RL's first task past every item a stage saw; and without stages the
SFT records are today's (no `sft/stage` key)."""

from __future__ import annotations

import asyncio
import json

import pytest
from tiny_run import TINY, run, train_cmd

from tirl.config import ConfigError, dump_yaml, load_config
from tirl.run.config import RunConfig
from tirl.tasks import Mixture
from tirl.train.pipeline import Pipeline, first_rl_position

PRODUCT = "{source: arithmetic, kinds: [product]}"
MOD = "{source: arithmetic, kinds: [mod]}"
TWO_STAGES = (
    f"sft.stages=[{{steps: 2, data: [{PRODUCT}], examples: 16}}, {{steps: 3, data: [{MOD}]}}]"
)


def config(*overrides: str) -> RunConfig:
    return load_config(RunConfig, None, ["name=run", *overrides])


def error_of(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        config(*overrides)
    return str(e.value)


def test_stages_parse_with_their_own_steps_data_and_examples():
    cfg = config(TWO_STAGES)
    assert [s.steps for s in cfg.sft.stages] == [2, 3]
    assert cfg.sft.stages[0].data == [{"source": "arithmetic", "kinds": ["product"]}]
    assert [s.examples for s in cfg.sft.stages] == [16, None]
    assert cfg.sft.total_steps == 5
    assert config().sft.stages == [] and config().sft.total_steps == config().sft.steps


def test_the_resolved_config_with_stages_loads_back_as_it_was(tmp_path):
    cfg = config(TWO_STAGES)
    dump_yaml(cfg, tmp_path / "config.yaml")  # what a run folder keeps, read on --resume
    assert load_config(RunConfig, tmp_path / "config.yaml").sft.stages == cfg.sft.stages


@pytest.mark.parametrize(
    "override, expected",
    [
        ("sft.stages=[{}]", "sft.stages[0].steps"),
        (f"sft.stages=[{{steps: 0, data: [{PRODUCT}]}}]", "sft.stages[0].steps must be >= 1"),
        ("sft.stages=[{steps: 1, data: []}]", "sft.stages[0].data: name at least one task source"),
        (
            f"sft.stages=[{{steps: 1, data: [{PRODUCT}]}}, {{steps: 1, data: [{{source: nope}}]}}]",
            "sft.stages[1].data[0].source: unknown task source 'nope'",
        ),
        (
            "sft.stages=[{steps: 1, data: [{source: arithmetic, digits: 99}]}]",
            "sft.stages[0].data[0]",
        ),
        (f"sft.stages=[{{steps: 1, data: [{PRODUCT}], examples: 0}}]", "sft.stages[0].examples"),
    ],
)
def test_a_bad_stage_is_one_line_naming_its_key(override, expected):
    message = error_of(override)
    assert expected in message and "\n" not in message


def test_stages_with_sft_data_are_refused_naming_sft_stages(tmp_path):
    message = error_of(TWO_STAGES, f"sft.data={tmp_path / 'demos.jsonl'}")
    assert "sft.stages: stages draw" in message and "sft.data" in message


def test_rl_starts_past_every_item_a_stage_saw():
    entries = [{"source": "arithmetic", "kinds": ["product"]}]
    same = config(
        f"data.train=[{PRODUCT}]", f"sft.stages=[{{steps: 1, data: [{PRODUCT}], examples: 7}}]"
    )
    other = config(
        f"data.train=[{PRODUCT}]", f"sft.stages=[{{steps: 1, data: [{MOD}], examples: 7}}]"
    )
    train = Mixture.from_entries(entries, "data.train", 0)
    stages = lambda cfg: [Mixture.from_entries(s.data, "s", 0) for s in cfg.sft.stages]  # noqa: E731
    assert first_rl_position(same, train, stages(same)) == 7  # the stage's items come first
    assert first_rl_position(other, train, stages(other)) == 0  # a stage of other items
    plain = config(f"data.train=[{PRODUCT}]", "sft.examples=9")
    assert first_rl_position(plain, train, []) == 9  # without stages, as always


def test_each_stage_trains_on_demonstrations_of_its_own_mixture(tmp_path, monkeypatch):
    cfg = config(*TINY, "variants=[text]", "sft.examples=8", TWO_STAGES, f"out_dir={tmp_path}")
    seen = {}

    def capture(model, stages, sft, **kwargs):
        seen["stages"] = stages

    monkeypatch.setattr("tirl.train.pipeline.train_sft_stages", capture)
    monkeypatch.setattr("tirl.train.pipeline.save_policy", lambda *a, **k: None)
    pipe = Pipeline(cfg, tmp_path, evaluation=None)
    pipe.prepare()
    asyncio.run(pipe.train_sft("text", pipe.make_model(), None, False))
    (first, steps0), (second, steps1) = seen["stages"]
    assert (steps0, steps1) == (2, 3) and (len(first), len(second)) == (16, 8)
    products = [t.problem for t in pipe.stage_mixtures[0].items("train", 16)]
    mods = [t.problem for t in pipe.stage_mixtures[1].items("train", 8)]
    assert [d.meta["question"] for d in first] == products
    assert [d.meta["question"] for d in second] == mods
    assert all(t.meta["kind"] == "mod" for t in pipe.stage_mixtures[1].items("train", 8))


def sft_records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "sft"]


def test_a_two_stage_run_logs_both_stages_in_order_and_no_stages_logs_as_before(tmp_path):
    staged = run(train_cmd(tmp_path, "staged", "rl.steps=0", TWO_STAGES))
    assert staged.returncode == 0, staged.stderr[-2000:]
    records = sft_records(tmp_path / "staged")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["sft/stage"] for r in records] == [0, 0, 1, 1, 1]
    lrs = [r["train/lr"] for r in records]
    assert lrs == sorted(lrs)  # one warm-up over all stages (warmup_steps 10): no restart
    plain = run(train_cmd(tmp_path, "plain", "rl.steps=0"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    records = sft_records(tmp_path / "plain")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert not any("sft/stage" in r for r in records)
