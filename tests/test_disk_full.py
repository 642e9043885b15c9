"""A full disk loses nothing: `tirl train` and `tirl eval` on a real tmpfs too small for what they
write fail in one line ("No space left on device", naming the file), leave no temporary and no
half-written file behind, and once there is room a `--resume` (or a rerun) completes with every
step and every sample exactly once.

The tmpfs lives in a private mount namespace (tests/tmpfs_steps.py); the tests skip where none
can be made. Sizes: the tiny run writes ~12 kB before its SFT save (~140 kB, the weights ~110 kB),
~170 kB in all before its first RL checkpoint (~350 kB: model and Adam state), so 64 kB fails the
SFT save and 320 kB the first checkpoint, each for certain.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import (
    error_lines,
    every_step_once,
    offline_env,
    step_counts,
    temporaries,
    tirl,
    train_cmd,
)

from tirl.eval.benchmarks import load_benchmark
from tirl.files import read_jsonl
from tirl.models.tiny import is_saved_policy, save_policy

DRIVER = Path(__file__).with_name("tmpfs_steps.py")


def _namespace_prefix() -> list[str]:
    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` here to make a private mount namespace for a small tmpfs")
    if os.geteuid() == 0:
        prefix = ["unshare", "-m"]
    else:  # unprivileged user namespace, keeping the caps that mount needs (util-linux >= 2.39)
        prefix = ["unshare", "-c", "-m", "--keep-caps"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private mount namespace: {probe.stderr.strip()}")
    return prefix


def run_on_tmpfs(tmp_path: Path, steps: list[dict]) -> tuple[list[dict], Path]:
    """Run each step's command on the tmpfs `tmp_path/mnt` at the step's size; returns what each
    step printed and the folder holding a copy of the tmpfs after each step (`step<i>/`)."""
    prefix = _namespace_prefix()
    (tmp_path / "mnt").mkdir()
    results = tmp_path / "results"
    results.mkdir()
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"mount": str(tmp_path / "mnt"), "results": str(results), "steps": steps})
    )
    proc = subprocess.run(
        [*prefix, sys.executable, str(DRIVER), str(plan)],
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode == 3:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((results / f"step{i}.json").read_text()) for i in range(len(steps))], results


def _one_line_enospc(step: dict, where: str) -> None:
    assert step["rc"] == 1, step["stderr"][-3000:]
    lines = error_lines(step["stderr"])
    assert len(lines) == 1, step["stderr"][-3000:]
    assert "No space left on device" in lines[0] and where in lines[0], lines[0]
    assert "Traceback" not in step["stderr"]


@pytest.mark.slow
def test_a_full_disk_at_the_sft_save_and_at_an_rl_checkpoint_is_resumed_losing_nothing(tmp_path):
    mnt = tmp_path / "mnt"
    fresh = train_cmd(mnt, "r")
    steps = [
        {"size": "64k", "cmd": fresh},  # the SFT save does not fit
        {"size": "320k", "cmd": [*fresh, "--resume"]},  # SFT fits, the first checkpoint not
        {"size": "64m", "cmd": [*fresh, "--resume"]},
    ]
    out, results = run_on_tmpfs(tmp_path, steps)

    _one_line_enospc(out[0], str(mnt / "r" / "code" / "sft"))
    run = results / "step0" / "r"
    assert not (run / "code" / "sft").exists()  # no folder that looks saved
    assert not temporaries(run), temporaries(run)
    assert set(step_counts(run).values()) == {1}

    _one_line_enospc(out[1], str(mnt / "r" / "code" / "rl_state" / "trainer.pt"))
    run = results / "step1" / "r"
    assert is_saved_policy(run / "code" / "sft")  # the redone SFT, saved whole
    assert not (run / "code" / "rl_state" / "trainer.pt").exists()
    assert not temporaries(run), temporaries(run)  # no trainer.tmp, no .trainer.pt.tmp

    assert out[2]["rc"] == 0, out[2]["stderr"][-3000:]
    run = results / "step2" / "r"
    assert every_step_once(run)
    assert set(json.loads((run / "eval.json").read_text())["code"]) == {"sft", "rl"}
    assert is_saved_policy(run / "code" / "rl") and not temporaries(run)


@pytest.mark.slow
def test_a_full_disk_during_tirl_eval_keeps_whole_samples_and_the_rerun_completes(
    tiny_model, tokenizer, tmp_path
):
    save_policy(tiny_model, tokenizer, tmp_path / "model")
    bench = tmp_path / "mini.jsonl"
    rows = [{"problem": f"Compute {a} * 3.", "answer": str(3 * a)} for a in (11, 12, 13)]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_dir = tmp_path / "mnt" / "ev"
    cmd = tirl("eval", str(tmp_path / "model"), "--benchmark", str(bench), "-k", "2")
    cmd += ["--max-tokens", "16", "--out", str(out_dir)]
    # 8 kB: the lock file's page and one page of samples (each sample is over 1 kB)
    out, results = run_on_tmpfs(tmp_path, [{"size": "8k", "cmd": cmd}, {"size": "4m", "cmd": cmd}])

    _one_line_enospc(out[0], str(out_dir))
    first = results / "step0" / "ev"
    assert not temporaries(first)
    samples = first / "mini.samples.jsonl"
    kept = samples.read_text() if samples.exists() else ""
    assert kept == "" or kept.endswith("\n")  # the cut-off sample was taken back whole
    assert len(kept.splitlines()) == len(list(read_jsonl(samples))) < 6

    assert out[1]["rc"] == 0, out[1]["stderr"][-3000:]
    final = (results / "step1" / "ev" / "mini.samples.jsonl").read_text()
    assert final.startswith(kept)  # what was finished before the disk filled is kept as it was
    records = [json.loads(line) for line in final.splitlines()]
    ids = [str(item.id) for item in load_benchmark(str(bench))]
    assert sorted((r["item_id"], r["sample"]) for r in records) == [
        (i, j) for i in sorted(ids) for j in range(2)
    ]
    metrics = json.loads((results / "step1" / "ev" / "metrics.json").read_text())["mini"]
    assert metrics["n_samples"] == 6 and metrics["n_failed"] == 0
    assert not temporaries(results / "step1" / "ev")
