"""`tirl eval` keeps every sample once and never takes an outage for wrong answers: samples a
dead server failed are recorded as failed, left out of every metric, fail the run, and are
retried by a rerun; a torn samples file is cut before the rerun appends; two benchmark files
with the same stem are both reported. Real tiny models, a real `tirl serve` on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

from tirl.backends.hf import HFEngine
from tirl.cli import main
from tirl.eval.benchmark_eval import (
    benchmark_keys,
    benchmark_metrics,
    run_benchmark,
    samples_path,
    write_benchmark_report,
)
from tirl.eval.evaluate import evaluate
from tirl.models.tiny import save_policy
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tasks.base import Task
from tirl.tasks.sources.dataset import score_math


def _dead_url() -> str:
    """A closed port on 127.0.0.1: bound once, then released, so nothing listens there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _bench(path: Path, numbers: list[int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"problem": f"Compute {a} * 3.", "answer": str(3 * a)} for a in numbers]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line parses


def test_a_dead_server_fails_the_eval_and_a_rerun_on_a_live_one_retries_the_failed_samples(
    server, tmp_path, capsys
):
    folder = tmp_path / "model"  # where the `server` fixture saved the served model
    bench = _bench(tmp_path / "mini.jsonl", [11, 12, 13])
    out, clean = tmp_path / "out", tmp_path / "clean"

    def args(url: str, where: Path) -> list[str]:
        return ["eval", url, "--tokenizer", str(folder), "--benchmark", str(bench)]+ [
            "--temperature", "0", "--max-tokens", "24", "--out", str(where)
        ]  # fmt: skip

    assert main(args(_dead_url(), out)) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tirl:")]
    assert len(err) == 1 and "3 of 3 samples failed" in err[0] and "retry" in err[0], err
    failed = _lines(out / "mini.samples.jsonl")
    assert [r["status"] for r in failed] == ["failed"] * 3 and all(r["error"] for r in failed)
    report = json.loads((out / "metrics.json").read_text())["mini"]
    assert report["n_failed"] == 3 and report["avg@1"] is None  # not an accuracy of 0

    assert main(args(server, out)) == 0  # the same --out, now with a live server
    assert main(args(server, clean)) == 0  # what an uninterrupted run reports
    capsys.readouterr()
    retried, reference = _lines(out / "mini.samples.jsonl"), _lines(clean / "mini.samples.jsonl")
    assert sorted(r["item_id"] for r in retried) == sorted(r["item_id"] for r in reference)
    assert len(retried) == 3 and {r["status"] for r in retried} == {"ok"}
    verdicts = {r["item_id"]: (r["predicted"], r["correct"]) for r in retried}
    assert verdicts == {r["item_id"]: (r["predicted"], r["correct"]) for r in reference}
    resumed = json.loads((out / "metrics.json").read_text())["mini"]
    expected = json.loads((clean / "metrics.json").read_text())["mini"]
    assert resumed["n_failed"] == 0 and resumed["avg@1"] == expected["avg@1"]


def test_arithmetic_eval_counts_failed_samples_apart_from_wrong_answers(
    tokenizer, tmp_path, capsys
):
    tokenizer.save_pretrained(tmp_path / "model")
    url = _dead_url()
    argv = ["eval", url, "data.eval=[{name: heldout, items: 3}]", "eval.max_model_tokens=8"]
    assert main([*argv, "eval.samples_per_item=0", "--tokenizer", str(tmp_path / "model")]) == 1
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)["heldout"]  # {eval set: metrics}
    assert metrics["eval/failed"] == metrics["eval/samples"] == 3
    # no answer was judged, none counts as wrong: nan, written as JSON's null
    assert metrics["eval/accuracy"] is None
    assert "3 of 3 samples failed" in captured.err


def math_task(item_id: str, problem: str, answer: str) -> Task:
    """A benchmark's math task, as the `benchmark` source makes it from a file row."""
    meta = {"scoring": "math", "category": None, "item_id": item_id}
    scorer = lambda text: score_math(answer, text)  # noqa: E731
    return Task(f"benchmark/toy/{item_id}", "test", problem, answer, scorer, "benchmark", meta)


def _drawn(lines: list[str]) -> dict[tuple[str, int], list[list[int]]]:
    """(item, sample) -> the token ids of its trajectory's segments."""
    records = map(json.loads, lines)
    return {
        (r["item_id"], r["sample"]): [s["ids"] for s in r["trajectory"]["segments"]]
        for r in records
    }


def _run(model, tokenizer, out_dir: Path, items: list[Task], k: int = 2) -> list[dict]:
    async def go():
        async with Sandbox(SandboxLimits(timeout_s=2), preload=("math",)) as sandbox:
            engine = HFEngine(model, tokenizer.eos_token_id, max_batch=8, seed=0)
            try:
                rollout = Rollout(engine, tokenizer, sandbox)
                settings = RolloutSettings(max_model_tokens=12, tool_budget=1, temperature=1.0)
                return await run_benchmark(
                    rollout, "toy", items, settings, k, out_dir, progress=False
                )
            finally:
                engine.close()

    return asyncio.run(go())


def test_a_torn_last_line_is_cut_before_the_rerun_appends(tiny_model, tokenizer, tmp_path):
    items = [math_task(str(i), f"Compute {a} * 7.", str(7 * a)) for i, a in enumerate([3, 4, 5])]
    _run(tiny_model, tokenizer, tmp_path, items)
    path = samples_path(tmp_path, "toy")
    whole = path.read_text().splitlines(keepends=True)
    assert len(whole) == 6
    # a crash mid-write: two whole records, then half of the third
    path.write_text("".join(whole[:2]) + whole[2][: len(whole[2]) // 2])
    _run(tiny_model, tokenizer, tmp_path, items)
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 6 and lines[:2] == whole[:2] and all(s.endswith("\n") for s in lines)
    keys = [(r["item_id"], r["sample"]) for r in map(json.loads, lines)]
    assert sorted(keys) == [(str(i), j) for i in range(3) for j in range(2)]
    # each sample is seeded by (item, sample): the regenerated ones draw what the first run drew
    # (the same tokens; their log-probs may differ in the last bit with the batch beside them)
    assert _drawn(lines) == _drawn(whole)
    # a whole record that lost only its newline is kept, not generated again
    kept = "".join(lines[:3]) + lines[3].rstrip("\n")
    path.write_text(kept)
    _run(tiny_model, tokenizer, tmp_path, items)
    again = path.read_text().splitlines(keepends=True)
    assert len(again) == 6 and "".join(again[:4]) == kept + "\n"


def test_sampled_evaluation_draws_are_fixed_by_the_seed_not_by_what_runs_beside(
    tiny_model, tokenizer
):
    items = [math_task(str(i), f"Compute {a} * 7.", str(7 * a)) for i, a in enumerate([3, 4, 5])]

    async def samples(tasks: list[Task], seed: int) -> list[list[list[int]]]:
        async with Sandbox(SandboxLimits(timeout_s=2), preload=("math",)) as sandbox:
            engine = HFEngine(model=tiny_model, eos_id=tokenizer.eos_token_id, max_batch=8)
            try:
                rollout = Rollout(engine, tokenizer, sandbox)
                settings = RolloutSettings(max_model_tokens=12, tool_budget=1, temperature=1.0)
                ids = lambda t: tokenizer.encode(t.problem)  # noqa: E731
                _, trajs = await evaluate(rollout, tasks, settings, ids, k=3, seed=seed)
            finally:
                engine.close()
        return [[seg.ids for seg in t.segments] for t in trajs]

    first = asyncio.run(samples(items, seed=0))
    assert len({str(s) for s in first}) > 1  # sampled, not one answer repeated
    assert asyncio.run(samples(items, seed=0)) == first
    # the first two items beside another task in the engine's batches: the same draws
    other = math_task("9", "Compute 8 * 7 + 1.", "57")
    assert asyncio.run(samples([*items[:2], other], seed=0))[:6] == first[:6]
    assert asyncio.run(samples(items, seed=1)) != first


def test_two_benchmark_files_with_one_stem_both_appear_in_the_report(
    tiny_model, tokenizer, tmp_path, capsys
):
    save_policy(tiny_model, tokenizer, tmp_path / "model")
    first = _bench(tmp_path / "d1" / "b.jsonl", [11, 12])
    second = _bench(tmp_path / "d2" / "b.jsonl", [21])
    out = tmp_path / "out"
    argv = ["eval", str(tmp_path / "model"), "--benchmark", f"{first},{second}", "--out", str(out)]
    argv += ["--temperature", "0", "--max-tokens", "8"]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert {name: m["n_items"] for name, m in metrics.items()} == {"d1/b": 2, "d2/b": 1}
    report = (out / "report.md").read_text()
    assert "| d1/b |" in report and "| d2/b |" in report
    files = {name: samples_path(out, name).read_text() for name in metrics}
    assert main(argv) == 0  # a rerun finds each benchmark's samples under the same name
    assert {name: samples_path(out, name).read_text() for name in metrics} == files
    capsys.readouterr()


def test_benchmark_names_are_unique_and_the_same_file_twice_is_one_benchmark(tmp_path):
    a, b = tmp_path / "x" / "a" / "b.jsonl", tmp_path / "y" / "a" / "b.jsonl"
    assert benchmark_keys(["math500", "aime24"]) == {"math500": "math500", "aime24": "aime24"}
    assert benchmark_keys([str(a)]) == {str(a): "b"}
    assert benchmark_keys([str(a), str(b)]) == {str(a): "x/a/b", str(b): "y/a/b"}
    same = str(tmp_path / "x" / "." / "a" / "b.jsonl")
    assert benchmark_keys([str(a), same]) == {str(a): "b", same: "b"}
    named = tmp_path / "z" / "math500.jsonl"
    assert benchmark_keys(["math500", str(named)]) == {
        "math500": "math500",
        str(named): "z/math500",
    }


def test_failed_samples_are_left_out_of_every_metric_and_counted(tmp_path):
    stats = {"num_calls": 1, "num_ok": 1, "num_error": 0, "num_skipped": 0, "num_void": 0}
    stats |= {"all_ok": True, "any_error": False, "last_ok": True, "model_tokens": 10}
    stats |= {"tool_tokens": 2}

    def ok(item, sample, correct):
        return {"item_id": item, "sample": sample, "status": "ok", "correct": correct}| {
            "predicted": "5" if correct else "6", "category": "x", "stats": stats,
            "finish_reason": "stop",
        }  # fmt: skip

    failed = {"item_id": "a", "sample": 1, "status": "failed", "error": "ConnectionError: x"}
    failed |= {"finish_reason": "error"}
    m = benchmark_metrics([ok("a", 0, True), failed, ok("b", 0, False), ok("b", 1, False)], k=2)
    assert m["avg@2"] == 0.5  # a: 1 of its 1 finished sample; b: 0 of 2
    assert m["pass@2"] == 0.5  # a counts pass@1 = 1 (one sample left), b 0
    assert m["code/all/n"] == 3 and m["tokens/mean"] == 10.0  # the failed one is in none
    assert (m["n_samples"], m["n_failed"], m["failed_error"]) == (4, 1, "ConnectionError: x")
    nothing = benchmark_metrics([failed], k=2)
    assert nothing["avg@2"] is None and nothing["n_failed"] == 1
    write_benchmark_report({"all_failed": nothing, "some": m}, tmp_path, "t")
    assert "| all_failed | 0 | 2 | — |" in (tmp_path / "report.md").read_text()
