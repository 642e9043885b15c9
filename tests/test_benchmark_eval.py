"""Benchmark evaluation with the tool loop: records, metrics, and resuming after an interruption,
with a real tiny model, a real tokenizer and the real sandbox."""

from __future__ import annotations

import asyncio
import json
import math

from tirl.backends.hf import HFEngine
from tirl.eval.benchmark_eval import (
    benchmark_metrics,
    read_done,
    run_benchmark,
    write_benchmark_report,
)
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tasks.base import Task
from tirl.tasks.sources.dataset import score_math


def math_task(item_id: str, problem: str, answer: str, category: str | None = None) -> Task:
    """A benchmark's math task, as the `benchmark` source makes it from a file row."""
    return Task(
        f"benchmark/toy/{item_id}",
        "test",
        problem,
        answer,
        scorer=lambda text: score_math(answer, text),
        source="benchmark",
        meta={"scoring": "math", "category": category, "item_id": item_id},
    )


ITEMS = [
    math_task(str(i), f"Compute {a} * {b}.", str(a * b), "products")
    for i, (a, b) in enumerate([(12, 34), (56, 78), (9, 10)])
]
SETTINGS = RolloutSettings(max_model_tokens=12, tool_budget=1, temperature=1.0)


def _run(tiny_model, tokenizer, out_dir, items=ITEMS, k=2):
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2), preload=("math",)) as sandbox:
            engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=8, seed=0)
            try:
                rollout = Rollout(engine, tokenizer, sandbox)
                return await run_benchmark(
                    rollout,
                    "toy",
                    items,
                    SETTINGS,
                    k,
                    out_dir,
                    chunk=4,
                    progress=False,
                )
            finally:
                engine.close()

    return asyncio.run(main())


def test_every_sample_is_recorded_and_a_rerun_generates_nothing(tiny_model, tokenizer, tmp_path):
    records = _run(tiny_model, tokenizer, tmp_path)
    path = tmp_path / "toy.samples.jsonl"
    assert len(records) == 6 and len(path.read_text().splitlines()) == 6
    rec = records[0]
    assert {"item_id", "sample", "gold", "predicted", "correct", "reason", "stats"} <= set(rec)
    assert rec["trajectory"]["segments"][0]["kind"] == "prompt"
    before = path.read_text()
    again = _run(tiny_model, tokenizer, tmp_path)
    assert path.read_text() == before  # nothing regenerated, nothing appended
    assert sorted((r["item_id"], r["sample"]) for r in again) == sorted(
        (r["item_id"], r["sample"]) for r in records
    )


def test_an_interrupted_run_resumes_without_redoing_finished_samples(
    tiny_model, tokenizer, tmp_path
):
    _run(tiny_model, tokenizer, tmp_path)
    path = tmp_path / "toy.samples.jsonl"
    lines = path.read_text().splitlines()
    kept = lines[:2]
    path.write_text("\n".join(kept) + "\n" + lines[2][: len(lines[2]) // 2])  # torn last line
    assert len(read_done(path)) == 2
    records = _run(tiny_model, tokenizer, tmp_path)
    assert len(records) == 6
    finished = [json.loads(line) for line in kept]
    for old in finished:  # the finished samples were kept as they were, not redone
        same = [
            r for r in records if (r["item_id"], r["sample"]) == (old["item_id"], old["sample"])
        ]
        assert same == [old]


def rec(item, sample, correct, predicted, category, calls: int = 1) -> dict:
    """One finished sample's record as `run_benchmark` writes it, with `calls` code blocks."""
    stats = {
        "num_calls": calls,
        "num_ok": calls,
        "num_error": 0,
        "num_skipped": 0,
        "num_void": 0,
        "all_ok": True,
        "any_error": False,
        "last_ok": True,
        "model_tokens": 10,
        "tool_tokens": 2,
    }
    return {
        "item_id": item,
        "sample": sample,
        "correct": correct,
        "predicted": predicted,
        "category": category,
        "stats": stats,
        "finish_reason": "stop",
    }


def test_metrics_over_records_by_hand():
    records = [
        rec("a", 0, True, "5", "x"),
        rec("a", 1, False, "6", "x"),  # item a: 1 of 2
        rec("b", 0, False, "1", "y"),
        rec("b", 1, False, "1", "y"),  # item b: 0 of 2
    ]
    m = benchmark_metrics(records, k=2)
    assert m["avg@2"] == 0.25  # (1/2 + 0/2) / 2
    assert m["pass@2"] == 0.5  # a has a correct sample, b does not
    assert m["maj@2"] == 0.5  # a: tie 5/6 goes to the earlier "5" (correct); b: "1" (wrong)
    assert m["by_category"] == {"x": 0.5, "y": 0.0}
    low, high = m["avg@2_ci95"]
    assert low <= 0.25 <= high
    assert m["code/correct/full_pass_rate"] == 1.0 and m["tokens/accuracy_per_1k"] == 25.0


def test_metrics_json_holds_null_not_nan_for_a_rate_with_nothing_to_divide_by(tmp_path):
    records = [rec("a", 0, False, "1", "x", calls=0), rec("a", 1, False, "2", "x", calls=0)]
    m = benchmark_metrics(records, k=2)
    assert math.isnan(m["code/correct/full_pass_rate"])  # no correct sample: nan in memory
    write_benchmark_report({"toy": m}, tmp_path, "toy")

    def refuse(constant):
        raise AssertionError(f"{constant} in metrics.json is not JSON")

    saved = json.loads((tmp_path / "metrics.json").read_text(), parse_constant=refuse)
    assert saved["toy"]["code/correct/full_pass_rate"] is None
    assert saved["toy"]["avg@2"] == 0.0
