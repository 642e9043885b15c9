"""`tirl train` with `rollout.engine: vllm`: vLLM samples, torch trains, and the weights go
into vLLM after every update. Checked end to end on the real CPU build: the sampler and the
trainer agree on every RL step (they would drift apart from the first update on if a push
were missed), and the greedy evaluation vLLM ran after RL is exactly what HF's engine samples
from the saved RL weights. A bf16 sampler against the fp32 trainer shows the gap, and TIS
weights it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tirl.backends.hf import HFEngine
from tirl.config import load_config
from tirl.models.tiny import load_policy
from tirl.protocol.segments import Trajectory
from tirl.rollout.runner import Rollout
from tirl.run.build import eval_settings
from tirl.run.config import RunConfig
from tirl.sandbox.config import make_sandbox

OVERRIDES = [
    "variants=[code]",
    "model.hidden_size=64",
    "model.layers=2",
    "model.heads=2",
    "model.tokenizer_corpus_items=300",
    "sft.steps=60",
    "sft.batch_size=32",
    "sft.examples=600",
    "sft.code_share=1.0",
    "sft.lr=0.003",
    "rl.steps=4",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "rl.checkpoint_every=2",
    "data.eval=[{name: heldout, items: 24}]",
    "eval.samples_per_item=0",
    "rollout.engine=vllm",
    "rollout_batch=32",
]


def train(tmp: Path, name: str, *more: str) -> Path:
    run = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "train", *OVERRIDES, f"out_dir={tmp}", f"name={name}",
         'rollout.engine_options={kv_cache_gb: 0.5}', *more],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return tmp / name


def rl_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == "rl" and r.get("train/updated")]


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("train"), "vllm-fp32")


def test_every_update_reaches_vllm(fp32_run):
    records = rl_records(fp32_run)
    assert len(records) >= 3
    for r in records:  # sampler (vLLM, pushed weights) and trainer agree on every step
        assert r["mismatch/abs_diff_max"] < 1e-4, r
        assert r["time/weight_push_s"] >= 0


def test_vllm_greedy_after_rl_equals_hf_on_the_saved_rl_weights(fp32_run):
    import asyncio

    cfg = load_config(RunConfig, fp32_run / "config.yaml")
    lines = (fp32_run / "samples" / "code_rl_heldout.jsonl").read_text().splitlines()
    sampled = [Trajectory.from_dict(json.loads(x)) for x in lines]
    model, tokenizer = load_policy(fp32_run / "code" / "rl")
    prompts = [t.segments[0].ids for t in sampled]

    async def hf_greedy():
        engine = HFEngine(model.eval(), tokenizer.eos_token_id, max_batch=32, seed=0)
        try:
            async with make_sandbox(cfg.sandbox) as sandbox:
                rollout = Rollout(engine, tokenizer, sandbox)
                return await rollout.run_many(prompts, eval_settings(cfg, use_tools=True))
        finally:
            engine.close()

    expected = asyncio.run(hf_greedy())
    assert [t.ids for t in sampled] == [t.ids for t in expected]
    assert any(t.tool_calls for t in sampled)


def test_a_bf16_sampler_shows_the_gap_and_tis_weights_it(fp32_run, tmp_path):
    run_dir = train(
        tmp_path, "vllm-bf16-tis", 'rollout.engine_options={kv_cache_gb: 0.5, dtype: bfloat16}',
        "rl.tis_cap=2.0",
    )  # fmt: skip
    bf16, fp32 = rl_records(run_dir), rl_records(fp32_run)
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    assert mean(bf16, "mismatch/abs_diff_mean") > 10 * mean(fp32, "mismatch/abs_diff_mean")
    assert 0 < mean(bf16, "mismatch/kl_k3") < 0.05  # bf16 rounding, not a different policy
    for r in bf16:
        assert 0 < r["mismatch/tis_weight_mean"] <= 2.0
    print("bf16 sampler vs fp32 trainer:", {k: mean(bf16, k) for k in bf16[0] if "mismatch" in k})


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            ["rollout.engine_options={dtype: int8}"],
            "dtype must be one of float32, bfloat16, float16",
        ),
        (["rollout.engine_options={dtype: float16}"], "dtype float16 needs a GPU"),
        (["rollout.engine_options={kv_cache_gb: 0}"], "kv_cache_gb must be > 0"),
        (["rollout.engine_options={sleep_during_update: true}"], "sleep_during_update needs a GPU"),
        (
            ["rollout.engine_options={swap_gb: 4}"],
            "rollout.engine_options.swap_gb is not a parameter",
        ),
        (["device=cuda"], "cuda"),  # the machine has no GPU, and this vLLM is the CPU build
    ],
)
def test_a_vllm_setting_that_cannot_run_here_is_one_line_before_any_work(
    tmp_path, overrides, words
):
    run = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "train", "rollout.engine=vllm", f"out_dir={tmp_path}",
         *overrides],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    line = run.stderr.strip()
    assert run.returncode == 2 and "\n" not in line, run.stderr[-2000:]
    assert line.startswith("tirl: error: ") and words in line
    assert not any(tmp_path.iterdir())
