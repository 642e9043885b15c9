"""Shared fixtures: a tokenizer and a tiny model made from scratch (nothing downloaded)."""

from __future__ import annotations

import pytest
from transformers.utils import logging as hf_logging

from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.synth.arithmetic import demonstration_texts, text_only_texts

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
