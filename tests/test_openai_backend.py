"""The OpenAI-compatible path, against a real server on loopback: `tirl serve` runs the HF
backend in a subprocess, `OpenAIEngine` talks to it over HTTP, and the results must be the ones
the in-process engine gives for the same model and prompts (greedy decoding)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from conftest import tirl_serve

from tirl.backends.hf import HFEngine
from tirl.backends.openai import OpenAIEngine
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits

PROMPTS = ["A:\n", "D:\n", "Compute 12 * 34."]  # the scripted model writes code for A and D


@pytest.fixture(scope="module")
def server(scripted_model, tokenizer, tmp_path_factory):
    """One `tirl serve` of the scripted model for the module (conftest's `server` starts one per
    test; these tests only read from it, and greedy decoding makes its answers stateless)."""
    with tirl_serve(scripted_model, tokenizer, tmp_path_factory.mktemp("m") / "model") as url:
        yield url


def _rollouts(engine, tokenizer, settings):
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2), preload=("math",)) as sandbox:
            trajs = await Rollout(engine, tokenizer, sandbox).run_many(PROMPTS, settings)
        if hasattr(engine, "aclose"):
            await engine.aclose()
        else:
            engine.close()
        return trajs

    return asyncio.run(main())


@pytest.mark.parametrize("use_tools", [False, True])
def test_the_server_gives_the_in_process_engines_trajectories(
    server, scripted_model, tokenizer, use_tools
):
    settings = RolloutSettings(
        max_model_tokens=24, tool_budget=1, temperature=0.0, use_tools=use_tools
    )
    local = _rollouts(
        HFEngine(scripted_model, tokenizer.eos_token_id, max_batch=8), tokenizer, settings
    )
    assert (sum(len(t.tool_calls) for t in local) >= 2) == use_tools  # code ran, or no tools
    remote_engine = OpenAIEngine(server, tokenizer)
    remote = _rollouts(remote_engine, tokenizer, settings)
    assert remote_engine.exact_ids  # the server returned token ids: nothing was re-tokenized
    for a, b in zip(local, remote):
        assert [s.ids for s in b.segments] == [s.ids for s in a.segments]
        assert [(c.code, c.status) for c in b.tool_calls] == [
            (c.code, c.status) for c in a.tool_calls
        ]
        assert b.finish_reason == a.finish_reason


def test_server_health_models_and_bad_requests(server):
    with urllib.request.urlopen(f"{server}/v1/models") as r:
        assert json.load(r)["data"][0]["id"].endswith("model")
    bad = urllib.request.Request(
        f"{server}/v1/completions", data=json.dumps({"prompt": []}).encode(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(bad)
    assert err.value.code == 400 and "prompt must be" in err.value.read().decode()
