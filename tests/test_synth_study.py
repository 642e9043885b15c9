"""`tirl study synth --quick` on a smaller setting: a tiny untrained model is the teacher, served
by a real `tirl serve` the study starts on loopback, and a tiny model from scratch the student;
four problems, one RL step. The outputs are checked for shape and sanity, not for a number (the
tiny teacher writes garbage: nothing passes every stage, and the verdict must say so)."""

from __future__ import annotations

import json

import pytest
import yaml

from tirl.cli import main
from tirl.config import load_config
from tirl.models.tiny import TinyModelSpec, build_model, save_policy
from tirl.studies.synth_config import (
    SynthStudyConfig,
    problem_rows,
    problem_sources,
    worked_solution,
)

TINY_RUN = {
    "variants": ["code"],
    "threads": 1,
    "protocol": {"name": "cir_fences", "boundary": "exact_match"},
    "model": {"hidden_size": 32, "layers": 1, "heads": 2, "max_positions": 512,
              "vocab_size": 384, "tokenizer_corpus_items": 16},
    "sandbox": {"max_output_chars": 64, "preload": ["math"]},
    "sft": {"steps": 2, "batch_size": 4, "warmup_steps": 0, "examples": 4},
    "rl": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_model_tokens": 8,
           "warmup_steps": 0, "updates_per_step": 1},
    "eval": {"base": False, "samples_per_item": 0, "max_model_tokens": 8, "tool_budget": 1},
}  # fmt: skip


def _config(tmp_path, teacher: str) -> str:
    cfg = {
        "study": {"problems": 4, "heldout_items": 4, "scripted_examples": 4},
        "teacher": {"model": teacher, "threads": 1, "max_batch": 4, "concurrency": 4,
                    "start_timeout_s": 120},
        "stages": {"decontaminate": False},
        "run": TINY_RUN,
    }  # fmt: skip
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


# --quick's own sizes come after the config file: these, after --quick, shrink it further
SMALLER = ("study.problems=4", "study.heldout_items=4", "teacher.cot_max_tokens=8",
           "teacher.max_tokens=12", "run.sft.steps=2", "run.rl.steps=1")  # fmt: skip


@pytest.fixture()
def tiny_teacher(tokenizer, tmp_path):
    # Room for the synth prompts (about 1,200 tokens with a worked solution in the tiny model's
    # tokens): the server refuses longer ones.
    spec = TinyModelSpec(hidden_size=32, layers=1, heads=2, max_positions=2048)
    folder = tmp_path / "teacher"
    save_policy(build_model(tokenizer, spec, seed=0).eval(), tokenizer, folder)
    return str(folder)


def test_quick_study_with_a_served_tiny_teacher_writes_sane_outputs(tiny_teacher, tmp_path):
    out = tmp_path / "study"
    args = ["study", "synth", _config(tmp_path, tiny_teacher), "--quick", "--out", str(out)]
    assert main([*args, *SMALLER]) == 0
    for name in ("study.md", "report.html", "results.json", "training/report.html"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert results["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    assert results["why"]
    assert set(results["arms"]) == {"synth", "scripted", "none"}
    assert results["arms"]["scripted"]["sft_examples"] == 4
    assert results["arms"]["synth"]["sft_examples"] == results["synthesized"]
    if results["synthesized"] == 0:  # the untrained teacher's garbage: nothing passed
        assert results["verdict"] == "inconclusive"
        assert results["arms"]["none"]["same_as"] == "synth"  # the same run, not trained twice
    stages = {s["stage"]: s for s in results["stages"]}
    # study.cot: dataset: gsm_symbolic's two problems bring their worked solutions (correct),
    # the teacher writes basic_arithmetic's two
    cot = stages["cot (dataset + teacher)"]
    assert {"codeify", "format"} <= set(stages)
    for s in results["stages"]:
        assert 0 <= s["pass_rate"] <= 1 and s["out"] <= s["in"], s
    assert cot["in"] == 4 and stages["codeify"]["in"] == 4
    assert cot["reasons"]["from the dataset"] == 2 and cot["reasons"]["boxed answer correct"] >= 2
    assert cot["seconds"] > 0 and stages["codeify"]["seconds"] > 0
    chains = [json.loads(line) for line in (out / "cot" / "input.jsonl").read_text().splitlines()]
    assert [c["cot_from"] for c in chains] == ["dataset", "teacher", "dataset", "teacher"]
    assert all(c["solution"] == c["worked"] for c in chains if c["cot_from"] == "dataset")
    for arm, row in results["arms"].items():
        for phase in ("sft", "rl"):
            for metric in ("correct", "calls", "tokens"):
                c = row[phase][metric]
                assert c["n"] == 4, (arm, phase, metric)
                assert c["ci"][0] <= c["mean"] <= c["ci"][1], (arm, phase, metric, c)
    assert [p["pair"] for p in results["pairs"]] == [
        "synth - scripted",
        "synth - none",
        "scripted - none",
    ]
    for p in results["pairs"]:
        for key in ("correct", "calls", "tokens", "correct_sft"):
            assert p[key]["n"] == 4 and p[key]["ci"][0] <= p[key]["D"] <= p[key]["ci"][1]
    md = (out / "study.md").read_text()
    assert f"**{results['verdict']}**" in md and "synth - scripted" in md
    log = out / "cot" / "server.log"
    assert "KV cache budget" in log.read_text()  # the teacher was a real tirl serve

    # Resumed: no teacher is started, no evaluation redone, the same results come out.
    log_size = log.stat().st_size
    samples = sorted((out / "arms").glob("*/samples/*.jsonl"))
    assert len(samples) == 6
    stamps = [p.stat().st_mtime_ns for p in samples]
    assert main([*args, "--resume", *SMALLER]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["arms"]["none"]["rl"] == results["arms"]["none"]["rl"]
    assert resumed["stages"] == results["stages"]
    assert log.stat().st_size == log_size
    assert [p.stat().st_mtime_ns for p in samples] == stamps
    assert len(json.loads((out / "timings.json").read_text())["runs"]) == 2


def test_an_unknown_problem_source_is_one_line(tmp_path, capsys):
    bad = "study.sources=[{dataset: gsm_symbolik}]"
    assert main(["study", "synth", "--out", str(tmp_path / "s"), "--quick", bad]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "study.sources[0].dataset" in lines[0], lines
    assert "gsm_symbolic" in lines[0]  # the close name
    assert not (tmp_path / "s").exists()


def test_a_datasets_worked_solution_ends_as_the_teachers_would():
    gsm = "He works 6 * 2 = 12 days a month.\nHe earns 12 * 195 = 2340.\n#### 2340"
    assert worked_solution(gsm, "2340") == (
        "He works 6 * 2 = 12 days a month.\nHe earns 12 * 195 = 2340.\nThe answer is \\boxed{2340}."
    )
    assert worked_solution("So x = 4, \\boxed{4}.", "4") == "So x = 4, \\boxed{4}."
    assert worked_solution(" 3 + 4 = 7 ", "7") == "3 + 4 = 7\nThe answer is \\boxed{7}."


def test_only_a_source_with_worked_solutions_brings_them():
    cfg = load_config(SynthStudyConfig, overrides=["study.problems=2"])
    rows = problem_rows(problem_sources(cfg), 2, "train")
    gsm, arithmetic = rows
    assert gsm["source"] == "gsm_symbolic" and "\\boxed{" in gsm["worked"]
    assert gsm["worked"].endswith(f"\\boxed{{{gsm['answer']}}}.")
    assert arithmetic["source"] == "basic_arithmetic" and "worked" not in arithmetic
    assert not any("worked" in row for row in problem_rows(problem_sources(cfg), 2, "test"))
