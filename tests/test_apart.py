"""Variants trained side by side, each in a process of its own (`parallel_variants`,
`tirl.train.apart`): the same results as one after the other, one merged log, and a failing
or dying child stops the run with its reason."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import TINY, run, tirl

from tirl.config import load_config
from tirl.train.apart import ChildDied, run_apart
from tirl.train.config import RunConfig


def square_or_fail(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative input {x}")
    if x == 0:
        os._exit(3)  # a child that dies without a word
    if x > 100:
        time.sleep(60)  # still running when another fails: must be stopped, not waited for
    return x * x


def test_results_come_back_in_order():
    assert run_apart(square_or_fail, [(3,), (4,)], ["a", "b"]) == [9, 16]


def test_a_failing_child_stops_the_others_and_its_error_is_raised():
    start = time.monotonic()
    with pytest.raises(ValueError, match="negative input -1"):
        run_apart(square_or_fail, [(1000,), (-1,)], ["slow", "bad"])
    assert time.monotonic() - start < 30  # the sleeping child was terminated


def test_a_child_that_dies_is_named():
    with pytest.raises(ChildDied, match="variant text: .*exit code 3"):
        run_apart(square_or_fail, [(2,), (0,)], ["variant code", "variant text"])


def test_children_die_with_a_parent_killed_outright(tmp_path):
    """kill -9 of the parent runs none of its clean-up: the children end all the same."""
    here = Path(__file__).parent
    code = (
        f"import sys; sys.path.insert(0, {str(here)!r})\n"
        "from test_apart import square_or_fail\n"
        "from tirl.train.apart import run_apart\n"
        "if __name__ == '__main__':\n"
        "    run_apart(square_or_fail, [(1000,), (2000,)], ['a', 'b'])\n"
    )
    script = tmp_path / "parent.py"
    script.write_text(code)
    parent = subprocess.Popen([sys.executable, str(script)])
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(children) < 2 and time.monotonic() < deadline:  # both spawned
            time.sleep(0.2)
            out = subprocess.run(
                ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(parent.pid)],
                capture_output=True, text=True,
            ).stdout  # fmt: skip
            # the job processes, not multiprocessing's resource tracker; -ww: a long
            # interpreter path must not cut the command line short
            children = [int(ln.split()[0]) for ln in out.splitlines() if "spawn_main" in ln]
        assert len(children) == 2, out
        time.sleep(2)  # past the start of each child's `_child`
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        alive = children
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [pid for pid in children if os.path.exists(f"/proc/{pid}")]
        assert alive == []
    finally:  # nothing of this test outlives it, whatever failed
        parent.kill()
        parent.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_parallel_variants_apply_on_the_cpu_only_and_without_wandb():
    from tirl.train.pipeline import runs_apart

    def apart(*overrides: str) -> bool:
        return runs_apart(
            load_config(RunConfig, overrides=["parallel_variants=true", *overrides]), None
        )

    assert apart()
    assert not apart("variants=[code]")  # one variant: nothing to run beside it
    assert not apart("log_wandb=true")  # one W&B run per process would split the run
    cfg = load_config(RunConfig, overrides=["parallel_variants=true"])
    assert not runs_apart(dataclasses.replace(cfg, device="cuda"), None)  # one accelerator


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]


def test_side_by_side_variants_train_as_one_after_the_other(tmp_path):
    both = [a for a in TINY if not a.startswith("variants=")] + [
        "variants=[code,text]",
        "threads=1",
    ]
    for name, extra in (("apart", ["parallel_variants=true"]), ("serial", [])):
        done = run(tirl("train", f"out_dir={tmp_path}", f"name={name}", *both, *extra), 600)
        assert done.returncode == 0, done.stderr[-2000:]
    apart, serial = _records(tmp_path / "apart"), _records(tmp_path / "serial")
    # one log, the variants one after the other, as the serial run writes it
    assert [(r["variant"], r["phase"], r["step"]) for r in apart] == [
        (r["variant"], r["phase"], r["step"]) for r in serial
    ]
    sft = [r["train/loss"] for r in apart if r["phase"] == "sft"]
    assert sft == [r["train/loss"] for r in serial if r["phase"] == "sft"]  # same arithmetic
    results = json.loads((tmp_path / "apart" / "eval.json").read_text())
    assert set(results) >= {"code", "text"}
    assert (tmp_path / "apart" / "report.html").exists()
    assert (tmp_path / "apart" / "code" / "metrics.jsonl").exists()
