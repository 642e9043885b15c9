"""`tirl synth run` against `tirl serve` with a tiny untrained model (CPU, loopback only).

The tiny tokenizer has no chat template, so `tirl serve` answers /v1/chat/completions with a
400 and the client's fallback to /v1/completions is exercised; the model writes garbage, so
nearly everything is rejected at the format stage. What must hold:
per stage, in = kept + rejected; tokens come from the server's `usage`; a resumed run sends no
request (the server's request counter does not move).
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from conftest import tirl_serve

from tirl.config import load_config
from tirl.models.tiny import TinyModelSpec, build_model
from tirl.synth.config import SynthConfig
from tirl.synth.pipeline import run_pipeline
from tirl.synth.report import stage_stats, usage_stats


@pytest.fixture()
def served_tiny_model(tokenizer, tmp_path):
    # Room for the synth prompts (about 500 tokens): the server refuses longer ones with a 400.
    spec = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=1024)
    model = build_model(tokenizer, spec, seed=0).eval()
    with tirl_serve(model, tokenizer, tmp_path / "model") as url:
        yield url


def _served_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health") as r:
        return json.load(r)["requests"]


def test_pipeline_against_tirl_serve_counts_every_rejection(served_tiny_model, tmp_path):
    url = served_tiny_model
    data = tmp_path / "in.jsonl"
    rows = [
        {"id": i, "problem": f"What is {i} + {i}?", "solution": f"{2 * i}", "answer": 2 * i}
        for i in range(4)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        SynthConfig,
        None,
        [
            f"teacher.url={url}",
            "teacher.max_tokens=12",
            "teacher.temperature=1.0",
            "stages.decontaminate=false",
            "sandbox.preload=[math]",
            "concurrency=2",
        ],
    )
    out = run_pipeline(cfg, str(data), tmp_path / "run")
    stats = stage_stats(out)
    assert [s["stage"] for s in stats][:3] == ["read", "codeify", "format"]
    for s in stats:
        assert s["in"] == s["out"] + s["rejected"], s
    assert stats[1]["in"] == 4 and stats[-1]["out"] == len(
        (out / "trajectories.jsonl").read_text().splitlines()
    )
    (teacher,) = [u for u in usage_stats(out, {}) if u["role"] == "teacher"]
    # The untrained model writes garbage: the point is that usage came back from the server
    # and was counted.
    assert teacher["requests"] == 4 and teacher["prompt_tokens"] > 4 * 100
    sent = _served_requests(url)
    run_pipeline(cfg, str(data), out, resume=True)
    assert _served_requests(url) == sent  # everything came from the cache
