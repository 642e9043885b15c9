"""One runtime for every command (`tirl.run.build`): `tirl train` runs its code on the
transport `sandbox.kind` names, a real `tirl sandbox serve` server or a Ray pool on a local
cluster, end to end; and a sandbox section that cannot work is one line before any work."""

from __future__ import annotations

import re
import urllib.request

import pytest
from test_sandbox_http import running_server
from tiny_run import run, train_cmd

from tirl.config import load_config
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.run.config import RunConfig
from tirl.sandbox.config import SANDBOX_TRANSPORTS


def _cells_run(url: str) -> float:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    with opener.open(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(r"^tirl_sandbox_cells_total{[^}]*} (\S+)$", text, re.M))


def test_tirl_train_runs_its_code_on_a_sandbox_server(tmp_path):
    with running_server(tmp_path / "server") as server:
        assert _cells_run(server.url) == 0
        done = run(train_cmd(tmp_path, "over-http", "sandbox.kind=http",
                             f"sandbox.urls=[{server.url}]"))  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert _cells_run(server.url) > 0  # the demonstrations' code ran there, not here


@pytest.mark.slow
def test_tirl_train_runs_its_code_on_a_ray_pool(tmp_path):
    done = run(train_cmd(tmp_path, "over-ray", "sandbox.kind=ray", "sandbox.actors=1"), 600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "over-ray" / "code" / "rl").is_dir()


def test_the_transports_are_registered_by_name():
    assert {"local", "http", "ray"} <= set(SANDBOX_TRANSPORTS)


@pytest.mark.parametrize(
    ("overrides", "code", "words"),
    [
        (["sandbox.kind=docker"], 2, "sandbox.kind must name a registered sandbox transport"),
        (["sandbox.kind=http"], 2, "sandbox.urls must list the servers' base URLs for kind http"),
        (["sandbox.kind=http", "sandbox.urls=[ftp://x]"], 2, "must list server base URLs"),
        (["sandbox.urls=[http://127.0.0.1:1]"], 2, "sandbox.urls is read only by kind http"),
        (["sandbox.actors=0"], 2, "sandbox.actors"),
        # port 9 (discard) on loopback: nothing listens there on this machine
        (
            ["sandbox.kind=http", "sandbox.urls=[http://127.0.0.1:9]"],
            1,
            "no sandbox server answered",
        ),
    ],
)
def test_a_sandbox_section_that_cannot_work_is_one_line_before_any_work(
    tmp_path, overrides, code, words
):
    done = run(train_cmd(tmp_path, "bad", *overrides))
    line = done.stderr.strip()
    assert done.returncode == code and "\n" not in line, done.stderr[-2000:]
    assert line.startswith("tirl: error: ") and words in line
    assert not (tmp_path / "bad" / "code").exists()  # no tokenizer, no SFT: nothing was done


@pytest.mark.parametrize(
    "overrides",
    [[], ["rl.one_step_off_policy=true"], ["rl.off_policy_steps=2"], ["model.lora.rank=4"]],
    ids=["hf", "hf-one-step-off", "hf-async-k2", "hf-lora"],
)
def test_a_runs_engine_capabilities_are_what_its_built_engine_has(overrides, tmp_path):
    """What the trainer is told (`engine_capabilities`: the kind's declaration and the
    builder's choice) is what the engine `engine_for` builds really has, as its attributes
    show (`probe_capabilities`, the trainer's old way of finding out)."""
    from tirl.run.build import engine_capabilities, engine_for
    from tirl.train.capabilities import probe_capabilities
    from tirl.train.pipeline import with_lora

    cfg = load_config(RunConfig, overrides=overrides)
    tokenizer = train_tokenizer(["Compute 1 + 1. 2"], vocab_size=300)
    model = build_model(tokenizer, TinyModelSpec(hidden_size=32, layers=1, heads=2), seed=0)
    if cfg.model.lora.rank:
        model = with_lora(model, cfg)
    engine = engine_for(cfg, model, tokenizer, tokenizer.eos_token_id, tmp_path)
    assert engine_capabilities(cfg) == probe_capabilities(engine, model)
