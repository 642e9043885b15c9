"""The `tirl` command as a user runs it."""

import json
import subprocess
import sys

import pytest

from tirl.cli import main


def test_a_config_typo_is_reported_with_the_key_and_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "config", "rl.lrr=1e-4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "rl.lrr" in proc.stderr and "did you mean 'rl.lr'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "override, words",
    [
        ("rl.clip_low=1.5", ["rl.clip_low", "1.5"]),
        ("data.train=[{source: arithmetic, kinds: [prod]}]", ["data.train[0].kinds", "prod"]),
        ("data.train[0].digits=12", ["data.train[0].digits", "12"]),
        ("rl.budget_schedule=[[0.5,2]]", ["budget_schedule", "0"]),
        ("rl.group_size=1", ["group_size", "1"]),
        ("model.hidden_size=130", ["hidden_size", "heads"]),
    ],
)
def test_bad_values_name_the_key_and_value(override, words, capsys):
    assert main(["config", override]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_a_missing_config_file_is_a_clear_error(capsys, tmp_path):
    assert main(["config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for sub in ("quickstart", "train", "eval", "config"):
        assert sub in out


@pytest.mark.slow
def test_quickstart_runs_end_to_end_on_a_small_budget(tmp_path, capsys):
    overrides = [
        f"out_dir={tmp_path}",
        "name=smoke",
        "sft.steps=4",
        "sft.examples=32",
        "sft.batch_size=8",
        "rl.steps=2",
        "rl.prompts_per_step=2",
        "rl.group_size=2",
        "rl.max_model_tokens=24",
        "data.eval=[{name: heldout, items: 4}]",
        "eval.max_model_tokens=24",
        "model.tokenizer_corpus_items=100",
        "model.hidden_size=32",
        "model.layers=1",
        "model.heads=2",
    ]
    assert main(["quickstart", *overrides]) == 0
    run = tmp_path / "smoke"
    for name in ("config.yaml", "metrics.jsonl", "eval.json", "report.md", "report.html"):
        assert (run / name).is_file(), name
    results = json.loads((run / "eval.json").read_text())
    assert set(results["code"]) == {"sft", "rl"} and set(results["text"]) == {"sft", "rl"}
    assert (run / "code" / "rl" / "config.json").is_file()
    phases = {
        (r["variant"], r["phase"])
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    }
    assert phases == {("code", "sft"), ("code", "rl"), ("text", "sft"), ("text", "rl")}
    assert "accuracy" in capsys.readouterr().out
    # the saved checkpoint loads back through the same path a hub model would
    assert (
        main(
            [
                "eval",
                str(run / "code" / "rl"),
                "data.eval=[{name: heldout, items: 2}]",
                "eval.max_model_tokens=16",
            ]
        )
        == 0
    )
    # benchmarks: a local file in the MATH-500 layout, resumed from the results folder
    bench = tmp_path / "mini.jsonl"
    rows = [
        {
            "problem": f"Compute {a} * 3.",
            "answer": str(3 * a),
            "subject": "Arithmetic",
            "level": 1,
            "unique_id": f"mini/{a}",
        }
        for a in (11, 12, 13)
    ]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "bench_eval"
    args = [
        "eval",
        str(run / "code" / "rl"),
        "--benchmark",
        str(bench),
        "-k",
        "2",
        "--max-tokens",
        "16",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    samples = (out / "mini.samples.jsonl").read_text()
    assert len(samples.splitlines()) == 6
    assert main(args) == 0 and (out / "mini.samples.jsonl").read_text() == samples  # resumed
    metrics = json.loads((out / "metrics.json").read_text())["mini"]
    assert metrics["n_items"] == 3 and "avg@2_ci95" in metrics
    assert (out / "report.md").is_file() and (out / "accuracy.png").is_file()
    assert "<html" in (out / "viewer.html").read_text()
    assert main(["view", str(out / "mini.samples.jsonl"), "-o", str(tmp_path / "v.html")]) == 0
    assert (tmp_path / "v.html").is_file()
    assert main(["view", str(tmp_path / "missing")]) == 2
    capsys.readouterr()
    assert main(["eval", str(run / "code" / "rl"), "--benchmark", "math5000"]) == 2
    err = capsys.readouterr().err
    assert "--benchmark math5000" in err and "math500, aime24" in err and "Traceback" not in err


def test_a_killed_run_resumes_and_logs_every_step_once(tmp_path):
    """Kill `tirl train` once RL has checkpointed, then `--resume`: SFT is not redone, RL goes
    on from its checkpoint, and metrics.jsonl holds each step exactly once."""
    import signal
    import time

    from tiny_run import TINY

    # The tiny run of tiny_run.py, longer, so that it can be killed between checkpoints.
    overrides = [f"out_dir={tmp_path}", "name=r", *TINY, "rl.steps=12"]
    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "tirl.cli", "train", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = run / "code" / "rl_state" / "trainer.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.exists() and not (run / "code" / "rl").exists(), "killed before RL ended"
    sft_weights = (run / "code" / "sft" / "model.safetensors").stat().st_mtime_ns

    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "code" / "sft" / "model.safetensors").stat().st_mtime_ns == sft_weights
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl_steps = [r["step"] for r in records if r["phase"] == "rl"]
    assert sorted(rl_steps) == list(range(12))
    sft_steps = [r["step"] for r in records if r["phase"] == "sft"]
    assert sorted(sft_steps) == list(range(4))
    results = json.loads((run / "eval.json").read_text())
    assert set(results["code"]) == {"sft", "rl"}

    changed = subprocess.run(
        [*cmd, "rl.lr=0.5", "--resume"], capture_output=True, text=True, timeout=120
    )
    assert changed.returncode != 0 and "rl.lr" in changed.stderr
    assert "Traceback" not in changed.stderr


def test_train_under_two_gloo_ranks_matches_one_process(tmp_path):
    """`tirl train` launched as two ranks (what torchrun sets up: RANK, WORLD_SIZE, master on
    loopback) trains the same policy as one process: same RL metrics, same held-out score."""
    import os
    import socket

    def overrides(name: str) -> list[str]:
        return [
            f"out_dir={tmp_path}",
            f"name={name}",
            "variants=[code]",
            "sft.steps=4",
            "sft.examples=32",
            "sft.batch_size=8",
            "rl.steps=2",
            "rl.prompts_per_step=4",
            "rl.group_size=2",
            "rl.max_model_tokens=24",
            "data.eval=[{name: heldout, items: 8}]",
            "eval.max_model_tokens=24",
            "eval.samples_per_item=0",
            "model.tokenizer_corpus_items=100",
            "model.hidden_size=32",
            "model.layers=1",
            "model.heads=2",
        ]

    subprocess.run(
        [sys.executable, "-m", "tirl.cli", "train", *overrides("one")], check=True, timeout=300
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        cmd = [sys.executable, "-m", "tirl.cli", "train", *overrides("two")]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]

    def rl_records(name: str) -> list[dict]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["phase"] == "rl"]

    one, two = rl_records("one"), rl_records("two")
    assert [r["step"] for r in two] == [0, 1]  # rank 0 alone logs
    for a, b in zip(one, two):
        for key in ("train/reward_mean", "length/model_tokens_mean", "actor/pg_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    eval_one = json.loads((tmp_path / "one" / "eval.json").read_text())["code"]["rl"]["heldout"]
    eval_two = json.loads((tmp_path / "two" / "eval.json").read_text())["code"]["rl"]["heldout"]
    assert eval_one["eval/accuracy"] == eval_two["eval/accuracy"]
    assert eval_one["length/model_tokens_mean"] == eval_two["length/model_tokens_mean"]
