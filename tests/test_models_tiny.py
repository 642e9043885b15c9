"""Model options of `tirl.models.tiny`: weights held in a dtype, gradient checkpointing, and the
chat tokenizer's special tokens."""

from __future__ import annotations

import pytest
import torch

from tirl.config import ConfigError
from tirl.models.tiny import (
    EOS,
    IM_END,
    IM_START,
    TinyModelSpec,
    build_model,
    is_gradient_checkpointing,
    load_policy,
    resolve_dtype,
    save_policy,
    set_gradient_checkpointing,
    train_tokenizer,
)

SPEC = TinyModelSpec(hidden_size=32, layers=2, heads=2, max_positions=64)


def test_weights_are_held_in_the_dtype_asked_for(tokenizer, tmp_path):
    model = build_model(tokenizer, SPEC, seed=0, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    reference = build_model(tokenizer, SPEC, seed=0)  # float32, same seed
    assert {p.dtype for p in reference.parameters()} == {torch.float32}
    save_policy(model, tokenizer, tmp_path / "m")
    for dtype, want in (
        ("bfloat16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp32", torch.float32),
    ):
        loaded, _ = load_policy(tmp_path / "m", dtype=dtype)
        assert {p.dtype for p in loaded.parameters()} == {want}, dtype
        name, weight = next(iter(loaded.state_dict().items()))
        expected = model.state_dict()[name].to(want)
        assert torch.equal(weight, expected)  # bf16 values are exact in fp16 and fp32 here
    ids = torch.tensor([tokenizer("Problem: 1", add_special_tokens=False)["input_ids"]])
    assert model(ids).logits.dtype == torch.bfloat16  # computed in bf16, not autocast
    assert resolve_dtype(None) is None and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(ConfigError, match="unknown model dtype 'float8'"):
        build_model(tokenizer, SPEC, seed=0, dtype="float8")


def _grads(model, ids):
    model.zero_grad()
    model(ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_gives_the_same_gradients(tokenizer):
    model = build_model(tokenizer, SPEC, seed=0).train()
    model.config.attention_dropout = 0.0
    ids = torch.tensor(
        [tokenizer("Problem: Compute 12 * 34.", add_special_tokens=False)["input_ids"]]
    )
    plain = _grads(model, ids)
    set_gradient_checkpointing(model, True)
    assert is_gradient_checkpointing(model)
    checkpointed = _grads(model, ids)
    assert plain.keys() == checkpointed.keys() and len(plain) > 0
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-4, atol=1e-6)
    torch.optim.SGD(model.parameters(), lr=0.1).step()  # a training step still runs
    set_gradient_checkpointing(model, False)
    assert not is_gradient_checkpointing(model)


def test_chat_tokenizer_adds_turn_tokens_and_a_qwen_template():
    texts = ["Problem: Compute 12 * 34.\nSolution:\n"] * 10
    plain = train_tokenizer(texts, vocab_size=300)
    chat = train_tokenizer(texts, vocab_size=300, chat_template=True)
    assert plain.chat_template is None and plain.eos_token == EOS
    assert chat.eos_token == IM_END and chat.chat_template
    assert {IM_START, IM_END} <= set(chat.all_special_tokens)
    assert plain.convert_tokens_to_ids([EOS, "<|pad|>"]) == [0, 1]  # the plain ids as before
    assert chat.convert_tokens_to_ids([EOS, "<|pad|>"]) == [0, 1]
    rendered = chat.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        rendered
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
