"""Async RL with a staleness bound k (`rl.off_policy_steps`): throughput and learning for
k = 0, 1, 2, 4 in one run, on the quickstart's code variant.

    python bench/async_staleness.py [--ks 0 1 2 4] [--sft-run DIR] [--out-dir DIR] [--json FILE]
                                    [-- OVERRIDES]

One SFT run first (`tirl quickstart variants=[code] rl.steps=0`; or an earlier one's folder,
`--sft-run`), whose policy every k starts RL from (`model.name_or_path` = the SFT folder,
`sft.steps=0`), so the rows differ only in k. The SFT is most of the time (about 8.5 of 15
minutes at load 2-5 on the project's 2 cores); with `--sft-run` the four RL runs take about 7.
Each k is then one `tirl quickstart` process, one after the other, with the same seed. Measured
for each, from its `metrics.jsonl` and `eval.json`:
- s/step: the mean `time/step_s` over the steady steps (from step k + 1 on: the first k steps
  sample while the queue of pending updates fills, and the last k updates finish after the
  last step, out of any step's time), and steps/s, its inverse, as a ratio to k = 0's;
- the RL phase's time, the sum of every step's `time/step_s` (without that last drain);
- mean staleness: `rl/staleness_mean` over every trained batch (updates behind the sampler);
- held-out greedy accuracy (200 items) of the start and after RL;
- the 1-minute load (`os.getloadavg`) before and after, the machine's other work included.
Extra arguments after `--` go to every RL run (e.g. `-- rl.steps=30`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The quickstart's code variant, lighter: no avg@4 (greedy held-out accuracy only) and fewer RL
# steps than its 45, so four RL runs and the SFT fit in about 12 minutes on 2 busy cores.
COMMON = ["variants=[code]", "eval.samples_per_item=0", "parallel_variants=false"]
RL_STEPS = 30


def tirl(out_dir: Path, name: str, overrides: list[str]) -> float:
    """One `tirl quickstart` run into `out_dir/name`; its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TQDM_DISABLE": "1"}
    code = "import sys; from tirl.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "quickstart", f"out_dir={out_dir}", f"name={name}"]
    start = time.perf_counter()
    with open(out_dir / f"{name}.log", "w") as log:
        done = subprocess.run([*cmd, *COMMON, *overrides], env=env, stdout=log, stderr=log)
    if done.returncode != 0:
        tail = (out_dir / f"{name}.log").read_text().strip().splitlines()[-1:]
        raise SystemExit(f"{name} failed: {tail}")
    return time.perf_counter() - start


def heldout(run_dir: Path, phase: str) -> float | None:
    results = json.loads((run_dir / "eval.json").read_text()).get("code", {})
    return results.get(phase, {}).get("heldout", {}).get("eval/accuracy")


def measure(run_dir: Path, k: int) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    rl = sorted((r for r in records if r.get("phase") == "rl"), key=lambda r: r["step"])
    steady = [r["time/step_s"] for r in rl if r["step"] > k]
    trained = [r["rl/staleness_mean"] for r in rl if r.get("train/updated")]
    return {
        "steps": len(rl),
        "s_per_step": sum(steady) / len(steady),
        "rl_s": sum(r["time/step_s"] for r in rl),
        "update_s": sum(r.get("time/update_s", 0.0) for r in rl) / max(1, len(trained)),
        "staleness_mean": sum(trained) / max(1, len(trained)),
        "staleness_max": max(r["rl/staleness_max"] for r in rl if "rl/staleness_max" in r),
        "reward_mean": sum(r.get("train/reward_mean", 0.0) for r in rl) / len(rl),
        "heldout_after_rl": heldout(run_dir, "rl"),
    }


def table(rows: dict[int, dict], start_accuracy: float | None) -> str:
    base = rows.get(0, next(iter(rows.values())))["s_per_step"]
    head = ["k", "s/step (steady)", "steps/s vs k=0", "RL steps' time", "update s", "staleness"]
    head += ["max", "train reward", "held-out greedy after RL"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, r in rows.items():
        cells = [str(k), f"{r['s_per_step']:.2f}", f"{base / r['s_per_step']:.2f}x"]
        cells += [f"{r['rl_s']:.0f} s", f"{r['update_s']:.2f}", f"{r['staleness_mean']:.2f}"]
        cells += [f"{r['staleness_max']:.0f}", f"{r['reward_mean']:.3f}"]
        cells.append(f"{r['heldout_after_rl']:.3f}" if r["heldout_after_rl"] is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    start = f"{start_accuracy:.3f}" if start_accuracy is not None else "-"
    return "\n".join(lines) + f"\n\nheld-out greedy accuracy of the SFT start: {start}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--sft-run", type=Path, help="an earlier run's SFT folder to start from")
    parser.add_argument("--out-dir", type=Path, help="where the runs go (default: a temp folder)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("overrides", nargs="*", help="config overrides for every RL run")
    args = parser.parse_args()
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tirl-bench-async-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    sft_run = args.sft_run or out_dir / "sft"
    sft_s = 0.0 if args.sft_run else tirl(out_dir, "sft", ["rl.steps=0"])
    sft_model = sft_run / "code" / "sft"
    start_accuracy = heldout(sft_run, "sft")
    rows: dict[int, dict] = {}
    for k in args.ks:
        name = f"k{k}"
        overrides = [f"model.name_or_path={sft_model}", "sft.steps=0", f"rl.steps={RL_STEPS}"]
        wall = tirl(out_dir, name, [*overrides, f"rl.off_policy_steps={k}", *args.overrides])
        rows[k] = {**measure(out_dir / name, k), "wall_s": wall}
        print(f"k={k}: {rows[k]}", flush=True)
    load_after = os.getloadavg()[0]
    total = time.perf_counter() - start
    print()
    print(table(rows, start_accuracy))
    print(
        f"\nSFT {sft_s:.0f} s; whole bench {total:.0f} s; load {load_before:.2f} before,"
        f" {load_after:.2f} after; out: {out_dir}"
    )
    if args.json:
        summary = {"rows": rows, "start_accuracy": start_accuracy, "sft_s": sft_s}
        summary |= {"total_s": total, "load_before": load_before, "load_after": load_after}
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
