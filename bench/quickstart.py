"""`tirl quickstart`, timed and its memory measured, against a baseline tree in the same run.

    python bench/quickstart.py [--baseline-src DIR] [--with OVERRIDE ...] [--out-dir DIR]
                               [--json FILE] [-- OVERRIDES]

Each tree (this checkout's `src`, and `--baseline-src`, e.g. the tree before a change:
`git archive <commit> src | tar -x -C /tmp/base`) runs `tirl quickstart` from scratch, one after
the other, under `/usr/bin/time -v` when it exists. `--with OVERRIDE` (repeatable) adds a run
of this tree with those overrides, after its plain run: a setting against the default in the
same run (e.g. `--with model.dtype=bfloat16`). Measured for each:
- wall time of the command (imports, demonstrations, SFT, RL, evaluations, report);
- memory: `/usr/bin/time`'s maximum resident set size (the largest single process of the
  tree: the kernel reports the largest child's peak, not a sum) and, sampled every 0.5 s, the
  peak of the summed proportional set size (PSS: shared pages split between the processes
  that share them) of the command and all its descendants (sandbox processes included);
- what it learned: held-out greedy accuracy and avg@4 of each variant after SFT and after RL
  (`eval.json`), so that a faster run is seen not to learn less;
- where the time went: each variant's SFT and RL steps summed (`time/step_s` in
  `metrics.jsonl`) and its evaluations (`time/eval_s` in `eval.json`). The variants run side by
  side (`parallel_variants`), so the wall time is not the sum of these.

Extra arguments after `--` are passed to both runs (e.g. `-- variants=[code]`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from sandbox import descendants, smaps_rollup_kb  # noqa: E402  (bench/sandbox.py's /proc readers)

TIME = shutil.which("time") or "/usr/bin/time"


class PssPeak(threading.Thread):
    """Samples the summed PSS of a process tree until stopped; `peak_kb` is the largest sum."""

    def __init__(self, root: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s, self.peak_kb = root, every_s, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            tree = [self.root, *descendants(self.root)]
            self.peak_kb = max(self.peak_kb, sum(smaps_rollup_kb(p).get("Pss", 0) for p in tree))


def max_rss_kb(time_report: str) -> int | None:
    for line in time_report.splitlines():
        if "Maximum resident set size" in line:
            return int(line.rsplit(":", 1)[1])
    return None


def run_quickstart(src: Path, out_dir: Path, overrides: list[str]) -> dict:
    """One `tirl quickstart` with `src` first on the path; its measurements."""
    env = {**os.environ, "PYTHONPATH": str(src), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    code = "import sys; from tirl.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "quickstart", f"out_dir={out_dir}", *overrides]
    report = out_dir / "time.txt"
    out_dir.mkdir(parents=True, exist_ok=True)
    if Path(TIME).exists():
        cmd = [TIME, "-v", "-o", str(report), *cmd]
    start = time.perf_counter()
    with open(out_dir / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out_dir)
        sampler = PssPeak(proc.pid)
        sampler.start()
        proc.wait()
        sampler.done.set()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (out_dir / "log.txt").read_text().strip().splitlines()[-1:]
        raise SystemExit(f"quickstart from {src} failed: {tail}")
    results = json.loads((out_dir / "quickstart" / "eval.json").read_text())
    rss = max_rss_kb(report.read_text()) if report.exists() else None
    phases = phase_seconds(out_dir / "quickstart")
    return {
        "wall_s": wall, "max_rss_kb": rss, "peak_pss_kb": sampler.peak_kb, "eval": results,
        "phase_s": phases,
    }  # fmt: skip


def phase_seconds(run_dir: Path) -> dict[str, dict[str, float]]:
    """Seconds per variant in SFT steps, RL steps and evaluations."""
    out: dict[str, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") in ("sft", "rl") and "time/step_s" in row:
            spent = out.setdefault(row["variant"], {"sft": 0.0, "rl": 0.0, "eval": 0.0})
            spent[row["phase"]] += row["time/step_s"]
    evals = json.loads((run_dir / "eval.json").read_text())
    for variant, phases in evals.items():
        if isinstance(phases, dict):
            spent = out.setdefault(variant, {"sft": 0.0, "rl": 0.0, "eval": 0.0})
            spent["eval"] += sum(
                m.get("time/eval_s", 0.0) for sets in phases.values() for m in sets.values()
            )
    return out


def accuracy(run: dict, variant: str, phase: str) -> str:
    metrics = run["eval"].get(variant, {}).get(phase, {}).get("heldout", {})
    if not metrics:
        return "-"
    greedy, avg = metrics.get("eval/accuracy"), metrics.get("eval/avg@k")
    return f"{greedy:.3f} / {avg:.3f}" if avg is not None else f"{greedy:.3f}"


def table(runs: dict[str, dict]) -> str:
    head = ["tree", "wall", "max RSS (largest process)", "peak PSS (all processes)"]
    cells = [(v, p) for v in ("code", "text") for p in ("sft", "rl")]
    head += [f"{v} after {p.upper()} (greedy / avg@4)" for v, p in cells]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in runs.items():
        rss = f"{r['max_rss_kb'] / 1024**2:.2f} GB" if r["max_rss_kb"] else "-"
        row = [name, f"{r['wall_s']:.0f} s", rss, f"{r['peak_pss_kb'] / 1024**2:.2f} GB"]
        row += [accuracy(r, v, p) for v, p in cells]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "| tree | variant | SFT steps | RL steps | evaluations |",
        "|---|---|---:|---:|---:|",
    ]
    for name, r in runs.items():
        for variant, spent in r["phase_s"].items():
            cells = [f"{spent[k]:.0f} s" for k in ("sft", "rl", "eval")]
            lines.append(f"| {name} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="a tree's src folder to compare with")
    parser.add_argument("--out-dir", type=Path, help="where the runs go (default: a temp folder)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument(
        "--with", dest="extra", action="append", default=[], metavar="OVERRIDE",
        help="also run this tree with this override added (repeatable)",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args()
    if args.baseline_src and not (args.baseline_src / "tirl" / "__init__.py").is_file():
        parser.error(f"--baseline-src {args.baseline_src}: no tirl package there")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="tirl-bench-quickstart-"))
    plan = {"this tree": (ROOT / "src", args.overrides)}
    if args.baseline_src:
        plan = {"baseline": (args.baseline_src, args.overrides), **plan}
    if args.extra:
        plan[f"this tree, {' '.join(args.extra)}"] = (ROOT / "src", [*args.overrides, *args.extra])
    load = os.getloadavg()[0]
    runs = {}
    for i, (name, (src, overrides)) in enumerate(plan.items()):
        print(f"running tirl quickstart from {src} {' '.join(overrides)} ...", flush=True)
        runs[name] = run_quickstart(src, out_dir / f"run{i}", overrides)
        print(f"  {runs[name]['wall_s']:.0f} s", flush=True)
    print()
    print(table(runs))
    print(f"\nload {load:.2f} before, {os.getloadavg()[0]:.2f} after; runs in {out_dir}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
