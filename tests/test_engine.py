"""The batched KV-cache sampler against plain full forward passes of the same model."""

import asyncio

import torch

from tirl.backends.hf import HFEngine


def _reference_logprobs(model, ids: list[int], start: int, sampled: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return [logp[start - 1 + j, t].item() for j, t in enumerate(sampled)]


def test_ragged_batched_generation_matches_full_forward(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer.eos_token_id, max_batch=5, seed=0)
    prompts = [
        tokenizer(f"Problem: Compute {i} * {i + 7}.\n")["input_ids"][: 5 + i] for i in range(9)
    ]

    async def one(key, prompt):
        first = await engine.generate(key, prompt, max_new_tokens=4 + key % 3, temperature=1.0)
        tool = [5, 6, 7][: 1 + key % 3]  # a ragged "tool output" fed mid-sequence
        second = await engine.generate(key, tool, max_new_tokens=3, temperature=1.0)
        return prompt, first, tool, second

    async def main():
        return await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))

    for prompt, first, tool, second in asyncio.run(main()):
        if first.finish_reason == "stop":
            continue
        full = prompt + first.ids + tool + second.ids
        ref_first = _reference_logprobs(tiny_model, full, len(prompt), first.ids)
        ref_second = _reference_logprobs(
            tiny_model, full, len(prompt) + len(first.ids) + len(tool), second.ids
        )
        assert (
            max(
                abs(a - b) for a, b in zip(ref_first + ref_second, first.logprobs + second.logprobs)
            )
            < 1e-4
        )
    engine.close()


def test_greedy_is_deterministic_and_respects_limits(tiny_model, tokenizer):
    prompt = tokenizer("Problem: Compute 12 * 34.\n")["input_ids"]

    async def run():
        engine = HFEngine(tiny_model, tokenizer.eos_token_id, seed=1)
        out = await engine.generate("a", prompt, max_new_tokens=6, temperature=0.0)
        engine.close()
        return out

    a, b = asyncio.run(run()), asyncio.run(run())
    assert a.ids == b.ids and len(a.ids) <= 6
    assert a.finish_reason in ("length", "stop")


def test_stop_function_ends_a_call_at_the_boundary(tiny_model, tokenizer):
    prompt = tokenizer("Problem:")["input_ids"]

    async def run():
        engine = HFEngine(tiny_model, -1)  # no eos: only the stop function or the limit ends it
        out = await engine.generate("k", prompt, max_new_tokens=20, stop=lambda ids: len(ids) == 3)
        engine.close()
        return out

    out = asyncio.run(run())
    assert len(out.ids) == 3 and out.finish_reason == "boundary"
