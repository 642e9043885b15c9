"""Evaluate a policy on benchmarks (MATH-500, AIME, AMC, OlymMATH, HMMT, RACES test splits) with
the tool loop, resumably.

Each finished sample is appended to `<out>/<benchmark>.samples.jsonl` at once, one JSON line
holding the item id, the sample index, the verdict and the whole trajectory. A rerun with the
same output folder reads that file first and generates only the (item, sample) pairs that are
missing, so an interruption loses at most the samples in flight. Metrics are computed from the
file, i.e. from every sample, old and new alike.

Scoring: math benchmarks compare the last `\\boxed{}` of the model's own text with the gold
answer through `tirl.rewards.verify` (math-verify with timeouts and guards); RACES items are
scored by their operator's reward (`tirl.envs.operators.score`), and count as correct only at
reward 1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.eval.metrics import (
    avg_at_k,
    avg_at_k_ci,
    by_category,
    code_block_stats,
    majority_answer,
    mean_pass_at_k,
    token_efficiency,
)
from tirl.protocol.segments import Trajectory
from tirl.rewards.answer import answer_from_trajectory
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings

MATH_PROMPT = (
    "{problem}\n\nSolve the problem step by step. You may write Python in ```python blocks; each"
    " block runs as soon as it is closed and its output is shown to you. Put the final answer in"
    " \\boxed{{}}.\n"
)


@dataclass(frozen=True)
class EvalItem:
    """What the runner needs of a benchmark item (`tirl.eval.benchmarks.BenchmarkItem` fits)."""

    id: str
    problem: str
    answer: str
    category: str = ""
    meta: dict | None = None


def read_done(path: Path) -> dict[tuple[str, int], dict]:
    """Finished samples by (item id, sample index); a torn last line (a crash mid-write) is
    ignored and regenerated."""
    done: dict[tuple[str, int], dict] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        done[(str(rec["item_id"]), int(rec["sample"]))] = rec
    return done


def prompt_for(item: Any, template: str = MATH_PROMPT) -> str:
    if item.meta and "task" in item.meta:  # a RACES task carries its own prompt
        return item.meta["task"]["prompt"]
    return template.format(problem=item.problem)


def judge(item: Any, traj: Trajectory, verify) -> dict[str, Any]:
    """The verdict for one trajectory: predicted answer, correct, reason (and the reward)."""
    if item.meta and "task" in item.meta:
        from tirl.envs.core import REGISTRY
        from tirl.envs.operators import Task, score

        reward = score(Task.from_dict(item.meta["task"]), traj.model_text, REGISTRY)
        return {
            "predicted": None,
            "correct": reward.value == 1.0,
            "reward": reward.value,
            "reason": reward.reason,
        }
    predicted = answer_from_trajectory(traj)
    verdict = verify(item.answer, predicted)
    return {"predicted": predicted, "correct": verdict.correct, "reason": verdict.reason}


async def run_benchmark(
    rollout: Rollout,
    name: str,
    items: Sequence[Any],
    settings: RolloutSettings,
    k: int,
    out_dir: Path,
    verify,
    chunk: int = 64,
    progress: bool = True,
) -> list[dict]:
    """Generate the missing samples of `items` (k each), append them to the samples file, and
    return every record of this benchmark (resumed and new)."""
    path = Path(out_dir) / f"{name}.samples.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = read_done(path)
    todo = [(it, j) for it in items for j in range(k) if (str(it.id), j) not in done]
    with path.open("a") as f:
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            label = (
                f"eval {name}: {len(done) + start}/{len(done) + len(todo)} done"
                if progress
                else None
            )
            trajs = await rollout.run_many(
                [prompt_for(it) for it, _ in part], settings, progress=label
            )
            for (it, j), traj in zip(part, trajs):
                rec = {
                    "benchmark": name,
                    "item_id": str(it.id),
                    "sample": j,
                    "category": it.category,
                    "gold": it.answer,
                    **judge(it, traj, verify),
                    "stats": tool_stats(traj),
                    "finish_reason": traj.finish_reason,
                    "trajectory": traj.to_dict(),
                }
                f.write(json.dumps(rec) + "\n")
                f.flush()
                done[(rec["item_id"], j)] = rec
    wanted = {(str(it.id), j) for it in items for j in range(k)}
    return [rec for key, rec in done.items() if key in wanted]


def benchmark_metrics(records: list[dict], k: int) -> dict[str, Any]:
    """avg@k with its bootstrap 95% interval, pass@k, maj@k (math answers only), avg@k by
    category, CIR's Table 4 code statistics split by correct and wrong samples, token
    efficiency, tool statistics and the truncation rate. Definitions: `tirl.eval.metrics`."""
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
        f"pass@{k}": mean_pass_at_k(correct, k),
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


def write_benchmark_report(results: dict[str, dict], out_dir: Path, title: str) -> list[Path]:
    """metrics.json, report.md (a table per benchmark, then per category) and accuracy.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    paths = [out_dir / "metrics.json", out_dir / "report.md", out_dir / "accuracy.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"# {title}",
        "",
        "| benchmark | items | k | avg@k | 95% CI | pass@k | maj@k | code blocks | tokens |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, m in results.items():
        k = m["k"]
        low, high = m[f"avg@{k}_ci95"]
        maj = m.get(f"maj@{k}")
        lines.append(
            f"| {name} | {m['n_items']} | {k} | {m[f'avg@{k}']:.3f} | [{low:.3f}, {high:.3f}] |"
            f" {m[f'pass@{k}']:.3f} | {'—' if maj is None else f'{maj:.3f}'} |"
            f" {m['tools/calls_mean']:.2f} | {m['tokens/mean']:.0f} |"
        )
    for name, m in results.items():
        lines += [
            "",
            f"## {name}: avg@{m['k']} by category",
            "",
            "| category | avg@k |",
            "|---|---:|",
        ]
        lines += [f"| {c} | {v:.3f} |" for c, v in m["by_category"].items()]
    paths[1].write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(results), 3.2))
    names = list(results)
    values = [results[n][f"avg@{results[n]['k']}"] for n in names]
    errors = [
        [v - results[n][f"avg@{results[n]['k']}_ci95"][0] for n, v in zip(names, values)],
        [results[n][f"avg@{results[n]['k']}_ci95"][1] - v for n, v in zip(names, values)],
    ]
    ax.bar(names, values, yerr=errors, capsize=4, color="#4477aa")
    ax.set_ylabel("avg@k (95% bootstrap CI)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=120)
    plt.close(fig)
    return paths
