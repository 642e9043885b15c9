"""`tirl ablate`: one SFT model per seed, every variant's RL from it, one comparison."""

from __future__ import annotations

import html
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from tirl.cli import main
from tirl.config import ConfigError
from tirl.models.tiny import is_saved_policy
from tirl.protocol.score import Score
from tirl.protocol.segments import Trajectory
from tirl.studies.ablate import PRESETS, parse_variants
from tirl.studies.ablate_claims import VERDICTS, claim_rows, verdict

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


CLAIM_ARMS = ["text-only", "-exact-match", "-tool-mask", "-budget-growth"]


def rl_records(path):
    return [r for r in map(json.loads, path.open()) if r["phase"] == "rl"]


def test_the_quick_cir_claims_ablation_judges_each_claim_from_paired_items(tmp_path):
    """The CI form of issue 46's CIR study (`--quick` on the tiny model): its outputs have the
    study's shape and sane values, whatever the numbers."""
    out = tmp_path / "abl"
    small = [*TINY, "rl.steps=6", "data.eval=[{name: heldout, items: 8}]"]
    argv = ["ablate", "--preset", "cir-claims", "--quick", "--seeds", "3", "4", "--out", str(out)]
    assert main([*argv, *small]) == 0
    (per_seed,) = json.loads((out / "results.json").read_text())  # --quick: the first seed
    assert set(per_seed) == {"sft", "sft-stop_token", "sft-text", *PRESETS["cir-claims"]}
    records = rl_records(out / "seed3" / "metrics.jsonl")
    for arm in PRESETS["cir-claims"]:  # --quick: at most 4 RL steps of the 6 asked for
        assert sorted(r["step"] for r in records if r["variant"] == arm) == [0, 1, 2, 3], arm
    text_only = [r for r in records if r["variant"] == "text-only"]
    assert all(r["tools/calls_mean"] == 0 for r in text_only)
    sft_text = (out / "seed3" / "samples" / "sft-text_sft_heldout.jsonl").read_text()
    assert "```python" not in sft_text  # fine-tuned and evaluated without the interpreter

    claims = json.loads((out / "claims.json").read_text())
    assert [c["arm"] for c in claims] == CLAIM_ARMS
    for c in claims:
        assert c["verdict"] in VERDICTS and c["n"] == 8
        assert c["ci"][0] <= c["D"] <= c["ci"][1] and -1 <= c["D"] <= 1
    table = (out / "ablation.md").read_text()
    report = (out / "report.html").read_text()
    assert "CIR's claims" in table and html.escape("CIR's claims") in report
    for c in claims:
        assert f"| {c['arm']} |" in table and html.escape(c["claim"]) in report


def test_verdicts_follow_the_ci_of_the_paired_difference():
    assert verdict([0.01, 0.2])[0] == "reproduced"
    assert verdict([-0.3, -0.02])[0] == "not reproduced"
    assert verdict([-0.1, 0.1]) == ("inconclusive", "the CI contains 0")
    assert verdict([math.nan, math.nan])[0] == "inconclusive"
    assert "cannot separate" in verdict([0.0, 0.0], tied_at=1.0)[1]  # a ceiling


def test_claim_rows_pair_items_within_each_seed(tmp_path):
    """D = reference - arm over (seed, item) pairs: hand-made samples files, hand-computed D."""

    def write(seed, arm, correct):
        path = tmp_path / f"seed{seed}" / "samples" / f"{arm}_rl_heldout.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, ok in enumerate(correct):
            traj = Trajectory(task_id=f"t{i}", score=Score(reward=float(ok), correct=bool(ok)))
            lines.append(json.dumps(traj.to_dict()))
        path.write_text("\n".join(lines) + "\n")

    write(0, "cir", [1, 1, 1, 0])
    write(0, "text-only", [0, 1, 0, 0])
    write(1, "cir", [1, 0])
    write(1, "text-only", [1, 1])  # the same ids, another seed: paired within the seed only
    (row,) = claim_rows([tmp_path / "seed0", tmp_path / "seed1"], ["cir", "text-only"], "heldout")
    assert row["n"] == 6 and row["D"] == pytest.approx((1 + 0 + 1 + 0 + 0 - 1) / 6)
    assert row["ci"][0] <= row["D"] <= row["ci"][1]
    write(0, "-tool-mask", [1, 1, 1, 1])
    write(0, "cir", [1, 1, 1, 1])
    (row,) = claim_rows([tmp_path / "seed0"], ["cir", "-tool-mask"], "heldout")
    assert row["D"] == 0 and row["why"].startswith("both arms score 1 on every item")


def test_a_killed_ablation_resumes_where_it_stopped(tmp_path, capsys):
    """SIGKILL mid-ablation (after the first arm finished), then --resume: every arm ends with
    its results, each step is logged once, the finished arm is not trained again, no process
    of the killed run is left; another setting on resume is refused in one line."""
    out = tmp_path / "abl"
    argv = ["ablate", "--preset", "cir-claims", "--out", str(out),
            *TINY, "rl.steps=3", "rl.checkpoint_every=1"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "tirl.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    first = out / "seed0" / "cir" / "rl"
    try:
        deadline = time.monotonic() + 300
        while not is_saved_policy(first) and proc.poll() is None:
            assert time.monotonic() < deadline, "the first arm never finished"
            time.sleep(0.05)
        assert proc.poll() is None, "the ablation finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(2)
    with pytest.raises(ProcessLookupError):  # the run's children died with it
        os.killpg(proc.pid, 0)
    finished_at = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}

    assert main([*argv, "--resume"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == finished_at
    (per_seed,) = json.loads((out / "results.json").read_text())
    assert all("eval/accuracy" in per_seed[arm]["rl"]["heldout"] for arm in PRESETS["cir-claims"])
    steps = [(r["variant"], r["step"]) for r in rl_records(out / "seed0" / "metrics.jsonl")]
    assert sorted(steps) == sorted((arm, s) for arm in PRESETS["cir-claims"] for s in range(3))

    assert main([*argv, "rl.lr=0.5", "--resume"]) == 2
    assert "other settings (config.rl.lr)" in capsys.readouterr().err.splitlines()[-1]
