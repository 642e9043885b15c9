"""Torch threads under CPU contention (issue 28): the quickstart's SFT step alone and beside
neighbours, with torch's default threads and with tirl's choice.

    python bench/threads.py [--steps 30] [--reps 3] [--settings default,tirl]
                            [--neighbours none,spin,late-spin,torch] [--out FILE]

Each cell runs `--steps` SFT steps of the quickstart's model and batch (128 wide, 4 layers,
batch 64 in 4 micro-batches) in a fresh process, `--reps` times, and reports the median seconds
per step and its ratio to the same setting alone. Neighbours, started before and killed after:
- `spin`: one single-threaded Python loop (a busy core);
- `late-spin`: the same, started by the measured process after its warm-up (a neighbour that
  arrives mid-run);
- `torch`: another torch process multiplying matrices with torch's default threads (as a second
  training run on the same machine).
Settings of the measured process:
- `default`: what torch does by itself (intra-op threads = cores, OpenMP's active wait);
- `passive`: torch's default threads with OMP_WAIT_POLICY=PASSIVE only;
- `tirl`: what `tirl` does with `threads: 0` (`tirl.cpu`: the SFT loop re-chooses torch's threads
  from the cores other processes leave free, at most once a second);
- `one`: one torch thread, whatever the load. Alone, it is what a job costs on the one core a
  busy neighbour leaves it: the least a neighbour that takes a core can cost a job that uses
  them all (printed under the table as the floor).
The threads column is the count at the end of the measured steps.
A neighbour's fair cost is its share of the CPU: on 2 cores with one busy neighbour a job
that used both cores can at best run at half speed (ratio 2) if its threads scale perfectly,
at the ratio of its one-thread time to its two-thread time if they do not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = r"""
import os, subprocess, sys, time
if sys.argv[1] == "tirl":
    from tirl.cpu import configure_threads
    configure_threads(0)
if sys.argv[1] == "passive":
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
import torch
if sys.argv[1] == "one":
    torch.set_num_threads(1)
from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.synth.arithmetic import code_demonstrations, demonstration_texts
from tirl.run.config import SFTConfig
from tirl.train.sft import train_sft
env = ArithmeticEnv()
tasks = env.items("train", 256)
texts = ["".join(t for _, t in demonstration_texts(x, x.answer)) for x in tasks]
tok = train_tokenizer(texts, vocab_size=384)
demos = code_demonstrations(tasks, [t.answer for t in tasks], tok)
model = build_model(tok, TinyModelSpec(hidden_size=128, layers=4, heads=4, max_positions=192), 0)
steps = int(sys.argv[2])
cfg = SFTConfig(steps=2, batch_size=64, micro_batches=4, lr=1e-3, warmup_steps=1)
train_sft(model, demos, cfg, pad_id=tok.pad_token_id, seed=0)  # warm up
cfg = SFTConfig(steps=steps, batch_size=64, micro_batches=4, lr=1e-3, warmup_steps=1)
late = sys.argv[3] == "late-spin"  # a neighbour that arrives once the run is going
spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if late else None
start = time.perf_counter()
train_sft(model, demos, cfg, pad_id=tok.pad_token_id, seed=0)
print((time.perf_counter() - start) / steps, torch.get_num_threads())
if spin is not None:
    spin.kill()
"""

NEIGHBOURS = {
    "none": [],
    "spin": [[sys.executable, "-c", "while True: pass"]],
    "late-spin": [],  # started by the measured process itself, after its warm-up
    "torch": [[sys.executable, "-c",
               "import torch\nx = torch.randn(512, 512)\nwhile True: x = (x @ x).tanh()"]],
}  # fmt: skip


SETTINGS = "default, passive, tirl, one"


def step_time(setting: str, steps: int, neighbour: str) -> tuple[float, int]:
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", WORKER, setting, str(steps), neighbour],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds, threads = out.stdout.split()[-2:]
    return float(seconds), int(threads)


def cell(neighbour: str, setting: str, steps: int, reps: int) -> dict:
    times, threads = [], 0
    for _ in range(reps):
        procs = [subprocess.Popen(cmd) for cmd in NEIGHBOURS[neighbour]]
        try:
            time.sleep(2.0 if procs else 0.0)  # let the neighbour get going
            seconds, threads = step_time(setting, steps, neighbour)
            times.append(seconds)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return {"neighbour": neighbour, "setting": setting, "s_per_step": statistics.median(times),
            "reps": times, "threads": threads}  # fmt: skip


def print_table(load: float, cells: list[dict], steps: int, reps: int) -> None:
    alone = {c["setting"]: c["s_per_step"] for c in cells if c["neighbour"] == "none"}
    default_alone = alone.get("default")
    print(f"load (1 min) before: {load:.2f}; {steps} steps x {reps} reps, medians\n")
    print("| neighbour | setting | threads | s / step | vs same setting alone | vs default alone |")
    print("|---|---|---:|---:|---:|---:|")
    for c in cells:
        own = c["s_per_step"] / alone[c["setting"]]
        base = f"{c['s_per_step'] / default_alone:.2f}x" if default_alone else "-"
        print(f"| {c['neighbour']} | {c['setting']} | {c['threads']} | {c['s_per_step']:.3f} |"
              f" {own:.2f}x | {base} |")  # fmt: skip
    if default_alone and "one" in alone:
        print(f"\nthe floor: one thread alone takes {alone['one'] / default_alone:.2f}x the default"
              " alone, what a job costs on the one core a busy neighbour leaves it")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--settings", default="default,tirl", help="comma-separated: " + SETTINGS)
    parser.add_argument(
        "--neighbours", default=",".join(NEIGHBOURS), help="comma-separated, 'none' first"
    )
    parser.add_argument("--out")
    args = parser.parse_args()
    settings = args.settings.split(",")
    neighbours = args.neighbours.split(",")
    unknown = [x for x in settings if x not in SETTINGS.split(", ")]
    unknown += [x for x in neighbours if x not in NEIGHBOURS]
    if unknown or neighbours[0] != "none":
        parser.error(f"settings: {SETTINGS}; neighbours: {', '.join(NEIGHBOURS)}, 'none' first")
    load = os.getloadavg()[0]
    cells = [cell(n, s, args.steps, args.reps) for n in neighbours for s in settings]
    print_table(load, cells, args.steps, args.reps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"load": load, "cells": cells}, f, indent=2)


if __name__ == "__main__":
    main()
