"""The official `openai` Python client against `tirl serve` (a real subprocess on loopback).

It lists models, completes, streams and chats, and what it gets back is checked against the
in-process `HFEngine` on the same model (greedy decoding, or the same seed), not just for shape.
The tokenizer gets a small Qwen2.5-style ChatML template locally (nothing is downloaded).
Not covered here: malformed requests (tests/test_serve_fuzz.py), authentication
(tests/test_auth.py).
"""

from __future__ import annotations

import asyncio
import copy

import openai
import pytest
from conftest import tirl_serve

from tirl.backends.hf import HFEngine
from tirl.httpauth import client_key

CHATML = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)  # the session's tokenizer stays template-less
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def served(scripted_model, chat_tokenizer, tmp_path_factory):
    with tirl_serve(scripted_model, chat_tokenizer, tmp_path_factory.mktemp("m") / "model") as url:
        yield url


@pytest.fixture()
def client(served):
    # trust_env=False: never through a proxy from the environment; loopback only.
    http = openai.DefaultHttpxClient(trust_env=False)
    key = client_key() or "unused"  # the server inherits this environment, and its key if any
    yield openai.OpenAI(base_url=f"{served}/v1", api_key=key, http_client=http, max_retries=0)
    http.close()


def _local(model, tokenizer, ids, max_tokens, temperature=0.0, seed=None):
    """The in-process engine's ids for the same prompt ids."""

    async def main():
        engine = HFEngine(model, tokenizer.eos_token_id, max_batch=4)
        out = await engine.generate(
            "k", ids, max_new_tokens=max_tokens, temperature=temperature, seed=seed
        )
        engine.close()
        return out

    return asyncio.run(main())


def test_the_client_lists_the_served_model_with_its_context(client, served):
    (card,) = client.models.list().data
    assert card.id.endswith("model")
    assert card.model_extra["max_model_len"] == 256  # the tiny model's positions


def test_a_completion_is_the_in_process_engines_text(client, scripted_model, chat_tokenizer):
    model = client.models.list().data[0].id
    done = client.completions.create(model=model, prompt="D:\n", max_tokens=20, temperature=0)
    ids = chat_tokenizer.encode("D:\n", add_special_tokens=False)
    local = _local(scripted_model, chat_tokenizer, ids, 20)
    (choice,) = done.choices
    assert choice.text == chat_tokenizer.decode(local.ids, skip_special_tokens=True)
    assert "print(6 * 7)" in choice.text  # the scripted model's code for D
    assert done.usage.prompt_tokens == len(ids)
    assert done.usage.completion_tokens == len(local.ids)


@pytest.mark.parametrize("stop", [None, ["7)"]])
def test_a_streamed_completion_joins_to_the_unstreamed_one(client, stop):
    model = client.models.list().data[0].id
    kwargs = dict(model=model, prompt="D:\n", max_tokens=20, temperature=0, stop=stop)
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert len(pieces) > 2  # it really came in pieces
    assert "".join(p.text for p in pieces) == whole.text
    assert [p.finish_reason for p in pieces][-1] == whole.finish_reason
    assert all(p.finish_reason is None for p in pieces[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    if stop:
        assert whole.finish_reason == "stop" and "7)" not in whole.text


def test_n_choices_have_their_own_seed_streams(client, scripted_model, chat_tokenizer):
    model = client.models.list().data[0].id
    # A high temperature flattens the scripted model's confident distribution, so that three
    # different streams cannot plausibly draw the same 12 tokens.
    kwargs = dict(model=model, prompt="Compute 1", max_tokens=12, temperature=5.0, seed=7)
    three = client.completions.create(**kwargs, n=3, extra_body={"return_token_ids": True})
    one = client.completions.create(**kwargs, extra_body={"return_token_ids": True})
    ids = [c.model_extra["token_ids"] for c in sorted(three.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(three.choices, key=lambda c: c.index)] == [0, 1, 2]
    assert ids[0] == one.choices[0].model_extra["token_ids"]  # choice 0 is the seed itself
    assert len({tuple(i) for i in ids}) == 3  # and the others are not copies of it
    prompt = chat_tokenizer.encode("Compute 1", add_special_tokens=False)
    local = _local(scripted_model, chat_tokenizer, prompt, 12, temperature=5.0, seed=7)
    assert ids[0] == local.ids


def test_chat_renders_the_template_and_streams(client, scripted_model, chat_tokenizer):
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "D:\n"}]
    done = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0
    )
    text = chat_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = chat_tokenizer.encode(text, add_special_tokens=False)
    local = _local(scripted_model, chat_tokenizer, ids, 16)
    (choice,) = done.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == chat_tokenizer.decode(local.ids, skip_special_tokens=True)
    assert done.usage.prompt_tokens == len(ids)
    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=16, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_what_is_not_supported_is_a_400_naming_it_and_an_unknown_model_404(client):
    model = client.models.list().data[0].id
    for field, kwargs in [
        ("echo", {"echo": True}),
        ("best_of", {"best_of": 3}),
        ("logit_bias", {"logit_bias": {"5": 10}}),
        ("top_p", {"top_p": 0.5}),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=model, prompt="D:\n", max_tokens=4, **kwargs)
        assert err.value.body["param"] == field and field in err.value.body["message"]
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="no-such-model", prompt="D:\n", max_tokens=4)
    assert err.value.body["param"] == "model" and err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
