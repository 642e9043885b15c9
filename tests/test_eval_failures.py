"""An evaluation that cannot run is reported as failed, never scored as wrong answers: a prompt
longer than the model's context, and a server that stops answering (within the request
timeout the user sets). Both make `tirl eval` exit 1 with the failures counted and a reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from conftest import tirl_serve_process

from tirl.models.tiny import TinyModelSpec, build_model, save_policy

EVAL = ["data.eval=[{name: heldout, items: 6}]", "eval.samples_per_item=0"]


def tirl_eval(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tirl.cli", "eval", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_prompts_longer_than_the_context_are_failures_not_wrong_answers(tokenizer, tmp_path):
    spec = TinyModelSpec(hidden_size=32, layers=1, heads=2, max_positions=8)
    short = build_model(tokenizer, spec, seed=0)
    save_policy(short, tokenizer, tmp_path / "model")
    run = tirl_eval(str(tmp_path / "model"), *EVAL)
    assert run.returncode == 1, run.stderr[-2000:]
    line = run.stderr.strip().splitlines()[-1]
    assert "6 of 6 samples failed" in line and "PromptTooLongError" in line
    assert "model's context 8" in line
    metrics = json.loads(run.stdout[run.stdout.index("{") :])["heldout"]
    assert metrics["eval/failed"] == 6 and metrics["eval/samples"] == 6
    assert metrics["eval/accuracy"] is None  # nan, written as JSON's null: nothing was scored


def test_a_server_that_stops_answering_fails_each_request_after_the_timeout(
    scripted_model, tokenizer, tmp_path
):
    with tirl_serve_process(scripted_model, tokenizer, tmp_path / "model") as (url, server):
        pid = server.pid
        os.kill(pid, signal.SIGSTOP)  # alive, listening, silent
        try:
            run = tirl_eval(
                url, "--tokenizer", str(tmp_path / "model"), "--request-timeout-s", "2", *EVAL,
                timeout=120,
            )  # fmt: skip
        finally:
            os.kill(pid, signal.SIGCONT)
    assert run.returncode == 1, run.stderr[-2000:]
    line = run.stderr.strip().splitlines()[-1]
    assert "did not answer within 2 s" in line and "samples failed" in line


def test_the_request_timeout_belongs_to_a_server_url(tmp_path, tiny_model, tokenizer):
    save_policy(tiny_model, tokenizer, tmp_path / "model")
    run = tirl_eval(str(tmp_path / "model"), "--request-timeout-s", "5", *EVAL)
    assert run.returncode == 2 and "applies to a server URL" in run.stderr
