"""A tiny `tirl train` run for the end-to-end tests of run folders, locks, resume and full disks
(tests/test_run_folders.py, tests/test_disk_full.py): its overrides, and helpers to run `tirl`
as a real subprocess, offline, and to read what it left in its run folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tirl.files import read_lock_info

# One variant, a model of ~30k parameters (weights ~110 kB, RL checkpoint ~350 kB), a few steps.
TINY = [
    "variants=[code]",
    "sft.steps=4",
    "sft.examples=32",
    "sft.batch_size=8",
    "rl.steps=3",
    "rl.checkpoint_every=1",
    "rl.prompts_per_step=2",
    "rl.group_size=2",
    "rl.max_model_tokens=24",
    "data.eval=[{name: heldout, items: 4}]",
    "eval.max_model_tokens=24",
    "eval.samples_per_item=0",
    "model.tokenizer_corpus_items=100",
    "model.hidden_size=32",
    "model.layers=1",
    "model.heads=2",
]
SFT_STEPS, RL_STEPS = 4, 3


def tirl(*args: str) -> list[str]:
    return [sys.executable, "-m", "tirl.cli", *args]


def offline_env() -> dict[str, str]:
    """The environment of a tirl subprocess: nothing is fetched from the hub."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def train_cmd(out_dir: Path, name: str, *extra: str) -> list[str]:
    return tirl("train", f"out_dir={out_dir}", f"name={name}", *TINY, *extra)


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """Start `cmd` with its output to the file `log` (a pipe nobody reads could block it)."""
    with log.open("w") as f:
        return subprocess.Popen(cmd, env=offline_env(), stdout=f, stderr=subprocess.STDOUT)


def run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=offline_env(), capture_output=True, text=True, timeout=timeout)


def wait_until_holder(folder: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until `proc` holds the folder's lock (its pid is in the lock file). The timeout
    only keeps a broken run from hanging the suite; it is no performance threshold."""
    deadline = time.monotonic() + timeout
    while read_lock_info(folder).get("pid") != proc.pid:
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before locking {folder}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.pid} never locked {folder}")
        time.sleep(0.05)


def step_counts(run_dir: Path) -> Counter:
    """How often each (variant, phase, step) occurs in metrics.jsonl (every line must parse)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return Counter((r["variant"], r["phase"], r["step"]) for r in map(json.loads, lines))


def every_step_once(run_dir: Path, rl_steps: int = RL_STEPS) -> bool:
    expected = {("code", "sft", s) for s in range(SFT_STEPS)}
    expected |= {("code", "rl", s) for s in range(rl_steps)}
    counts = step_counts(run_dir)
    return set(counts) == expected and set(counts.values()) == {1}


def temporaries(folder: Path) -> list[Path]:
    """What a save in progress leaves: `.NAME.tmp` / `.NAME.old` (and `trainer.tmp` of old)."""
    return [p for p in folder.rglob("*") if p.name.endswith((".tmp", ".old"))]


def error_lines(stderr: str) -> list[str]:
    """The errors tirl printed on stderr, each to the end of its line (progress bars aside: a
    variant's bar cut short by its process's death can precede an error on its line)."""
    return re.findall(r"tirl: error:[^\r\n]*", stderr)
