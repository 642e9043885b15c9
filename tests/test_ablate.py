"""`tirl ablate`: one SFT model per seed, every variant's RL from it, one comparison."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tirl.cli import main
from tirl.config import ConfigError
from tirl.studies.ablate import PRESETS, parse_variants

TINY = [
    "sft.steps=4",
    "sft.examples=32",
    "sft.batch_size=8",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.group_size=2",
    "rl.max_model_tokens=16",
    "data.eval=[{name: heldout, items: 4}]",
    "eval.max_model_tokens=16",
    "eval.samples_per_item=0",
    "model.tokenizer_corpus_items=100",
    "model.hidden_size=32",
    "model.layers=1",
    "model.heads=2",
]


def test_ablate_runs_each_variant_from_the_same_sft_model_and_compares_them(tmp_path):
    out = tmp_path / "abl"
    args = ["ablate", "--preset", "cir", "--variant", "lr-up:rl.lr=1e-3", "--seeds", "0", "1"]
    assert main([*args, "--out", str(out), *TINY]) == 0
    table = (out / "ablation.md").read_text()
    for name in [*PRESETS["cir"], "lr-up"]:
        assert f"| {name} |" in table
    assert "`protocol.boundary=stop_token`" in table and "(reference)" in table
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 2  # one per seed
    for per_seed in results:
        # one SFT model per boundary mode: the stop-token variant has its own
        assert set(per_seed) == {"sft", "sft-stop_token", *PRESETS["cir"], "lr-up"}
        assert all("eval/accuracy" in per_seed[name]["rl"]["heldout"] for name in PRESETS["cir"])
    # Every variant starts RL from the seed's SFT model, and trajectories are seeded by task
    # and sample: variants whose switches only act on the update sample the same first batch.
    records = [json.loads(line) for line in (out / "seed0" / "metrics.jsonl").open()]
    first = {r["variant"]: r for r in records if r["phase"] == "rl" and r["step"] == 0}
    assert set(first) == {*PRESETS["cir"], "lr-up"}
    same_rollouts = ["cir", "-tool-mask", "-no-entropy", "-no-kl", "-clip-higher", "lr-up"]
    for key in ("train/reward_mean", "length/model_tokens_mean", "tools/calls_mean"):
        assert len({first[name][key] for name in same_rollouts}) == 1, key
    assert (out / "report.html").is_file() and (out / "seed1" / "cir" / "rl").is_dir()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--preset", "nope"], ["unknown preset", "cir"]),
        ([], ["--preset", "--variant"]),
        (["--variant", "broken"], ["NAME:key=value"]),
        (["--variant", "x:rl.lrr=1"], ["variant 'x'", "rl.lrr"]),
    ],
)
def test_bad_ablation_requests_fail_with_one_line(tmp_path, argv, words):
    proc = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "ablate", *argv, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr


def test_the_cir_preset_trains_reinforce_pp_with_the_plus_minus_one_reward():
    """CIR (§3.1) trains REINFORCE++ with a binary +1 / -1 reward: every variant of the preset
    keeps both, and removes one strategy at most."""
    for name, overrides in PRESETS["cir"].items():
        assert {"rl.advantage=reinforce++", "rl.reward=binary"} <= set(overrides), name
        assert len(overrides) <= 3, name


def test_parse_variants_adds_command_line_variants_after_the_preset():
    variants = parse_variants("agentmath", ["mine:rl.lr=1e-3,rl.gamma=0.9"])
    assert list(variants)[-1] == "mine" and variants["mine"] == ["rl.lr=1e-3", "rl.gamma=0.9"]
    with pytest.raises(ConfigError):
        parse_variants(None, [])
