"""The in-process vLLM backend without vLLM: the install hint, the request it builds, the
output it parses, and its boundary loop over a fake `AsyncLLM`."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace

import pytest

from tirl.backends import vllm as backend
from tirl.protocol.fences import CIR_FENCES
from tirl.rollout.runner import BlockClosed


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_without_vllm_the_error_names_the_extra():
    with pytest.raises(ImportError, match=r"pip install 'tirl\[vllm\]'"):
        backend.VLLMEngine("some/model")


def test_sampling_kwargs_ask_for_ids_logprobs_and_kept_stop_strings():
    kw = backend.sampling_kwargs(7, 0.5, ("```",), seed=3)
    assert kw["max_tokens"] == 7 and kw["temperature"] == 0.5 and kw["seed"] == 3
    assert kw["logprobs"] == 0 and kw["stop"] == ["```"]
    assert kw["include_stop_str_in_output"] and not kw["skip_special_tokens"]
    assert "stop" not in backend.sampling_kwargs(7, 1.0, (), None)


def _completion(ids, finish, stop_reason=None):
    steps = [{i: SimpleNamespace(logprob=-0.1 * (n + 1))} for n, i in enumerate(ids)]
    return SimpleNamespace(
        token_ids=ids, logprobs=steps, finish_reason=finish, stop_reason=stop_reason
    )


def test_parse_completion_reads_the_sampled_tokens_logprobs():
    ids, logprobs, finish, reason = backend.parse_completion(_completion([5, 9], "stop", "```"))
    assert ids == [5, 9] and logprobs == pytest.approx([-0.1, -0.2])
    assert (finish, reason) == ("stop", "```")


class FakeLLM:
    """Answers scripted completions and records each request's prompt ids and params."""

    def __init__(self, completions) -> None:
        self.completions = list(completions)
        self.requests = []

    async def generate(self, prompt, params, request_id):
        self.requests.append((prompt["prompt_token_ids"], params))
        yield SimpleNamespace(outputs=[self.completions.pop(0)])


def _engine(completions) -> backend.VLLMEngine:
    engine = object.__new__(backend.VLLMEngine)  # no vLLM here: inject a fake module and LLM
    engine._vllm = SimpleNamespace(
        SamplingParams=lambda **kw: kw, TokensPrompt=lambda **kw: dict(kw)
    )
    engine.seed = None
    engine.llm = FakeLLM(completions)
    engine._history = {}
    return engine


def test_a_fence_that_opens_a_block_continues_and_the_closing_one_is_a_boundary(tokenizer):
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    opening, body = enc("```python\n"), enc("x = 1\n```")
    engine = _engine([_completion(opening, "stop", "```"), _completion(body, "stop", "```")])
    stop = BlockClosed(lambda ids: tokenizer.decode(ids), CIR_FENCES)

    out = asyncio.run(engine.generate("k", [1, 2], max_new_tokens=50, stop=stop))
    assert out.finish_reason == "boundary" and out.ids == opening + body
    first, second = engine.llm.requests
    assert first[0] == [1, 2] and second[0] == [1, 2, *opening]  # continued from the ids
    assert second[1]["max_tokens"] == 50 - len(opening) and second[1]["stop"] == ["```"]
    assert engine._history["k"] == [1, 2, *opening, *body]
    engine.release("k")
    assert "k" not in engine._history
