"""Shared fixtures: a tokenizer and a tiny model made from scratch (nothing downloaded)."""

from __future__ import annotations

import pytest
from transformers.utils import logging as hf_logging

from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.protocol.fences import render_code, render_tool_output
from tirl.protocol.segments import SegmentKind
from tirl.synth.arithmetic import demonstration_texts, text_only_texts, to_trajectory
from tirl.train.config import SFTConfig
from tirl.train.sft import train_sft

hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


@pytest.fixture(scope="session")
def env() -> ArithmeticEnv:
    return ArithmeticEnv()


@pytest.fixture(scope="session")
def tokenizer(env):
    texts = []
    for task in env.items("train", 300, start=10**6):
        texts.append("".join(t for _, t in demonstration_texts(task, task.answer)))
        texts.append("".join(t for _, t in text_only_texts(task)))
    texts.append("ZeroDivisionError TimeoutError Traceback while True: pass 1/0")
    return train_tokenizer(texts, vocab_size=384)


@pytest.fixture()
def tiny_model(tokenizer):
    return build_model(
        tokenizer, TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256), seed=0
    ).eval()


CODES = {
    "A:\n": "print(1/0)",  # raises
    "B:\n": "while True:\n    pass",  # times out
    "C:\n": 'print("\\\\boxed{42}")',  # the interpreter, not the model, prints a box
    "D:\n": "print(6 * 7)",
}


@pytest.fixture(scope="session")
def scripted_model(tokenizer):
    """A real tiny model trained until it writes one fixed code block per prompt."""
    model = build_model(
        tokenizer, TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256), seed=0
    )
    demos = [
        to_trajectory(
            [
                (SegmentKind.PROMPT, prompt),
                (SegmentKind.MODEL, render_code(code)),
                (SegmentKind.TOOL, render_tool_output("x")),
                (SegmentKind.MODEL, "done"),
            ],
            tokenizer,
            {},
        )
        for prompt, code in CODES.items()
    ]
    train_sft(
        model,
        demos,
        SFTConfig(steps=150, batch_size=8, lr=3e-3, warmup_steps=5),
        pad_id=tokenizer.pad_token_id,
        seed=0,
    )
    return model.eval()
