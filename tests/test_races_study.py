"""`tirl study races` (issue 18): held-out sets disjoint from training, a reduced study end to end
whose report has its structure and whose arms trained on exactly their mixtures (counted from the
logged task ids), and the analysis's rules on hand-made cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tirl.cli import main
from tirl.config import ConfigError
from tirl.envs.core import REGISTRY
from tirl.studies.races_report import ARM_TITLES, UNTESTABLE, mixture_check, task_row
from tirl.studies.races_stats import (
    bootstrap_draws,
    claim4_testability,
    heldout_score,
    start_verdict,
    verdict,
    versus_start,
    what_it_would_take,
)
from tirl.studies.races_tasks import (
    ARM_SPECS,
    ARMS,
    CURRICULUM_ARMS,
    EVAL_SIZES,
    HeldOut,
    choose_pool,
    composition_key,
    item_key,
    study_tasks,
)
from tirl.tasks.sources.races import RacesSource

POOL = choose_pool(10, 2, 0)


@pytest.fixture(scope="module")
def tasks():
    return study_tasks(
        POOL, 0, sft_items=300, arm_items=120, atomic_items=24, per_cell=3, sft_sizes=(2, 4),
        arm_seeds=(0, 1),
    )  # fmt: skip


def test_the_pool_is_short_int_environments_with_a_fifth_for_races_small():
    names = [*POOL.train, *POOL.unseen]
    assert len(POOL.train) == 10 and len(POOL.unseen) == 2 and len(set(names)) == 12
    assert all(REGISTRY.get(n).signature == ("int", "int") for n in names)
    assert set(POOL.small) <= set(POOL.train) and len(POOL.small) == 2
    assert choose_pool(10, 2, 0) == POOL  # a function of the seed
    with pytest.raises(ValueError, match="only .* int -> int environments"):
        choose_pool(500, 2, 0)


def test_held_out_sets_share_no_item_and_no_composition_with_any_training_set(tasks):
    training = [*(t for ts in [*tasks.sft, *tasks.arms.values()] for t in ts)]
    trained_compositions = {composition_key(t) for t in training if len(t.envs) > 1}
    trained_items = {item_key(t) for t in training}
    trained_prompts = {t.prompt for t in training}
    held = [*tasks.atomic, *tasks.compositions]
    assert not {composition_key(t) for t in tasks.compositions} & trained_compositions
    assert not {item_key(t) for t in held} & trained_items
    assert not {t.prompt for t in held} & trained_prompts
    # the unseen environments: in no training set and no atomic task, only in compositions
    unseen = set(POOL.unseen)
    assert not any(set(t.envs) & unseen for t in training)
    assert not any(set(t.envs) & unseen for t in tasks.atomic)
    assert {e for t in tasks.compositions for e in t.envs} >= unseen
    # a composition's side depends on its names alone; a training one is on the train side
    held_out = HeldOut(POOL.unseen, 0.25)
    assert all(held_out.composition_side(composition_key(t)) == "test" for t in tasks.compositions)
    assert all(
        held_out.composition_side(composition_key(t)) == "train"
        for t in training if len(t.envs) > 1
    )  # fmt: skip
    # every size and operator held out, each composition once
    cells = {(len(t.envs), t.operator) for t in tasks.compositions}
    assert len(cells) == len(EVAL_SIZES) * 4 and len(tasks.compositions) == 3 * len(cells)
    assert len({composition_key(t) for t in tasks.compositions}) == len(tasks.compositions)
    assert {t.meta["split"] for t in held} == {"test"}
    assert {t.meta["split"] for t in training} == {"train"}


def test_without_unseen_environments_a_share_of_orders_is_held_out_by_name():
    pool = choose_pool(10, 0, 0)
    assert pool.unseen == () and len(pool.train) == 10
    held = study_tasks(pool, 0, sft_items=200, arm_items=40, atomic_items=8, per_cell=4,
                       sft_sizes=(2,), arm_seeds=(0,), heldout_share=0.25)  # fmt: skip
    # 64 held-out compositions, of trained environments only, none of them in SFT or any arm
    assert len(held.compositions) == 64 and {e for t in held.compositions for e in t.envs} <= set(
        pool.train
    )
    trained = {composition_key(t) for ts in [*held.sft, *held.arms.values()] for t in ts}
    assert not {composition_key(t) for t in held.compositions} & trained
    # about that share of the 90 orders of two distinct environments is held out
    rule = HeldOut((), 0.25)
    pairs = {(a, b) for a in pool.train for b in pool.train if a != b}
    test_pairs = sum(rule.composition_side(p) == "test" for p in pairs)
    assert 0.15 * len(pairs) < test_pairs < 0.35 * len(pairs)
    assert sum(HeldOut((), 0.5).composition_side(p) == "test" for p in pairs) > test_pairs
    # the usual eighth leaves too few sequences of two for four cells of four
    with pytest.raises(ValueError, match="ran out of size-2 compositions .* study.heldout_share"):
        study_tasks(pool, 0, sft_items=20, arm_items=4, atomic_items=2, per_cell=4,
                    sft_sizes=(2,), arm_seeds=(0,), heldout_share=0.125)  # fmt: skip


def test_every_arm_draws_its_own_mixture(tasks):
    for (arm, _), rows in tasks.arms.items():
        spec = ARM_SPECS[arm]
        pool = set(POOL.small if spec.small_pool else POOL.train)
        assert rows, arm
        assert {t.operator for t in rows} <= set(spec.mixture), arm
        assert all(spec.sizes[0] <= len(t.envs) <= spec.sizes[1] for t in rows), arm
        assert {e for t in rows for e in t.envs} <= pool, arm
        assert {t.meta["arm"] for t in rows} == {arm}
    assert {a for a, _ in tasks.arms} == set(ARMS)
    races = tasks.arms["races", 0]
    assert {t.operator for t in races} == {"sequential", "parallel", "sort", "select"}
    assert {len(t.envs) for t in tasks.arms["curriculum", 0]} == {1, 2, 3, 4, 5}
    # SFT's stages show every answer format: atomic tasks and compositions of size 2, then up to 4
    assert [{len(t.envs) for t in stage} for stage in tasks.sft] == [{1, 2}, {1, 2, 3, 4}]
    for stage in tasks.sft:
        assert {t.operator for t in stage} == {"sequential", "parallel", "sort", "select"}


def test_seeds_draw_different_rl_tasks_from_the_same_pool_and_the_same_held_out_sets(tasks):
    again = study_tasks(
        POOL, 0, sft_items=300, arm_items=120, atomic_items=24, per_cell=3, sft_sizes=(2, 4),
        arm_seeds=(1,),
    )  # fmt: skip
    for arm in ARMS:
        first, second = (tasks.arms[arm, s] for s in (0, 1))
        assert [t.to_dict() for t in again.arms[arm, 1]] == [t.to_dict() for t in second], arm
        shared = {item_key(t) for t in first} & {item_key(t) for t in second}
        assert len(shared) < len(first) // 2, (arm, len(shared))  # mostly other tasks
    assert [t.to_dict() for t in again.compositions] == [t.to_dict() for t in tasks.compositions]
    assert [t.to_dict() for t in again.atomic] == [t.to_dict() for t in tasks.atomic]
    assert [t.to_dict() for t in again.sft[1]] == [t.to_dict() for t in tasks.sft[1]]


def test_a_file_split_by_meta_keeps_each_rows_split(tmp_path, tasks):
    from tirl.envs.dataset import write_tasks

    path = tmp_path / "t.jsonl"
    write_tasks([*tasks.arms["seq2", 0][:5], *tasks.compositions[:3]], path)
    source = RacesSource(path=str(path), split_by="meta")
    source.validate()
    assert source.size("train") == 5 and source.size("test") == 3
    assert source.item("test", 0).problem == tasks.compositions[0].prompt
    with pytest.raises(ConfigError, match="split_by: applies to a tasks file"):
        RacesSource(split_by="meta").validate()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["meta"]["split"] = "valid"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: split_by is 'meta' but the row's meta"):
        RacesSource(path=str(path), split_by="meta").validate()


def test_verdicts_and_scores_on_hand_made_cases():
    assert verdict(0.01, 0.2) == "reproduced"
    assert verdict(-0.3, -0.05) == "not reproduced"
    assert verdict(-0.1, 0.1) == "inconclusive"
    assert verdict(math.nan, 0.1) == "inconclusive"
    # held-out score: the mean of each set's mean (2 seeds x items), NaN items left out
    mats = {
        "atomic": np.array([[1.0, 0.0], [1.0, 1.0]]),  # mean 0.75
        "compositions": np.array([[0.5, np.nan, 0.0], [0.25, 0.25, 0.5]]),  # mean 0.3
    }
    assert heldout_score(mats) == pytest.approx((0.75 + 0.3) / 2)


def test_an_arm_against_its_sft_start_is_a_paired_difference_with_a_verdict():
    rng = np.random.default_rng(0)
    draws = bootstrap_draws(rng, 3, {"atomic": 6, "compositions": 8})
    start = {"atomic": np.array([1.0, 0, 0, 1, 0, 0]), "compositions": np.zeros(8)}
    # every seed solves two more atomic items and half the compositions: beats its start
    better = {"atomic": np.tile([1.0, 1, 1, 1, 0, 0], (3, 1)),
              "compositions": np.tile([1.0, 0] * 4, (3, 1))}  # fmt: skip
    out = versus_start(better, start, draws)
    assert out["D"] == pytest.approx(((4 - 2) / 6 + 0.5) / 2)
    assert out["compositions_D"] == pytest.approx(0.5)
    assert out["ci"][0] > 0 and out["compositions_ci"][0] > 0
    assert out["verdict"] == out["compositions_verdict"] == "beats its SFT start"
    # the seeds disagree around the start: within the noise, and the same items are paired
    noisy = {"atomic": np.array([[1.0, 1, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0], [1, 0, 0, 1, 0, 0]]),
             "compositions": np.array([[1.0] + [0] * 7, [0] * 8, [0] * 8])}  # fmt: skip
    out = versus_start(noisy, start, draws)
    assert out["ci"][0] <= 0 <= out["ci"][1] and out["verdict"] == "within the noise"
    assert versus_start({k: np.tile(v, (3, 1)) for k, v in start.items()}, start, draws)["ci"] == (
        0.0, 0.0,
    )  # fmt: skip
    assert start_verdict(-0.3, -0.1) == "below its SFT start"
    assert start_verdict(math.nan, 0.1) == "no score"


def test_what_it_would_take_extrapolates_the_measured_curve_linearly():
    # by hand: the points (0, 0.30), (3, 0.33), (6, 0.36) lie on a line of slope 0.01; the CI
    # (-0.05, +0.11) has half-width 0.08, reached after ceil(0.08 / 0.01) = 8 steps; a gain of
    # 0.03 clears it at 32 * (0.08 / 0.03)^2 = 227.6 -> 228 items
    w = what_it_would_take([(0, 0.30), (3, 0.33), (6, 0.36)], 0.03, (-0.05, 0.11), 32)
    assert w["slope"] == pytest.approx(0.01)
    assert w["half_width"] == pytest.approx(0.08)
    assert (w["steps"], w["items"]) == (8, 228)
    # least squares, not the end points: (0, 0.3), (3, 0.2), (6, 0.4) has slope 0.1 / 6
    assert what_it_would_take([(0, 0.3), (3, 0.2), (6, 0.4)], 0.1, (0, 0.2), 10)["slope"] == (
        pytest.approx(0.1 / 6)
    )
    # no upward trend, no gain, too few points: nothing to extrapolate
    flat = what_it_would_take([(0, 0.4), (6, 0.3)], -0.1, (-0.2, 0.0), 32)
    assert flat["slope"] == pytest.approx(-0.1 / 6)
    assert math.isnan(flat["steps"]) and math.isnan(flat["items"])
    assert math.isnan(what_it_would_take([(0, 0.4)], 0.0, (0, 0), 32)["slope"])


def test_claim_4_is_testable_only_if_the_start_solves_a_chain_of_size_3_or_more():
    sizes = [2, 2, 3, 4, 5]
    reward = np.array([1.0, 0.5, 0.5, 0.2, 0.0])
    none = claim4_testability({"reward": reward, "correct": np.array([1.0, 0, 0, 0, 0])},
                              sizes, {"seq3": 0.1})  # fmt: skip
    assert not none["testable"] and none["sentence"].startswith("claim 4 is not testable")
    assert none["sft_by_size"]["2"] == {"items": 2, "reward": 0.75, "accuracy": 0.5}
    some = claim4_testability({"reward": reward, "correct": np.array([1.0, 0, 1, 1, np.nan])},
                              sizes, {})  # fmt: skip
    assert some["testable"] and (some["solved"], some["of"]) == (2, 3)
    assert "solves 2 of 3 held-out compositions of size 3+" in some["sentence"]


def test_the_mixture_check_names_what_an_arm_should_not_have_trained_on():
    pool = {"train": list(POOL.train), "small": list(POOL.small), "unseen": list(POOL.unseen)}
    a, b = POOL.train[:2]
    good = {"tasks": 2, "operators": {"sequential": 2}, "sizes": {"2": 2},
            "envs": {a: 2, b: 2}, "compositions": [[a, b]]}  # fmt: skip
    assert mixture_check(good, "seq2", pool, set()) == []
    bad = {**good, "sizes": {"3": 2}, "operators": {"sort": 2},
           "envs": {POOL.unseen[0]: 1, a: 1}, "compositions": [[a, b]]}  # fmt: skip
    problems = mixture_check(bad, "seq2", pool, {(a, b)})
    assert any("sizes outside 2-2" in p for p in problems)
    assert any("operators outside" in p for p in problems)
    assert any(POOL.unseen[0] in p for p in problems)
    assert any("held-out compositions trained on" in p for p in problems)
    assert mixture_check({**good, "tasks": 0}, "seq2", pool, set()) == ["trained on no task"]


REDUCED = [
    "study.seeds=[0]", "study.arm_items=24", "study.atomic_items=4", "study.per_cell=1",
    "run.model.hidden_size=32", "run.model.layers=1", "run.model.heads=2",
    "run.model.tokenizer_corpus_items=60", "study.sft_stages=[[2,3],[3,2]]", "run.sft.examples=48",
    "run.sft.batch_size=8", "run.rl.steps=2", "run.rl.prompts_per_step=2", "run.rl.group_size=2",
    "run.rl.max_model_tokens=24", "run.eval.max_model_tokens=24", "run.eval.every_rl_steps=0",
]  # fmt: skip


def test_a_reduced_study_writes_its_report_and_every_arm_trained_on_its_mixture(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "races", "--out", str(out), *REDUCED]) == 0
    printed = capsys.readouterr().out
    assert "code: claims 1:" in printed and "text: claims 1:" in printed

    # the report's structure
    md = (out / "study.md").read_text()
    for heading in ("## The four claims", "## Every arm", "## What each arm trained on",
                    "## What it would take (held-out compositions, a linear extrapolation)",
                    "## Held-out compositions by size and operator (code)",
                    "## Held-out compositions by size and operator (text)"):  # fmt: skip
        assert heading in md, heading
    claims = md.split("## The four claims")[1].split("##")[0]
    claim_rows = [
        line for line in claims.splitlines() if line.startswith("| ") and "claim" not in line
    ]
    assert len(claim_rows) == 4
    for row in claim_rows:
        assert row.count("reproduced") + row.count("inconclusive") + row.count("untestable") >= 2
    every_arm = md.split("## Every arm")[1].split("##")[0]
    assert every_arm.count("\n| ") - 1 == 2 * len(ARMS)
    assert (
        "| held-out - SFT start [CI] | compositions - SFT start [CI] | vs SFT start |" in every_arm
    )
    for plot in ("curves_code.png", "curves_text.png", "sizes.png", "curriculum_code.png",
                 "curriculum_text.png"):  # fmt: skip
        assert (out / "plots" / plot).read_bytes()[:4] == b"\x89PNG"
    page = (out / "report.html").read_text()
    assert page.count("<table>") >= 5 and page.count("data:image/png;base64,") == 5
    results = json.loads((out / "results.json").read_text())
    assert set(results["claims"]) == {"code", "text"}
    assert set(results["would_take"]) == set(results["arms"])
    for w in results["would_take"].values():  # the SFT start, the mid-RL eval, the end
        assert [step for step, _ in w["curve"]][0] == 0 and len(w["curve"]) >= 2
    assert all(len(v) == 4 for v in results["claims"].values())
    for key, row in results["arms"].items():
        assert set(row["vs_sft"]) == {
            "D", "ci", "verdict", "compositions_D", "compositions_ci", "compositions_verdict"
        }  # fmt: skip
        assert row["vs_sft"]["verdict"] in ("beats its SFT start", "below its SFT start",
                                            "within the noise"), key  # fmt: skip
    assert "beat their SFT start" in printed
    # claim 4: testable or not, said in the report and results.json, and the verdict follows
    for variant in ("code", "text"):
        c4 = results["claim4"][variant]
        assert set(c4["sft_by_size"]) == {"2", "3", "4", "5"}
        assert set(c4["first_step_train_reward"]) == {"seq3", "seq4", "seq5"}
        assert c4["sentence"] in md
        if not c4["testable"]:
            assert results["claims"][variant][3]["verdict"].startswith("untestable")
    assert "claim 4 is testable" in md or "claim 4 is not testable" in md
    assert set(results["curriculum"]["code"]) == {"1", "2", "3", "4", "5"}
    assert "## The curriculum's buckets (code)" in md

    # --report-only writes the same report again without training; elsewhere it is one line
    (out / "study.md").unlink()
    assert main(["study", "races", "--report-only", "--out", str(out)]) == 0
    assert (out / "study.md").read_text() == md
    assert "code: claims 1:" in capsys.readouterr().out
    assert main(["study", "races", "--report-only", "--out", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "has no study to report" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    # a study stopped midway is reported on the arms that finished, and says which did not
    last = "seq5"
    progress = out / "seed0" / last / "eval_progress.json"
    kept = progress.read_bytes()
    progress.unlink()
    assert main(["study", "races", "--report-only", "--out", str(out)]) == 0
    partial = (out / "study.md").read_text()
    assert "The study was stopped before these arms finished" in partial
    assert f"{ARM_TITLES[last]} (`--resume` finishes them)" in partial
    partial_results = json.loads((out / "results.json").read_text())
    assert f"code/{last}" not in partial_results["arms"]
    assert len(partial_results["arms"]) == len(results["arms"]) - 2  # both variants
    for variant in ("code", "text"):
        claim4 = partial_results["claims"][variant][3]["verdict"]
        assert claim4 in ("inconclusive (not finished: seq5)", UNTESTABLE), claim4
        # its figure over SEQ-2, 3 and 4: the longest chains' best - the shortest chains' best
        c4 = partial_results["claims"][variant][3]
        scores = {
            a: partial_results["arms"][f"{variant}/{a}"]["heldout"]
            for a in ("seq2", "seq3", "seq4")
        }
        assert c4["arms"] == ["seq2", "seq3", "seq4"]
        assert c4["D"] == pytest.approx(scores["seq4"] - max(scores["seq2"], scores["seq3"]))
        assert c4["ci"][0] <= c4["D"] <= c4["ci"][1]
        # its first step is logged, and that is all claim 4's testability needs of it
        assert partial_results["claim4"][variant]["first_step_train_reward"].keys() == {
            "seq3", "seq4", "seq5"}  # fmt: skip
    progress.write_bytes(kept)
    assert main(["study", "races", "--report-only", "--out", str(out)]) == 0
    assert (out / "study.md").read_text() == md
    capsys.readouterr()

    # what every arm trained on, counted here from the logged task ids and the arm's task file
    manifest = json.loads((out / "tasks" / "manifest.json").read_text())
    heldout = {tuple(json.loads(line)["envs"])
               for line in (out / "tasks" / "heldout_compositions.jsonl").read_text().splitlines()}  # fmt: skip
    per_run = 2 * 2  # rl.steps x rl.prompts_per_step: no adaptive batches, every step updates
    for arm in ARMS:
        spec = ARM_SPECS[arm]
        pool = set(manifest["pool"]["small" if spec.small_pool else "train"])
        rows = (out / "tasks" / f"arm_{arm}_seed0.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in rows]
        records = [json.loads(line) for line in (out / "seed0" / arm / "metrics.jsonl").open()]
        for variant in ("code", "text"):
            ids = [i for r in records if r["variant"] == variant and r["phase"] == "rl"
                   for i in r.get("train/tasks", [])]  # fmt: skip
            if arm in CURRICULUM_ARMS:  # drawn by bucket; the stream cycles over the file
                assert len(ids) == per_run and all(task_row(i) < len(rows) for i in ids), ids
            else:
                assert sorted(ids) == sorted(f"races/train/{k}" for k in range(per_run)), (arm, ids)
            trained = [rows[int(i.rsplit("/", 1)[1])] for i in ids]
            assert {r["operator"] for r in trained} <= set(spec.mixture), arm
            assert all(spec.sizes[0] <= len(r["envs"]) <= spec.sizes[1] for r in trained), arm
            assert {e for r in trained for e in r["envs"]} <= pool, arm
            assert not {tuple(r["envs"]) for r in trained} & heldout, arm
            assert results["mixtures"][f"{variant}/{arm}/0"]["problems"] == []
            assert results["mixtures"][f"{variant}/{arm}/0"]["tasks"] == per_run
            # the policies are not kept unless asked: the metrics and samples are the result
            assert not (out / "seed0" / arm / variant / "rl").exists(), arm
            assert not (out / "seed0" / arm / variant / "rl_state").exists(), arm

    # --sft-from: a study with other RL settings starts every arm from this study's SFT model
    # instead of training one: no SFT step is logged, and the start scores as it did here
    again = tmp_path / "again"
    other_rl = [o for o in REDUCED if not o.startswith("run.rl.steps=")] + ["run.rl.steps=1"]
    args = ["study", "races", "--out", str(again), "--sft-from", str(out), *other_rl]
    assert main([*args, "study.arms=[races]"]) == 0
    assert f"the SFT start's evaluation is {out}'s" in capsys.readouterr().out
    sft_log = again / "sft" / "metrics.jsonl"
    logged = [json.loads(line) for line in sft_log.open()] if sft_log.exists() else []
    assert not [r for r in logged if "train/loss" in r]
    start, start_again = (json.loads((d / "sft" / "eval_progress.json").read_text())
                          for d in (out, again))  # fmt: skip
    assert start_again == start  # reused: the same held-out files, the same eval settings
    for sample_file in (out / "sft" / "samples").iterdir():
        assert (
            again / "sft" / "samples" / sample_file.name
        ).read_bytes() == sample_file.read_bytes()
    # under other evaluation settings the start is evaluated again, on the same held-out sets
    eval_other = tmp_path / "eval_other"
    wider = ["run.eval.max_model_tokens=25", "study.arms=[races]"]
    assert (
        main(
            ["study", "races", "--out", str(eval_other), "--sft-from", str(out), *other_rl, *wider]
        )
        == 0
    )
    assert "the SFT start is evaluated again (run.eval differ)" in capsys.readouterr().out
    start_other = json.loads((eval_other / "sft" / "eval_progress.json").read_text())
    for variant in ("code", "text"):
        for s in ("atomic", "compositions"):
            assert (
                start_other[variant]["sft"][s]["eval/n_items"]
                == start[variant]["sft"][s]["eval/n_items"]
            )
    assert json.loads((again / "results.json").read_text())["arms"].keys() == {
        "code/races", "text/races"}  # fmt: skip
    # a start made from other SFT settings or tasks, or no start at all, is one line
    refused = tmp_path / "refused"
    for extra, folder, where, message in (
        (["run.sft.lr=0.01"], refused, out, "made from other settings (sft.lr differ)"),
        (["study.task_seed=1"], refused, out, "sft_stage0, tasks.sft_stage1 differ"),
        ([], refused, tmp_path / "nowhere", "no such folder"),
        ([], refused, tmp_path, "it has no sft/inputs.json"),
        ([], again, again, "it is the study's own folder"),
    ):
        bad = ["study", "races", "--out", str(folder), "--sft-from", str(where), *other_rl]
        assert main([*bad, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert not refused.exists() and (again / "results.json").exists()
    assert main(["study", "races", "--report-only", "--out", str(out), "--sft-from", str(out)]) == 2
    assert "--sft-from is for a study that trains" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, words",
    [
        ("study.arms=[individual,bogus]", "unknown arm 'bogus'"),
        ("run.rl.adaptive_batch=true", "run.rl.adaptive_batch must be false"),
        ("study.pool_size=400", "int -> int environments"),
        ("run.rl.curriculum.enabled=true", "the study turns the curriculum on for the curriculum"),
        ("study.sft_stages=[[2,10],[0,5]]", "each stage must be [max chain size >= 1, steps >= 1]"),
        ("study.sft_stages=[]", "must list at least one stage"),
        ("study.heldout_share=1", "study.heldout_share"),
        ("study.heldout_share=0.05", "ran out of size-2 compositions (3 of size 2 held out; raise"),
    ],
)
def test_a_bad_study_config_is_one_line(override, words, tmp_path, capsys):
    assert main(["study", "races", "--out", str(tmp_path / "s"), override]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
