"""Run folders lose nothing: bad names are refused before anything is touched, a fresh run
removes only what tirl wrote, and a folder in use is refused to a second run or resume, naming
the holder (real `tirl` subprocesses, real locks)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from tiny_run import (
    error_lines,
    every_step_once,
    run,
    start,
    temporaries,
    train_cmd,
    wait_until_holder,
)

from tirl.cli import main
from tirl.config import ConfigError, load_config
from tirl.files import LOCK_NAME, FolderInUse, lock_folder, read_lock_info
from tirl.models.tiny import save_policy
from tirl.synth.config import SynthConfig
from tirl.synth.pipeline import run_pipeline
from tirl.synth.races import run_races
from tirl.train.run_folder import run_folder


def _bad_names(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    return ["", "  ", str(elsewhere), "..", "../victim", "a/b", "a\\b", ".", "x\0y"]


def _sentinels(tmp_path):
    """A file in the working directory (out_dir is "."), beside it, and in a folder an
    absolute name could point at."""
    paths = [tmp_path / "cwd" / "keep.txt", tmp_path / "victim" / "keep.txt"]
    paths.append(tmp_path / "elsewhere" / "keep.txt")
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    return paths


@pytest.mark.parametrize("index", range(9))
def test_a_bad_run_name_is_refused_in_one_line_and_nothing_is_deleted(
    index, tmp_path, monkeypatch, capsys
):
    name = _bad_names(tmp_path)[index]
    sentinels = _sentinels(tmp_path)
    monkeypatch.chdir(tmp_path / "cwd")
    assert main(["train", "out_dir=.", f"name={json.dumps(name)}"]) == 2  # YAML reads JSON
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("tirl: error:"), err
    assert all(p.read_text() == "mine" for p in sentinels)
    assert sorted(os.listdir(tmp_path / "cwd")) == ["keep.txt"]  # nothing created either


@pytest.mark.parametrize("index", range(9))
def test_the_run_folder_code_checks_names_itself(index, tmp_path, monkeypatch):
    """Without the config layer's check: `run_folder` refuses before touching anything."""
    name = _bad_names(tmp_path)[index]
    sentinels = _sentinels(tmp_path)
    monkeypatch.chdir(tmp_path / "cwd")
    for resume in (False, True):
        with pytest.raises(ConfigError, match="name"):
            with run_folder(".", name, resume=resume):
                pytest.fail("entered a run folder with a bad name")
    assert all(p.read_text() == "mine" for p in sentinels)
    assert sorted(os.listdir(tmp_path / "cwd")) == ["keep.txt"]


def test_a_fresh_run_refuses_a_non_empty_folder_tirl_did_not_make(tmp_path, capsys):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "thesis.tex").write_text("mine")
    (folder / "report.md").write_text("mine too, though tirl uses the name")
    assert main(["train", f"out_dir={tmp_path}", "name=r"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "tirl did not make it" in err, err
    assert sorted(os.listdir(folder)) == ["report.md", "thesis.tex"]  # not even a lock file
    # a folder another tirl command made (an eval's --out) is not a run folder either
    with lock_folder(tmp_path / "e", "eval"):
        pass
    (tmp_path / "e" / "report.md").write_text("an eval report")
    assert main(["train", f"out_dir={tmp_path}", "name=e"]) == 2
    assert "tirl eval" in capsys.readouterr().err
    assert (tmp_path / "e" / "report.md").read_text() == "an eval report"


def test_a_fresh_run_removes_only_the_entries_tirl_writes(tmp_path):
    folder = tmp_path / "r"
    with run_folder(tmp_path, "r", resume=False):
        tirl_made = ["config.yaml", "metrics.jsonl", "eval.json", "report.md", ".eval.json.tmp"]
        for name in tirl_made:
            (folder / name).write_text("x")
        for sub in ("plots", "samples", "code/sft", "code/rl_state", "text/rl", "code/.rl.tmp"):
            (folder / sub).mkdir(parents=True)
            (folder / sub / "f").write_text("x")
    user = ["notes.txt", "code/my_probe.py", "plot.png", "sft"]  # near tirl's names, not them
    for name in user:
        (folder / name).write_text("mine")
    with run_folder(tmp_path, "r", resume=False):
        left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert left == sorted([LOCK_NAME, "code", *user])  # text/ was emptied, so it went too


def test_a_run_never_writes_through_a_link_planted_in_its_folder(tmp_path):
    """`runs/r/code -> ../../elsewhere` would put the models elsewhere: a fresh run removes
    the link (not what it points to) and a real run writes inside its folder; a resume refuses
    the link in one line."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sft").mkdir(parents=True)
    (elsewhere / "sft" / "precious").write_text("keep")
    out = tmp_path / "runs"
    done = run(train_cmd(out, "r", "rl.steps=0"))
    assert done.returncode == 0, done.stderr[-2000:]
    code = out / "r" / "code"
    shutil.rmtree(code)
    code.symlink_to(elsewhere)
    done = run(train_cmd(out, "r", "rl.steps=0"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not code.is_symlink() and (code / "sft" / "config.json").is_file()
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["precious", "sft"]  # untouched

    shutil.rmtree(code)
    code.symlink_to(elsewhere)
    done = run(train_cmd(out, "r", "rl.steps=0", "--resume"))
    line = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in line, done.stderr[-2000:]
    assert "is a symbolic link" in line and "cannot resume" in line
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["precious", "sft"]


def test_a_lock_names_its_holder_and_is_gone_when_the_holder_is_killed(tmp_path):
    folder = tmp_path / "out"
    code = (
        "import sys, time; from tirl.files import lock_folder;"
        f" lock = lock_folder({str(folder)!r}, 'eval'); print('locked', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderInUse, match=f"in use by pid {holder.pid} on "):
            lock_folder(folder, "eval")
        info = read_lock_info(folder)
        assert info["pid"] == holder.pid and info["made_by"] == "eval" and info["started"]
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock with the process
        holder.wait()
    with lock_folder(folder, "eval") as lock:
        assert lock.info["pid"] == os.getpid() and lock.info["made_by"] == "eval"


def test_eval_and_synth_output_folders_are_locked_too(tiny_model, tokenizer, tmp_path, capsys):
    out = tmp_path / "out"
    code = (
        "import time; from tirl.files import lock_folder;"
        f" lock = lock_folder({str(out)!r}, 'eval'); print('locked', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        save_policy(tiny_model, tokenizer, tmp_path / "model")
        bench = tmp_path / "b.jsonl"
        bench.write_text(json.dumps({"problem": "Compute 2 * 3.", "answer": "6"}) + "\n")
        argv = ["eval", str(tmp_path / "model"), "--benchmark", str(bench), "--out", str(out)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"in use by pid {holder.pid} " in err
        with pytest.raises(FolderInUse, match=f"pid {holder.pid} "):
            run_races(out, n=1)
        with pytest.raises(FolderInUse, match=f"pid {holder.pid} "):
            cfg = load_config(SynthConfig, None, ["teacher.url=http://127.0.0.1:9"])
            run_pipeline(cfg, str(bench), out)  # refused before any request is sent
        assert sorted(os.listdir(out)) == [LOCK_NAME]  # nothing written by the refused ones
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_second_run_or_resume_on_a_busy_folder_is_refused_and_the_first_completes(
    tmp_path, capsys
):
    """An earlier run is killed (kill -9) mid-RL; a resume continues it while a second resume
    is refused; then a fresh run starts over while a second fresh run is refused. Each refusal
    is one line naming the holder's pid and changes nothing; each first run completes with every
    step in metrics.jsonl once; the fresh run keeps the user's files.

    The runs that hold the folder are real `tirl` subprocesses; the refused second command runs
    in this process through `main` (what `python -m tirl.cli` calls), which saves a fresh import
    of torch and transformers per refusal while the lock it meets is another process's."""
    run_dir = tmp_path / "r"
    rl = "rl.steps=10"  # long enough to be killed between its first checkpoint and its end
    fresh, resume = train_cmd(tmp_path, "r", rl), [*train_cmd(tmp_path, "r", rl), "--resume"]

    killed = start(fresh, tmp_path / "killed.log")
    checkpoint = run_dir / "code" / "rl_state" / "trainer.pt"
    while not checkpoint.exists() and killed.poll() is None:
        time.sleep(0.02)
    killed.kill()
    killed.wait()
    assert not (run_dir / "code" / "rl").exists(), "killed after RL ended"

    def refused_while_stopped(cmd: list[str], log_name: str) -> None:
        first = start(cmd, tmp_path / log_name)
        wait_until_holder(run_dir, first)
        os.kill(first.pid, signal.SIGSTOP)  # it holds the lock, and cannot finish meanwhile
        try:
            before = sorted((str(p), p.stat().st_size) for p in run_dir.rglob("*") if p.is_file())
            capsys.readouterr()
            code = main(cmd[3:])  # the same command again: `python -m tirl.cli` without `-m`
            err = capsys.readouterr().err
            after = sorted((str(p), p.stat().st_size) for p in run_dir.rglob("*") if p.is_file())
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert code == 2, err[-2000:]
        lines = error_lines(err)
        assert len(lines) == 1 and f"in use by pid {first.pid} " in lines[0], err
        assert "Traceback" not in err
        assert after == before  # the refused run touched nothing
        assert first.wait(timeout=300) == 0, (tmp_path / log_name).read_text()[-3000:]

    refused_while_stopped(resume, "resume.log")
    assert every_step_once(run_dir, rl_steps=10)
    assert not temporaries(run_dir)

    (run_dir / "notes.txt").write_text("mine")
    (run_dir / "code" / "probe.py").write_text("mine")
    refused_while_stopped(fresh, "fresh.log")
    assert every_step_once(run_dir, rl_steps=10)  # started over: not appended to the old log
    assert (run_dir / "notes.txt").read_text() == "mine"
    assert (run_dir / "code" / "probe.py").read_text() == "mine"
    assert (run_dir / "code" / "rl" / "model.safetensors").is_file()
