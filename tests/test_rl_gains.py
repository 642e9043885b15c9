"""`tirl.eval.gains` (issue 32): what RL changed over its SFT start, paired by item, with a
bootstrap CI, on hand-made evaluations and in a run's report."""

from __future__ import annotations

import json
import math

import pytest

from tirl.eval.gains import paired_gain, rl_gains
from tirl.eval.report import write_report
from tirl.protocol.score import Score
from tirl.protocol.segments import Trajectory


def test_the_paired_gain_is_the_mean_item_difference_with_a_bootstrap_ci():
    before = {"a": 0.0, "b": 0.5, "c": 1.0, "d": 0.0}
    after = {"a": 1.0, "b": 0.5, "c": 1.0, "d": 0.5, "e": 1.0}  # "e" has no pair: left out
    gain = paired_gain(before, after)
    assert gain["n"] == 4 and gain["D"] == pytest.approx((1.0 + 0 + 0 + 0.5) / 4)
    low, high = gain["ci"]
    assert 0.0 <= low <= gain["D"] <= high <= 1.0
    # every item gains the same: the CI is that one value
    same = paired_gain({"a": 0.0, "b": 0.2}, {"a": 0.5, "b": 0.7})
    assert same["D"] == pytest.approx(0.5) and same["ci"] == pytest.approx([0.5, 0.5])
    # a gain on one item of 40 and a loss on another: the CI spans 0
    mixed = paired_gain(
        {str(i): 0.0 for i in range(40)},
        {"0": 1.0, "1": -1.0, **{str(i): 0.0 for i in range(2, 40)}},
    )
    assert mixed["D"] == 0 and mixed["ci"][0] < 0 < mixed["ci"][1]
    assert math.isnan(paired_gain({}, {"a": 1.0})["D"])


def _write(path, scores):
    rows = []
    for task_id, (reward, correct) in scores.items():
        traj = Trajectory(task_id=task_id)
        if reward is not None:
            traj.score = Score(reward=reward, correct=correct)
        else:
            traj.meta["status"] = "failed"
        rows.append(json.dumps(traj.to_dict()))
    path.write_text("\n".join(rows) + "\n")


def test_a_runs_report_shows_rl_against_its_sft_start(tmp_path):
    samples = tmp_path / "samples"
    samples.mkdir()
    _write(
        samples / "code_sft_heldout.jsonl",
        {"t0": (0.0, False), "t1": (0.5, False), "t2": (1.0, True), "t3": (0.0, False)},
    )
    _write(
        samples / "code_rl_heldout.jsonl",
        {"t0": (1.0, True), "t1": (1.0, True), "t2": (1.0, True), "t3": (None, False)},
    )
    _write(samples / "text_rl_heldout.jsonl", {"t0": (1.0, True)})  # no SFT evaluation: no row
    (tmp_path / "metrics.jsonl").write_text("")
    rows = rl_gains(tmp_path)
    assert [(r["variant"], r["eval_set"]) for r in rows] == [("code", "heldout")]
    reward, correct = rows[0]["reward"], rows[0]["correct"]
    assert reward["n"] == 3  # t3 failed after RL: no pair
    assert reward["D"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert reward["before"] == pytest.approx(1.5 / 4) and reward["after"] == pytest.approx(1.0)
    assert correct["D"] == pytest.approx(2 / 3)
    write_report(tmp_path, eval_results={}, metrics_path=tmp_path / "metrics.jsonl")
    md = (tmp_path / "report.md").read_text()
    assert "## RL against its SFT start" in md and "| code | heldout | 3 |" in md
    assert "RL against its SFT start" in (tmp_path / "report.html").read_text()
    assert json.loads((tmp_path / "rl_gains.json").read_text())[0]["reward"]["n"] == 3


def test_the_train_summary_prints_the_gains_when_both_phases_ran(tmp_path):
    from tirl.apps.evaluation import summary

    samples = tmp_path / "samples"
    samples.mkdir()
    _write(samples / "code_sft_heldout.jsonl", {"t0": (0.0, False), "t1": (1.0, True)})
    _write(samples / "code_rl_heldout.jsonl", {"t0": (1.0, True), "t1": (1.0, True)})
    text = summary({}, tmp_path)
    assert "RL against its SFT start" in text
    assert "code heldout (2 items): reward 0.500 → 1.000, gain +0.500" in text
    assert "RL against its SFT start" not in summary({}, tmp_path / "elsewhere")


def test_base_to_sft_and_code_against_text_are_paired_too(tmp_path):
    """With `eval.base` and both variants: what SFT added per variant, and code vs text after
    the last phase both reached, each paired by item, in other_gains.json and the report."""
    from tirl.eval.gains import other_gains

    samples = tmp_path / "samples"
    samples.mkdir()
    zero = {f"t{i}": (0.0, False) for i in range(4)}
    _write(samples / "code_base_heldout.jsonl", zero)
    _write(samples / "code_sft_heldout.jsonl", {**zero, "t0": (1.0, True), "t1": (1.0, True)})
    _write(samples / "code_rl_heldout.jsonl", {f"t{i}": (1.0, True) for i in range(4)})
    _write(samples / "text_sft_heldout.jsonl", zero)
    _write(samples / "text_rl_heldout.jsonl", {**zero, "t3": (1.0, True)})
    (tmp_path / "metrics.jsonl").write_text("")
    rows = {r["comparison"]: r for r in other_gains(tmp_path)}
    assert set(rows) == {"code: base → SFT", "text → code (RL)"}
    assert rows["code: base → SFT"]["correct"]["D"] == pytest.approx(0.5)
    versus = rows["text → code (RL)"]["correct"]
    assert versus["before"] == pytest.approx(0.25) and versus["D"] == pytest.approx(0.75)
    write_report(tmp_path, eval_results={}, metrics_path=tmp_path / "metrics.jsonl")
    md = (tmp_path / "report.md").read_text()
    assert "## Paired comparisons" in md and "| text → code (RL) | heldout | 4 |" in md
    assert len(json.loads((tmp_path / "other_gains.json").read_text())) == 2


def _rl_records(variant: str, uniform: list[float], accuracy: float = 0.0) -> list[dict]:
    return [
        {"variant": variant, "phase": "rl", "step": i, "train/uniform_group_share": u,
         "train/accuracy": accuracy, "train/truncation_rate": 0.6}
        for i, u in enumerate(uniform)
    ]  # fmt: skip


def test_rl_with_no_group_of_mixed_outcomes_is_called_out_with_what_helps(tmp_path):
    from tirl.apps.evaluation import summary
    from tirl.eval.signal import rl_signal_notes

    silent = _rl_records("code", [1.0] * 6)
    notes = rl_signal_notes([*silent, *_rl_records("text", [0.5, 0.25])])
    assert len(notes) == 1 and notes[0].startswith("code: RL learned nothing: in all 6 steps")
    assert "60% were cut at rl.max_model_tokens" in notes[0] and "rl.curriculum" in notes[0]
    nearly = rl_signal_notes(_rl_records("code", [1.0] * 9 + [0.5]))
    assert "95% of its groups over 10 steps scored alike" in nearly[0]
    solved = rl_signal_notes(_rl_records("code", [1.0] * 3, accuracy=1.0))
    assert "too easy" in solved[0]
    # in the console summary and at the top of the report
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in silent))
    assert "warning: code: RL learned nothing" in summary({}, tmp_path)
    write_report(tmp_path, eval_results={}, metrics_path=tmp_path / "metrics.jsonl")
    assert "## Warnings" in (tmp_path / "report.md").read_text()
    assert "RL learned nothing" in (tmp_path / "report.html").read_text()
