"""The update with and without the rows that carry no advantage (`rl.skip_zero_advantage`),
side by side in one run, from the same seed.

    python bench/skip_rows.py [--model NAME] [--variant code] [--out-dir DIR] [-- OVERRIDES]

Two `tirl quickstart` runs that differ only in `rl.skip_zero_advantage` (off first, then on): the
quickstart preset's tiny model, or with `--model` the real-model preset (LoRA) on that model.
Both fine-tune from the same seed, so RL starts from the same weights, and both sample their
first batch alike. Measured per run, from `metrics.jsonl` and `eval.json`:
- the RL phase's update time (`time/update_s` summed) and step time (`time/step_s` summed), and
  the ratio off / on;
- how many rows each update trained on (`actor/trained_row_share`) and the share of groups
  that scored alike (`train/uniform_group_share`), per step;
- training accuracy per step and held-out greedy accuracy after RL: the gradient is the same,
  so the curves should agree (to float rounding, which can change later samples);
- the 1-minute load before and after.
Extra arguments after `--` go to both runs (e.g. `-- rl.steps=4`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(out_dir: Path, name: str, model: str | None, variant: str, extra: list[str]) -> dict:
    base = ["--model", model] if model else []
    cmd = [sys.executable, "-m", "tirl.cli", "quickstart", *base, f"out_dir={out_dir}"]
    cmd += [f"name={name}", f"variants=[{variant}]", "eval.base=false", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TQDM_DISABLE": "1"}
    with open(out_dir / f"{name}.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: see {out_dir / f'{name}.log'}")
    folder = out_dir / name
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    evals = json.loads((folder / "eval.json").read_text())[variant]
    return {
        "update_s": sum(r["time/update_s"] for r in rl),
        "step_s": sum(r["time/step_s"] for r in rl),
        "trained": [r.get("actor/trained_row_share", 1.0) for r in rl],
        "uniform": [r["train/uniform_group_share"] for r in rl],
        "accuracy": [r["train/accuracy"] for r in rl],
        "heldout": evals["rl"]["heldout"]["eval/accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a pretrained model (the real-model preset with it)")
    parser.add_argument("--variant", default="code", help="code or text (default code)")
    parser.add_argument("--out-dir", type=Path, help="where the runs go (default: a temp folder)")
    parser.add_argument("overrides", nargs="*", help="config overrides for both runs")
    args = parser.parse_args()
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tirl-bench-skip-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    runs = {}
    for setting in ("false", "true"):
        print(f"rl.skip_zero_advantage={setting} ...", flush=True)
        extra = [*args.overrides, f"rl.skip_zero_advantage={setting}"]
        runs[setting] = run(out_dir, f"skip_{setting}", args.model, args.variant, extra)
    off, on = runs["false"], runs["true"]
    fmt = " ".join
    print(
        "\n| skip rows | update s | RL step s | rows trained per step | groups alike per step"
        " | training accuracy per step | held-out greedy |"
    )
    print("|---|---:|---:|---|---|---|---:|")
    for setting, r in runs.items():
        print(
            f"| {setting} | {r['update_s']:.1f} | {r['step_s']:.1f} "
            f"| {fmt(f'{x:.2f}' for x in r['trained'])} | {fmt(f'{x:.2f}' for x in r['uniform'])} "
            f"| {fmt(f'{x:.2f}' for x in r['accuracy'])} | {r['heldout']:.3f} |"
        )  # fmt: skip
    print(
        f"\nupdate off/on: {off['update_s'] / on['update_s']:.2f}x; RL phase off/on: "
        f"{off['step_s'] / on['step_s']:.2f}x; load {load:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; runs in {out_dir}"
    )


if __name__ == "__main__":
    main()
