"""`tirl train` end to end on a verifiers environment (the `verifiers` source), tiny settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from tiny_run import TINY  # noqa: E402

# Until `verifiers_env` is imported by tirl.tasks.sources, the run imports it first.
RUN = (
    "import sys\nimport tirl.tasks.sources.verifiers_env\nfrom tirl.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_tirl_train_runs_on_a_verifiers_environment(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent / "envs"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    overrides = [
        "train", f"out_dir={tmp_path}", "name=v", *TINY, "sft.steps=0",
        "data.train=[{source: verifiers, env: vf-addition-test}]",
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", RUN, *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    records = [
        json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()
    ]
    assert sorted(r["step"] for r in records if r["phase"] == "rl") == [0, 1, 2]
    samples = (tmp_path / "v" / "samples" / "code_rl_heldout.jsonl").read_text().splitlines()
    scored = [json.loads(line) for line in samples]
    assert scored and all(s["score"]["reason"].startswith("exact_match=") for s in scored)
    assert all(s["meta"]["question"].startswith("What is ") for s in scored)


def test_the_recipe_loads():
    """recipes/verifiers.yaml validates (its source built, through tirl's own export)."""
    recipe = TESTS.parent / "recipes" / "verifiers.yaml"
    run = subprocess.run(
        [sys.executable, "-c", RUN, "config", str(recipe)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
