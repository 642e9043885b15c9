"""No process outlives a killed `tirl` command (issue 43): each command is started for real,
killed (kill -9, which runs none of its clean-up, or SIGTERM) once its helpers are up, and
every process that was below it must be gone. The helpers: the sandbox's zygote and its
sessions, the answer checker's workers, a local Ray cluster. Variants trained side by side
are covered in tests/test_apart.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from process_tree import command_line, descendants, left_after
from tiny_run import TINY, offline_env, start, tirl

ZYGOTE = "tirl.sandbox._zygote"


def _has(pattern: str) -> Callable[[int], bool]:
    def found(pid: int) -> bool:
        return any(pattern in command_line(p) for p in descendants(pid))

    found.__name__ = f"a process running {pattern}"
    return found


def _rl_logged(folder: Path) -> Callable[[int], bool]:
    def logged(pid: int) -> bool:
        log = folder / "metrics.jsonl"
        return log.exists() and '"phase": "rl"' in log.read_text()

    logged.__name__ = "an RL step logged"
    return logged


def _kill_when(cmd: list[str], ready: Callable[[int], bool], sig: int, log: Path) -> None:
    """Start `cmd`, wait until `ready(pid)` and until it has processes below it, send `sig`;
    then nothing that was below it may be left."""
    proc = start(cmd, log)
    try:
        deadline = time.monotonic() + 300  # keeps a broken start from hanging: no threshold
        while not (ready(proc.pid) and descendants(proc.pid)):
            assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"never saw {ready.__name__}"
            time.sleep(0.1)
        below = descendants(proc.pid)
        proc.send_signal(sig)
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert left_after(below) == {}


def _train(tmp_path: Path, *extra: str) -> list[str]:
    args = [a for a in TINY if not a.startswith("rl.steps=")]
    return tirl("train", f"out_dir={tmp_path}", "name=run", *args, "rl.steps=500", *extra)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_tirl_train(tmp_path, sig):
    ready = _rl_logged(tmp_path / "run")
    _kill_when(_train(tmp_path), ready, sig, tmp_path / "log")


def test_tirl_train_on_a_local_ray_cluster(tmp_path):
    pytest.importorskip("ray")
    cmd = _train(tmp_path, "sandbox.kind=ray")
    _kill_when(cmd, _rl_logged(tmp_path / "run"), signal.SIGKILL, tmp_path / "log")


def test_tirl_eval(tmp_path):
    sft_only = [a for a in TINY if not a.startswith("rl.")] + ["rl.steps=0"]
    made = subprocess.run(
        tirl("train", f"out_dir={tmp_path}", "name=run", *sft_only),
        env=offline_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    cmd = tirl(
        "eval", str(tmp_path / "run" / "code" / "sft"), "eval.samples_per_item=0",
        "data.eval=[{name: heldout, items: 5000}]", "eval.max_model_tokens=24",
        "model.tokenizer_corpus_items=100",
    )  # fmt: skip
    _kill_when(cmd, _has(ZYGOTE), signal.SIGKILL, tmp_path / "log")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_tirl_sandbox_serve(tmp_path, sig):
    cmd = tirl("sandbox", "serve", "--port", "0", "--pool-size", "2")
    _kill_when(cmd, _has(ZYGOTE), sig, tmp_path / "log")


def test_the_tree_walk_sees_grandchildren(tmp_path):
    """The check itself: a grandchild below a killed child is found, and reported left."""
    script = "import subprocess, sys, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not any("sleep 60" in command_line(p) for p in descendants(proc.pid)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        below = descendants(proc.pid)
        proc.kill()
        proc.wait()
        left = left_after(below, timeout=1)
        assert list(left.values()) == ["sleep 60"]
    finally:
        for pid in below:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
