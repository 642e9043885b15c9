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
    assert engine.reused_steps > 0  # the decode fast path was part of what matched
    engine.close()


def test_reusing_the_batch_cache_changes_nothing_sampled(tiny_model, tokenizer):
    """Seeded sampling with and without the decode fast path gives the same ids and
    log-probabilities, with requests joining and leaving mid-way."""
    prompts = [tokenizer(f"Problem: {i} + {i * 13}\n")["input_ids"] for i in range(6)]

    def run(reuse: bool):
        engine = HFEngine(tiny_model, -1, max_batch=4, reuse_batch_cache=reuse)

        async def one(key, prompt):
            a = await engine.generate(key, prompt, max_new_tokens=3 + key, seed=key)
            b = await engine.generate(key, [7, 8], max_new_tokens=5, seed=100 + key)
            return a.ids + b.ids, a.logprobs + b.logprobs

        async def main():
            return await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))

        out = asyncio.run(main())
        engine.close()
        return out, engine.reused_steps

    with_reuse, reused = run(True)
    without, not_reused = run(False)
    assert reused > 0 and not_reused == 0
    for (ids_a, lp_a), (ids_b, lp_b) in zip(with_reuse, without):
        assert ids_a == ids_b
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-5


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


def test_static_admission_waits_for_the_whole_batch_before_new_keys(tiny_model, tokenizer):
    prompt = tokenizer("Problem:")["input_ids"]

    async def main():
        engine = HFEngine(tiny_model, -1, max_batch=2, admission="static")
        gen = [asyncio.create_task(engine.generate(k, prompt, max_new_tokens=3)) for k in "abc"]
        await asyncio.gather(gen[0], gen[1])  # a and b form the batch
        await asyncio.sleep(0.05)
        held_while_members_live = not gen[2].done()
        engine.release("a")
        await asyncio.sleep(0.05)
        held_while_one_member_lives = not gen[2].done()
        engine.release("b")  # the batch is done: c is admitted
        out = await asyncio.wait_for(gen[2], 10)
        engine.close()
        return held_while_members_live, held_while_one_member_lives, out

    held_a, held_b, out = asyncio.run(main())
    assert held_a and held_b and len(out.ids) == 3
