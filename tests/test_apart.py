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
from tiny_run import TINY, error_lines, run, start, step_counts, tirl

from tirl.config import load_config
from tirl.files import FolderInUse, check_unlocked
from tirl.run.config import RunConfig
from tirl.train.apart import ChildDied, run_apart


def square_or_fail(x: int, started: Path | None = None) -> int:
    if started is not None:
        started.touch()
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


def _spawned(parent: int) -> list[int]:
    """The job processes `run_apart` spawned under `parent` (not the resource tracker)."""
    out = subprocess.run(
        ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(parent)], capture_output=True, text=True
    ).stdout  # -ww: a long interpreter path must not cut the command line short
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line]


def _wait_for(what, timeout: float = 60.0, every: float = 0.2):
    """Poll `what()` until it is truthy; the timeout only keeps a broken run from hanging."""
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what.__name__}"
        time.sleep(every)
    return value


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


PARENT_SCRIPT = """
import sys, threading, time
sys.path.insert(0, {here!r})
from test_apart import square_or_fail
from tirl.files import lock_folder
from tirl.train.apart import run_apart

def release_when_started(lock, started):
    while not all(p.exists() for p in started):
        time.sleep(0.05)
    lock.release()  # as a killed parent's lock would be: only the children hold it now
    (started[0].parent / "released").touch()

if __name__ == "__main__":
    from pathlib import Path
    folder = Path(sys.argv[1])
    lock = lock_folder(folder, "train")
    started = [folder / "a.started", folder / "b.started"]
    threading.Thread(target=release_when_started, args=(lock, started), daemon=True).start()
    run_apart(square_or_fail, [(1000, started[0]), (2000, started[1])], ["a", "b"])
"""


@contextlib.contextmanager
def _parent(tmp_path: Path):
    """A process that locks `tmp_path/run` and runs two sleeping children with `run_apart`;
    yields (parent, folder). Nothing of it outlives the block, whatever failed."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT.format(here=str(Path(__file__).parent)))
    folder = tmp_path / "run"
    parent = subprocess.Popen([sys.executable, str(script), str(folder)])
    children: list[int] = []
    try:
        children += _wait_for(lambda: len(_spawned(parent.pid)) == 2 and _spawned(parent.pid))
        yield parent, folder, children
    finally:
        parent.kill()
        parent.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_children_die_with_a_parent_killed_outright(tmp_path):
    """kill -9 of the parent runs none of its clean-up: the children end all the same, and
    the folder is free again once they have."""
    with _parent(tmp_path) as (parent, folder, children):
        _wait_for(lambda: (folder / "released").exists())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _wait_for(lambda: not _alive(children), timeout=30)
        check_unlocked(folder)  # no writer left: a resume may take the folder


def test_the_folder_stays_locked_while_a_child_lives(tmp_path):
    """The children hold the parent's folder lock: with the parent's own descriptor closed (as
    a killed parent's is), another command is still refused, naming the run."""
    with _parent(tmp_path) as (_, folder, children):
        _wait_for(lambda: (folder / "released").exists())
        with pytest.raises(FolderInUse, match="in use by pid"):
            check_unlocked(folder)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        _wait_for(lambda: not _alive(children), timeout=30)
        check_unlocked(folder)


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


def _rl_steps_logged(variant_dir: Path) -> int:
    log = variant_dir / "metrics.jsonl"
    if not log.exists():
        return 0
    return sum('"phase": "rl"' in line for line in log.read_text().splitlines())


def test_a_killed_run_of_variants_leaves_nothing_running_and_resumes_whole(tmp_path):
    """Issue 43: kill -9 of one variant's process is one line naming it; kill -9 of the main
    `tirl train` leaves no variant training on; each `--resume` continues, and at the end every
    step of each variant is logged once."""
    rl_steps = 8
    args = [a for a in TINY if not a.startswith(("variants=", "rl.steps="))]
    cmd = tirl(
        "train", f"out_dir={tmp_path}", "name=run", *args, "variants=[code,text]", "threads=1",
        f"rl.steps={rl_steps}", "parallel_variants=true",
    )  # fmt: skip
    resume = [*cmd, "--resume"]
    code_dir = tmp_path / "run" / "code"

    def killed(command: list[str], victim: str, log: Path) -> int:
        """Run `command`; once variant code has logged another RL step, kill -9 the victim
        ("child": variant code's process, "main": the command itself); its exit code."""
        before = _rl_steps_logged(code_dir)
        main = start(command, log)
        try:
            children = _wait_for(lambda: len(_spawned(main.pid)) == 2 and _spawned(main.pid), 240)
            _wait_for(lambda: _rl_steps_logged(code_dir) > before, 240, every=0.05)
            os.kill(children[0] if victim == "child" else main.pid, signal.SIGKILL)
            main.wait(timeout=120)
            _wait_for(lambda: not _alive(children), timeout=30)  # nothing trains on
        finally:
            main.kill()
            main.wait()
        return main.returncode

    assert killed(cmd, "child", tmp_path / "first.log") == 1
    stderr = (tmp_path / "first.log").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert error_lines(stderr) == [
        "tirl: error: variant code: its process ended without a result (killed by SIGKILL (out"
        " of memory?)); what it finished is kept: rerun with --resume"
    ]
    assert killed(resume, "main", tmp_path / "second.log") == -signal.SIGKILL
    done = run(resume, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = step_counts(tmp_path / "run")
    for variant in ("code", "text"):
        steps = sorted(s for (v, phase, s) in counts if v == variant and phase == "rl")
        assert steps == list(range(rl_steps)), (variant, steps)
    assert set(counts.values()) == {1}
