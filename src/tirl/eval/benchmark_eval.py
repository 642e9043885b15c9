"""Evaluate a policy on benchmarks (MATH-500, AIME, AMC, OlymMATH, HMMT, RACES test splits) with
the tool loop, resumably.

Each finished sample is appended to `<out>/<benchmark>.samples.jsonl` at once, one JSON line
holding the item id, the sample index, the verdict and the whole trajectory. A rerun with the
same output folder reads that file first and generates only the (item, sample) pairs that are
missing, so an interruption loses at most the samples in flight. Metrics are computed from the
file, i.e. from every sample, old and new alike. The file is append-only (`tirl.files`): a torn
last line (a crash or a full disk mid-write) is cut before the rerun appends.

Failed samples: a trajectory whose engine, server or sandbox failed (finish_reason "error" or
"cancelled", see `tirl.rollout.runner`) is recorded with `"status": "failed"` and its `"error"`,
not judged, left out of avg@k and every other metric, and counted (`n_failed` of `n_samples`).
A rerun drops the failed records from the file and generates those samples again, so in the end
the file holds each (item, sample) once. Finished samples have `"status": "ok"` (records written
before this field existed count as ok unless their finish_reason says failed).

Names: a benchmark is reported, and its samples file named, by `benchmark_keys`: the name as
given (math500), or a file's stem (`d1/b.jsonl` -> `b`); two files with the same stem get the
shortest trailing parts of their paths that tell them apart (`d1/b`, `d2/b`; the samples file is
`d1~b.samples.jsonl`). Each record carries the benchmark's `source` (the resolved file, or the
name), and a samples file that holds another source's samples is refused, not mixed in.

Problems and scoring: the benchmarks are read through the `benchmark` task source
(`tirl.tasks.sources.benchmark`, `benchmark_tasks`) as `Task`s, and every finished trajectory is
scored by its task with `tirl.tasks.scoring.score_trajectory`, the scorer training and the task
evaluation use: the model's prose only (no interpreter output, not the inside of its own code
blocks). Math tasks compare the last `\\boxed{}` with the gold answer through the math verifier
(`tirl.rewards.verify`); RACES tasks are scored by their operator's reward, and count as correct
only at reward 1. A record keeps the verdict under its old keys (predicted, correct, reason, and
reward for RACES), so files written before still resume and load.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tirl.config import ConfigError
from tirl.eval.evaluate import FAILED_FINISH, mean_pass_at_most_k
from tirl.eval.metrics import (
    avg_at_k,
    avg_at_k_ci,
    by_category,
    code_block_stats,
    majority_answer,
    token_efficiency,
)
from tirl.files import JsonlAppender, json_text, read_jsonl, write_text
from tirl.protocol.segments import Trajectory
from tirl.report_kit import figure, save_png
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings, trajectory_seed
from tirl.tasks.base import Task
from tirl.tasks.scoring import score_trajectory

MATH_PROMPT = (
    "{problem}\n\nSolve the problem step by step. You may write Python in ```python blocks; each"
    " block runs as soon as it is closed and its output is shown to you. Put the final answer in"
    " \\boxed{{}}.\n"
)


FILE_SUFFIXES = (".jsonl", ".parquet")


def benchmark_keys(specs: Sequence[str]) -> dict[str, str]:
    """A unique report name for each --benchmark spec (see the module doc): a name stays as it
    is, a file is named by its stem, or by as many trailing parts of its resolved path as tell
    it apart from the others (`d1/b`, `d2/b`). The same file given twice gets one name."""
    parts: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        path = Path(spec)
        is_file = path.suffix in FILE_SUFFIXES
        parts[spec] = path.resolve().with_suffix("").parts[1:] if is_file else (spec,)
    distinct = set(parts.values())
    keys: dict[tuple[str, ...], str] = {}
    for own in dict.fromkeys(parts.values()):
        others = distinct - {own}
        n = 1
        while n < len(own) and any(o[-n:] == own[-n:] for o in others):
            n += 1
        key = "/".join(own[-n:])
        used = set(keys.values())
        base, i = key, 2
        while key in used:  # one path is the other's tail (a name and a file /math500.jsonl)
            key, i = f"{base}~{i}", i + 1
        keys[own] = key
    return {spec: keys[parts[spec]] for spec in specs}


def benchmark_source(spec: str) -> str:
    """What a samples record says it came from: the resolved file, or the benchmark name."""
    path = Path(spec)
    return str(path.resolve()) if path.suffix in FILE_SUFFIXES else spec


def samples_path(out_dir: Path, name: str) -> Path:
    return Path(out_dir) / f"{name.replace('/', '~')}.samples.jsonl"


def is_failed_record(rec: dict) -> bool:
    return rec.get("status") == "failed" or rec.get("finish_reason") in FAILED_FINISH


def _key(rec: dict) -> tuple[str, int]:
    return str(rec["item_id"]), int(rec["sample"])


def read_done(path: Path) -> dict[tuple[str, int], dict]:
    """Finished samples by (item id, sample index), the first of each; failed samples and lines
    that do not parse (a torn last line) are not finished, and are generated again."""
    return _finished(read_jsonl(path))


def _finished(records) -> dict[tuple[str, int], dict]:
    done: dict[tuple[str, int], dict] = {}
    for rec in records:
        if "item_id" in rec and "sample" in rec and not is_failed_record(rec):
            done.setdefault(_key(rec), rec)
    return done


def _check_source(path: Path, records: list[dict], source: str | None) -> None:
    other = {r["source"] for r in records if r.get("source")} - {source}
    if source is not None and other:
        raise ConfigError(
            f"{path} holds samples of {sorted(other)[0]}, not of {source}; use another --out"
        )


def benchmark_tasks(
    specs: Sequence[str], data_dir: str | None = None, limit: int | None = None
) -> dict[str, tuple[list[Task], str]]:
    """(tasks, source) of every `--benchmark` spec (comma-separated lists allowed) by its
    unique report name (`benchmark_keys`), read through the `benchmark` task source
    (`tirl.tasks.sources.benchmark`): the first `limit` tasks of each (for `races`, `limit`
    tasks are built). A benchmark that cannot be read is a ConfigError naming it."""
    from tirl.tasks.sources.benchmark import BenchmarkSource

    names = [n.strip() for spec in specs for n in spec.split(",") if n.strip()]
    keys = benchmark_keys(names)
    loaded: dict[str, tuple[list[Task], str]] = {}
    for name in dict.fromkeys(names):
        if keys[name] in loaded:
            continue  # the same file named twice
        source = BenchmarkSource(benchmark=name, benchmark_dir=data_dir, races_n=limit or 200)
        try:
            tasks = source.load_tasks()
        except (ValueError, ImportError) as e:
            raise ConfigError(f"--benchmark {name}: {e}") from None
        loaded[keys[name]] = (tasks[:limit] if limit else tasks, benchmark_source(name))
    return loaded


def is_races(task: Task) -> bool:
    """A RACES task: scored by its operator reward, asked in its own words."""
    return task.meta.get("scoring") == "races"


def item_id(task: Task) -> str:
    """The id a samples record keys `task` by: the benchmark's own item id."""
    return str(task.meta.get("item_id", task.id))


def prompt_for(task: Task, template: str = MATH_PROMPT) -> str:
    if is_races(task):  # a RACES task carries its own prompt
        return task.problem
    return template.format(problem=task.problem)


def sample_record(
    name: str, task: Task, sample: int, traj: Trajectory, source: str | None = None
) -> dict[str, Any]:
    """One samples-file record. A finished trajectory is scored here, by its task
    (`tirl.tasks.scoring.score_trajectory`, the one scorer of training and evaluation), and its
    verdict kept beside it under the keys the file has always had: predicted, correct, reason,
    and the reward for RACES tasks (which give partial credit and take no majority vote)."""
    rec: dict[str, Any] = {"benchmark": name, "item_id": item_id(task), "sample": sample}
    rec.update({"category": task.meta.get("category"), "gold": task.answer})
    if source is not None:
        rec["source"] = source
    if traj.finish_reason in FAILED_FINISH:
        traj.task_id = task.id
        rec.update(status="failed", error=traj.meta.get("error", ""))
    else:
        score = score_trajectory(traj, task)
        rec.update(status="ok", predicted=score.predicted, correct=score.correct)
        if is_races(task):
            rec["reward"] = score.reward
        rec.update(reason=score.reason, stats=tool_stats(traj))
    rec.update(finish_reason=traj.finish_reason, trajectory=traj.to_dict())
    return rec


async def run_benchmark(
    rollout: Rollout,
    name: str,
    tasks: Sequence[Task],
    settings: RolloutSettings,
    k: int,
    out_dir: Path,
    chunk: int = 64,
    progress: bool = True,
    source: str | None = None,
    seed: int = 0,
    prompt_of: Callable[[Task], str | list[int]] | None = None,
) -> list[dict]:
    """Generate the missing samples of `tasks` (k each), score and append them to the samples
    file, and return the records of `tasks`, finished (resumed and new) and failed (in this
    run), in task order. Failed records of earlier runs are dropped from the file first (they
    are retried). Sampled, sample j of task i is seeded by `trajectory_seed(seed, i, j)`, so
    a retried or resumed sample draws what it would have drawn in one run. `prompt_of(task)`
    is a task's prompt (text, or ids: a chat template's); default `prompt_for`'s text."""
    prompt_of = prompt_of or prompt_for
    path = samples_path(out_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = list(read_jsonl(path))
    _check_source(path, records, source)
    done = _finished(records)
    failed: dict[tuple[str, int], dict] = {}
    todo = [(i, t, j) for i, t in enumerate(tasks) for j in range(k) if (item_id(t), j) not in done]
    with JsonlAppender(path) as f:
        if len(done) != len(records):  # failed or repeated records: keep each finished one once
            f.rewrite(done.values())
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            label = (
                f"eval {name}: {len(done) + start}/{len(done) + len(todo)} done"
                if progress
                else None
            )
            sampled = settings.temperature > 0
            metas = [{"seed": trajectory_seed(seed, i, j)} for i, _, j in part] if sampled else None
            trajs = await rollout.run_many(
                [prompt_of(t) for _, t, _ in part], settings, metas, progress=label
            )
            for (_, task, j), traj in zip(part, trajs):
                rec = sample_record(name, task, j, traj, source)
                (failed if is_failed_record(rec) else done)[(rec["item_id"], j)] = rec
                f.append(rec)
    keys = [(item_id(t), j) for t in tasks for j in range(k)]
    return [done.get(key) or failed[key] for key in keys if key in done or key in failed]


def benchmark_metrics(records: list[dict], k: int) -> dict[str, Any]:
    """avg@k with its bootstrap 95% interval, pass@k, maj@k (math answers only), avg@k by
    category, CIR's Table 4 code statistics split by correct and wrong samples, token
    efficiency, tool statistics and the truncation rate. Definitions: `tirl.eval.metrics`.

    Failed samples are left out of all of them and counted in `n_failed` (of `n_samples`), with
    the most frequent error in `failed_error`. An item left with n < k finished samples counts
    pass@n for pass@k. With no finished sample at all, the metrics are None."""
    failed = [r for r in records if is_failed_record(r)]
    records = [r for r in records if not is_failed_record(r)]
    counts: dict[str, Any] = {"n_samples": len(records) + len(failed), "n_failed": len(failed)}
    if failed:
        counts["failed_error"] = Counter(r.get("error", "") for r in failed).most_common(1)[0][0]
    if not records:
        return {
            "n_items": 0,
            "k": k,
            f"avg@{k}": None,
            f"avg@{k}_ci95": [None, None],
            f"pass@{k}": None,
            "by_category": {},
            **counts,
        }
    by_item: dict[str, list[dict]] = {}
    for rec in records:
        by_item.setdefault(rec["item_id"], []).append(rec)
    items = [sorted(v, key=lambda r: r["sample"]) for v in by_item.values()]
    correct = [[bool(r["correct"]) for r in recs] for recs in items]
    flat = [bool(r["correct"]) for r in records]
    metrics: dict[str, Any] = {
        "n_items": len(items),
        "k": k,
        f"avg@{k}": avg_at_k(correct),
        f"avg@{k}_ci95": list(avg_at_k_ci(correct)),
        f"pass@{k}": mean_pass_at_most_k(correct, k),
        **counts,
    }
    if not any("reward" in r for r in records):  # math answers vote; RACES answers do not
        votes = [_vote(recs) for recs in items]
        metrics[f"maj@{k}"] = sum(votes) / len(votes)
    shares = [sum(c) / len(c) for c in correct]
    metrics["by_category"] = by_category(shares, [recs[0]["category"] for recs in items])
    metrics.update(code_block_stats([r["stats"] for r in records], flat))
    metrics.update(token_efficiency(flat, [r["stats"]["model_tokens"] for r in records]))
    metrics.update(aggregate_tool_stats([r["stats"] for r in records]))
    metrics["truncation_rate"] = sum(r["finish_reason"] == "length" for r in records) / len(records)
    return metrics


def _vote(recs: list[dict]) -> bool:
    """maj@k for one item: the most frequent extracted answer (ties: the earliest), correct if
    a sample that gave it was judged correct. No answer at all counts as wrong. Identical
    strings vote together; two spellings of one value (1/2 and 0.5) vote apart."""
    winner = majority_answer([r["predicted"] for r in recs])
    return winner is not None and any(r["correct"] for r in recs if r["predicted"] == winner)


def _fmt(value: Any, spec: str) -> str:
    return "—" if value is None or value != value else format(value, spec)  # None, nan


def write_benchmark_report(results: dict[str, dict], out_dir: Path, title: str) -> list[Path]:
    """metrics.json, report.md (a table per benchmark, then per category) and accuracy.png,
    each written whole (`tirl.files`)."""
    out_dir = Path(out_dir)
    paths = [out_dir / "metrics.json", out_dir / "report.md", out_dir / "accuracy.png"]
    write_text(paths[0], json_text(results) + "\n")
    lines = [
        f"# {title}",
        "",
        "| benchmark | items | k | avg@k | 95% CI | pass@k | maj@k | code blocks | tokens | failed |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in results.items():
        k = m["k"]
        low, high = m[f"avg@{k}_ci95"]
        lines.append(
            f"| {name} | {m['n_items']} | {k} | {_fmt(m[f'avg@{k}'], '.3f')} |"
            f" [{_fmt(low, '.3f')}, {_fmt(high, '.3f')}] | {_fmt(m[f'pass@{k}'], '.3f')} |"
            f" {_fmt(m.get(f'maj@{k}'), '.3f')} | {_fmt(m.get('tools/calls_mean'), '.2f')} |"
            f" {_fmt(m.get('tokens/mean'), '.0f')} | {m.get('n_failed', 0)} |"
        )
    if any(m.get("n_failed") for m in results.values()):
        lines += [
            "",
            "Failed samples (engine, server or sandbox errors) are left out of every metric;"
            " rerunning the same command retries them.",
        ]
    for name, m in results.items():
        lines += [
            "",
            f"## {name}: avg@{m['k']} by category",
            "",
            "| category | avg@k |",
            "|---|---:|",
        ]
        lines += [f"| {c} | {v:.3f} |" for c, v in m["by_category"].items()]
    write_text(paths[1], "\n".join(lines) + "\n")
    fig = figure((1.2 + 1.1 * len(results), 3.2))
    ax = fig.subplots()
    names = list(results)
    values = [results[n][f"avg@{results[n]['k']}"] or 0.0 for n in names]
    ci = [results[n][f"avg@{results[n]['k']}_ci95"] for n in names]
    errors = [
        [v - (c[0] if c[0] is not None else v) for v, c in zip(values, ci)],
        [(c[1] if c[1] is not None else v) - v for v, c in zip(values, ci)],
    ]
    ax.bar(names, values, yerr=errors, capsize=4, color="#4477aa")
    ax.set_ylabel("avg@k (95% bootstrap CI)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    fig.tight_layout()
    save_png(fig, paths[2], dpi=120)
    return paths
