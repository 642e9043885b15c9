"""The in-process vLLM backend's pure parts, without vLLM: the install hint, the request it
builds, the output it parses. The engine itself runs against the real vLLM in tests/vllm_cpu/."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from tirl.backends import vllm as backend


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
    with_eos = backend.sampling_kwargs(7, 1.0, (), None, eos_id=4)
    assert with_eos["stop_token_ids"] == [4] and with_eos["ignore_eos"]  # that id, no other


def _completion(ids, finish, stop_reason=None):
    steps = [{i: SimpleNamespace(logprob=-0.1 * (n + 1))} for n, i in enumerate(ids)]
    return SimpleNamespace(
        token_ids=ids, logprobs=steps, finish_reason=finish, stop_reason=stop_reason
    )


def test_parse_completion_reads_the_sampled_tokens_logprobs():
    ids, logprobs, finish, reason = backend.parse_completion(_completion([5, 9], "stop", "```"))
    assert ids == [5, 9] and logprobs == pytest.approx([-0.1, -0.2])
    assert (finish, reason) == ("stop", "```")


def test_the_weights_payload_holds_every_name_tied_ones_as_copies(tiny_model):
    from safetensors.torch import load

    payload, count = backend.weights_payload(tiny_model)
    tensors = load(payload)
    state = tiny_model.state_dict()
    assert count == len(tensors) == len(state)
    assert "lm_head.weight" in tensors  # tied to the embeddings, sent under its own name
    for name, tensor in state.items():
        assert tensors[name].equal(tensor), name


def test_unseeded_requests_get_a_stream_of_seeds_and_seeded_ones_keep_theirs():
    from tirl.backends.server_stops import RequestSeeds

    seeds = RequestSeeds(0)
    drawn = [seeds(None) for _ in range(4)]
    assert len(set(drawn)) == 4  # not the engine's seed again and again
    assert seeds(7) == 7
    assert [RequestSeeds(0)(None) for _ in range(2)] == [drawn[0]] * 2  # reproducible
    assert RequestSeeds(None)(None) is None  # no seed: the server's own randomness
