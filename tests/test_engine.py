"""The batched KV-cache sampler against plain full forward passes of the same model, and
the slot cache against the padded cache it replaced (`tirl.backends.kv_slots`)."""

import asyncio

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tirl.backends.hf import HFEngine
from tirl.backends.kv_slots import causal_row_mask
from tirl.models.tiny import TinyModelSpec, build_model


def _reference_logprobs(model, ids: list[int], start: int, sampled: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return [logp[start - 1 + j, t].item() for j, t in enumerate(sampled)]


@pytest.mark.parametrize(
    ("kv_cache", "fused"), [("slots", True), ("slots", False), ("padded", None)]
)
def test_ragged_batched_generation_matches_full_forward(tiny_model, tokenizer, kv_cache, fused):
    engine = HFEngine(
        tiny_model, tokenizer.eos_token_id, max_batch=5, seed=0, kv_cache=kv_cache, fused=fused
    )
    assert engine.fused is bool(fused)
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
    if kv_cache == "padded":
        assert engine.reused_steps > 0  # the decode fast path was part of what matched
    else:  # rows left (set aside), rejoined (written back) and were packed (moved)
        assert engine.kv.saves > 0 and engine.kv.loads > 0 and engine.kv.moves > 0
    engine.close()


def test_reusing_the_batch_cache_changes_nothing_sampled(tiny_model, tokenizer):
    """Seeded sampling with and without the decode fast path gives the same ids and
    log-probabilities, with requests joining and leaving mid-way."""
    prompts = [tokenizer(f"Problem: {i} + {i * 13}\n")["input_ids"] for i in range(6)]

    def run(reuse: bool):
        engine = HFEngine(tiny_model, -1, max_batch=4, reuse_batch_cache=reuse, kv_cache="padded")

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


def _seeded_workload(
    model,
    prompts,
    kv_cache: str,
    admission: str = "continuous",
    fused: bool | None = None,
    threads: int = 0,
):
    """More keys than rows, ragged prompts and tool outputs, calls of different lengths (rows
    leave at different steps and others take them), seeded, unseeded and greedy calls, and a
    key released and reused for a new sequence. Returns the ids and log-probs of every call
    whose draws are its own (seeded or greedy). The unseeded calls run too, sharing the
    batches, but are not returned: they draw from the engine's one generator, a draw per step
    for the rows in it, so what they sample depends on which rows share their steps, and that
    on how long each step and each tool pause took (it differed between a fused and a module
    pass on an AVX-512 machine)."""
    engine = HFEngine(
        model,
        -1,
        max_batch=3,
        seed=5,
        kv_cache=kv_cache,
        admission=admission,
        fused=fused,
        threads=threads,
    )

    def unseeded(key):  # its three turns; the call after its release is seeded
        return key % 3 == 1

    async def one(key, prompt):
        outs = []
        for turn in range(3):
            feed = prompt if turn == 0 else [3 + key, 4, 5][: 1 + (key + turn) % 3]
            seed = None if unseeded(key) else 10 * key + turn
            temperature = 0.0 if key == 2 else 1.0
            outs.append(
                await engine.generate(
                    key,
                    feed,
                    max_new_tokens=2 + (key * 3 + turn) % 5,
                    temperature=temperature,
                    seed=seed,
                )
            )
            if (key + turn) % 2:  # a tool call; without one, the next call comes at once
                await asyncio.sleep(0.001)
        engine.release(key)
        again = await engine.generate(key, prompt[:3], max_new_tokens=3, seed=99 + key)
        engine.release(key)
        return outs + [again]

    async def main():
        return await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))

    outs = asyncio.run(main())
    engine.close()
    own = [calls[-1:] if unseeded(key) else calls for key, calls in enumerate(outs)]
    return [(o.ids, o.logprobs) for calls in own for o in calls], engine


@pytest.mark.parametrize("admission", ["continuous", "static"])
def test_slot_cache_samples_the_ids_and_logprobs_of_the_padded_cache(
    tiny_model, tokenizer, admission
):
    prompts = [tokenizer(f"Problem: {i} * {i + 3} - 1\n")["input_ids"][: 4 + i] for i in range(7)]
    slots, engine = _seeded_workload(tiny_model, prompts, "slots", admission)
    padded, _ = _seeded_workload(tiny_model, prompts, "padded", admission)
    assert engine.kv.saves > 0 and engine.kv.loads > 0  # joins and leaves happened
    assert [ids for ids, _ in slots] == [ids for ids, _ in padded]
    gap = max(abs(a - b) for (_, x), (_, y) in zip(slots, padded) for a, b in zip(x, y))
    assert gap < 1e-5


def test_a_thread_cap_runs_the_engines_steps_on_that_many_threads_and_samples_the_same(
    tiny_model, tokenizer
):
    prompts = [tokenizer(f"Problem: {i} * {i + 3} - 1\n")["input_ids"][: 4 + i] for i in range(5)]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        uncapped, _ = _seeded_workload(tiny_model, prompts, "slots")
        capped, _ = _seeded_workload(tiny_model, prompts, "slots", threads=1)
        engine = HFEngine(tiny_model, -1, threads=1)
        asyncio.run(engine.generate(0, prompts[0], max_new_tokens=2))
        # the engine's own thread, where its steps ran, kept the cap; this one is untouched
        assert engine._executor.submit(torch.get_num_threads).result() == 1
        engine.close()
        assert torch.get_num_threads() == 2
        assert [ids for ids, _ in capped] == [ids for ids, _ in uncapped]
        gap = max(abs(a - b) for (_, x), (_, y) in zip(capped, uncapped) for a, b in zip(x, y))
        assert gap < 1e-5
        with pytest.raises(ValueError, match="threads is >= 0"):
            HFEngine(tiny_model, -1, threads=-1)
    finally:
        torch.set_num_threads(before)


def test_slot_cache_keeps_learned_positions_and_eager_attention_right(tokenizer):
    """GPT-2 embeds positions from `position_ids` (a wrong position changes the logits), and
    eager attention takes the additive form of the mask."""
    model = build_model(
        tokenizer, TinyModelSpec(hidden_size=32, layers=2, heads=2, arch="gpt2"), seed=0
    ).eval()
    model.set_attn_implementation("eager")
    prompts = [tokenizer(f"x = {i} ** 2\n")["input_ids"][: 3 + i] for i in range(5)]
    slots, engine = _seeded_workload(model, prompts, "slots")
    padded, _ = _seeded_workload(model, prompts, "padded")
    assert engine.kv_cache == "slots" and model.config._attn_implementation == "eager"
    assert [ids for ids, _ in slots] == [ids for ids, _ in padded]
    gap = max(abs(a - b) for (_, x), (_, y) in zip(slots, padded) for a, b in zip(x, y))
    assert gap < 1e-5


def test_causal_row_mask_lets_each_row_see_its_own_prefix_and_chunk():
    mask = causal_row_mask(torch.tensor([2, 0]), width=2, kv_len=4)
    assert mask.shape == (2, 1, 2, 4)
    assert mask[0, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]  # 2 stored, then 2 fed
    assert mask[1, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]  # nothing stored


def test_slot_cache_refuses_attention_it_does_not_compute(tiny_model):
    tiny_model.config._attn_implementation = "flex_attention"
    try:
        with pytest.raises(ValueError, match="kv_cache='slots' needs full attention"):
            HFEngine(tiny_model, -1, kv_cache="slots")
        assert HFEngine(tiny_model, -1).kv_cache == "padded"  # auto falls back
    finally:
        tiny_model.config._attn_implementation = "sdpa"


def test_a_key_with_a_call_in_flight_refuses_a_second_call(tiny_model, tokenizer):
    prompt = tokenizer("Problem:")["input_ids"]

    async def main():
        engine = HFEngine(tiny_model, -1)
        first = asyncio.create_task(engine.generate("k", prompt, max_new_tokens=3))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already has a call in flight"):
            await engine.generate("k", prompt, max_new_tokens=3)
        out = await first
        engine.close()
        return out

    assert len(asyncio.run(main()).ids) == 3


def test_slot_rows_match_full_forward_when_a_middle_row_feeds_a_chunk():
    """Rows 0 and 2 decode while row 1 feeds a chunk: the decoding rows are not consecutive
    slots, so attention reads them by index instead of as one view. The model shares each
    key/value head between two query heads (grouped-query attention, as Qwen2 models do)."""
    from tirl.backends.kv_slots import SlotRows

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(config).eval()
    seqs = {"a": [5, 6, 7, 8, 9], "b": [10, 11], "c": [12, 13, 14]}
    kv = SlotRows(model, max_rows=4, max_len=64)
    with torch.no_grad():
        kv.arrange(list(seqs), [0, 0, 0], {})
        kv.forward(list(seqs), list(seqs.values()), [0, 0, 0])
        feeds = {"a": [20], "b": [21, 22, 23], "c": [24]}
        past = [len(s) for s in seqs.values()]
        kv.arrange(list(seqs), past, {})
        logits = kv.forward(list(seqs), list(feeds.values()), past)
        for i, key in enumerate(seqs):
            full = torch.tensor([seqs[key] + feeds[key]])
            want = model(input_ids=full).logits[0, -1]
            assert torch.allclose(logits[i], want, atol=1e-5)
    assert kv.forwards == 2  # one pass each step: b's chunk went with a and c's tokens


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_forward_pass_during_a_slot_pass_gets_the_models_own_attention(tiny_model, attention):
    """While a slot pass runs, the model's config names "tirl_slots"; a pass that is not
    ours (another thread) must still get its own attention and its own padding mask."""
    from tirl.backends import kv_slots

    tiny_model.set_attn_implementation(attention)
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad():
        want = tiny_model(input_ids=ids, attention_mask=mask).logits
        kv_slots._ORIGINALS[id(tiny_model.config)] = attention
        tiny_model.config._attn_implementation = kv_slots.ATTENTION_NAME
        try:
            got = tiny_model(input_ids=ids, attention_mask=mask).logits
        finally:
            tiny_model.config._attn_implementation = attention
    assert torch.equal(got[0], want[0]) and torch.equal(got[1, 2:], want[1, 2:])


@pytest.mark.parametrize("kv_cache", ["slots", "padded"])
def test_a_call_whose_stop_function_raised_leaves_its_sequence_whole(tiny_model, kv_cache):
    """The call fails after its second step: its key keeps the prompt and the first sampled
    token (fed at the second step), and a next call continues exactly from there."""
    prompt = [5, 6, 7, 8]

    def stop(ids):
        if len(ids) == 2:
            raise RuntimeError("a broken stop function")
        return False

    async def main():
        engine = HFEngine(tiny_model, -1, kv_cache=kv_cache)
        with pytest.raises(RuntimeError, match="broken stop"):
            await engine.generate("k", prompt, max_new_tokens=5, temperature=0.0, stop=stop)
        out = await engine.generate("k", [9, 10], max_new_tokens=3, temperature=0.0)
        engine.close()
        return out

    out = asyncio.run(main())
    with torch.no_grad():
        first = tiny_model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax().item()
    full = prompt + [first, 9, 10] + out.ids
    ref = _reference_logprobs(tiny_model, full, len(prompt) + 3, out.ids)
    assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 1e-4


@pytest.mark.parametrize("kv_cache", ["slots", "padded"])
def test_a_step_that_failed_after_its_forward_pass_leaves_the_sequence_whole(
    tiny_model, kv_cache, monkeypatch
):
    """Sampling fails after the forward pass cached the fed tokens (as NaN probabilities
    would): the request fails, its key keeps only what it had, and the next call matches a
    full forward pass."""
    prompt, real = [5, 6, 7, 8], torch.multinomial

    def fails_once(*args, **kwargs):
        monkeypatch.setattr(torch, "multinomial", real)
        raise RuntimeError("probability tensor contains nan")

    async def main():
        engine = HFEngine(tiny_model, -1, kv_cache=kv_cache)
        first = await engine.generate("k", prompt, max_new_tokens=2, temperature=0.0)
        monkeypatch.setattr(torch, "multinomial", fails_once)
        with pytest.raises(RuntimeError, match="contains nan"):
            await engine.generate("k", [9, 10], max_new_tokens=3)
        out = await engine.generate("k", [11], max_new_tokens=3, temperature=0.0)
        engine.close()
        return first, out

    first, out = asyncio.run(main())
    full = prompt + first.ids[:1] + [11] + out.ids  # [9, 10] and the unfed token went
    ref = _reference_logprobs(tiny_model, full, len(full) - len(out.ids), out.ids)
    assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 1e-4


def test_slot_engines_on_one_model_in_two_threads_overlap_and_leave_its_attention_as_it_was(
    tiny_model, tokenizer
):
    """Two servers (or router replicas) on one model: their slot passes overlap in time. The
    model's own attention name must come back when both are done, and each thread must get
    what it gets alone (an overlapping pass once left the config on "tirl_slots" for good,
    and the next mask lookup recursed)."""
    import threading

    prompts = [tokenizer(f"Problem: {i} * {i + 3} - 1\n")["input_ids"][: 4 + i] for i in range(7)]
    alone, _ = _seeded_workload(tiny_model, prompts, "slots")
    own = tiny_model.config._attn_implementation
    results = [None, None]

    def work(i):
        results[i] = _seeded_workload(tiny_model, prompts, "slots")[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tiny_model.config._attn_implementation == own
    for got in results:
        assert [ids for ids, _ in got] == [ids for ids, _ in alone]
    after, _ = _seeded_workload(tiny_model, prompts, "padded")  # the model's own attention
    assert [ids for ids, _ in after] == [ids for ids, _ in alone]


# ---------------------------------------------------------------- the fused pass (issue 30)


def _llama(**overrides):
    """A tiny Llama with grouped-query attention, biases in attention and MLP, and a head
    size that is not hidden / heads: every branch the fused pass has."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attention_bias=True,
        mlp_bias=True,
        max_position_embeddings=256,
        **overrides,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("admission", ["continuous", "static"])
def test_fused_pass_samples_the_ids_and_logprobs_of_the_model_modules(
    tiny_model, tokenizer, admission
):
    """Greedy and seeded calls beside unseeded ones, rows joining mid-decode with ragged
    chunks, leaving while their "tool" runs, and released keys: the same ids, log-probs within
    1e-5."""
    prompts = [tokenizer(f"Problem: {i} * {i + 3} - 1\n")["input_ids"][: 4 + i] for i in range(7)]
    fused, engine = _seeded_workload(tiny_model, prompts, "slots", admission, fused=True)
    modules, other = _seeded_workload(tiny_model, prompts, "slots", admission, fused=False)
    assert engine.fused and not other.fused
    assert engine.kv.saves > 0 and engine.kv.loads > 0  # joins and leaves happened
    assert [ids for ids, _ in fused] == [ids for ids, _ in modules]
    gap = max(abs(a - b) for (_, x), (_, y) in zip(fused, modules) for a, b in zip(x, y))
    assert gap < 1e-5


@pytest.mark.parametrize("fused", [True, False])
def test_slot_rows_of_a_llama_match_full_forward_passes(fused):
    """Decode rows and a chunk in one pass, then decode only, on a Llama with GQA and biases."""
    from tirl.backends.fused import FusedSlotForward
    from tirl.backends.kv_slots import SlotRows

    model = _llama()
    seqs = {"a": [5, 6, 7, 8, 9], "b": [10, 11], "c": [12, 13, 14]}
    kv = SlotRows(model, max_rows=4, max_len=64, fused=FusedSlotForward(model) if fused else None)
    assert (kv.fused is not None) is fused
    with torch.no_grad():
        kv.arrange(list(seqs), [0, 0, 0], {})
        kv.forward(list(seqs), list(seqs.values()), [0, 0, 0])
        for feeds in ({"a": [20], "b": [21, 22, 23], "c": [24]}, {"a": [1], "b": [2], "c": [3]}):
            past = [len(s) for s in seqs.values()]
            kv.arrange(list(seqs), past, {})
            logits = kv.forward(list(seqs), list(feeds.values()), past)
            for i, key in enumerate(seqs):
                seqs[key] = seqs[key] + feeds[key]
                want = model(input_ids=torch.tensor([seqs[key]])).logits[0, -1]
                assert torch.allclose(logits[i], want, atol=1e-5)


def test_fused_engine_on_a_llama_samples_what_its_modules_sample():
    model = _llama()
    prompts = [[3 + i, 4, 5, 6 + i, 7][: 2 + i] for i in range(6)]
    fused, engine = _seeded_workload(model, prompts, "slots", fused=True)
    modules, _ = _seeded_workload(model, prompts, "slots", fused=False)
    assert engine.fused
    assert [ids for ids, _ in fused] == [ids for ids, _ in modules]
    gap = max(abs(a - b) for (_, x), (_, y) in zip(fused, modules) for a, b in zip(x, y))
    assert gap < 1e-5


def test_fused_pass_uses_weights_changed_in_place_and_loaded(tiny_model, tokenizer):
    """The concatenated q/k/v and gate/up weights follow an optimizer step (in place), a
    `load_weights` from another model and replaced parameters: each call matches a full
    forward of the weights then."""
    model = build_model(
        tokenizer, TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256), seed=0
    ).eval()
    other = build_model(
        tokenizer, TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256), seed=1
    )
    prompt = tokenizer("Problem: Compute 12 * 34.\n")["input_ids"]

    async def call(engine, key):
        out = await engine.generate(key, prompt, max_new_tokens=4, temperature=0.0)
        ref = _reference_logprobs(model, prompt + out.ids, len(prompt), out.ids)
        return max(abs(a - b) for a, b in zip(ref, out.logprobs)), out.logprobs

    async def main():
        engine = HFEngine(model, -1, seed=0)
        assert engine.fused
        gaps, logprobs = [], []
        for key, change in enumerate((None, "step", "load", "replace")):
            if change == "step":
                with torch.no_grad():  # what an optimizer step does: every parameter, in place
                    for p in model.parameters():
                        p.add_(torch.randn_like(p) * 0.05)
            elif change == "load":
                await engine.load_weights(other)
            elif change == "replace":  # a new Parameter object, not a write into the old one
                for proj in (
                    model.model.layers[0].mlp.down_proj,
                    model.model.layers[1].self_attn.k_proj,
                ):
                    proj.weight = torch.nn.Parameter(proj.weight.detach() * 2)
            gap, out = await call(engine, key)
            gaps.append(gap)
            logprobs.append(out)
        engine.close()
        return gaps, logprobs

    gaps, logprobs = asyncio.run(main())
    assert max(gaps) < 1e-4
    assert len({tuple(x) for x in logprobs}) == 4  # each change did change the numbers


def test_models_without_a_fused_pass_fall_back_to_their_modules(tiny_model, tokenizer):
    """GPT-2 has no fused pass, nor does a model with hooks on its modules: `fused=None` (the
    default) runs their modules; `fused=True` refuses; `fused=False` turns it off."""
    gpt2 = build_model(
        tokenizer, TinyModelSpec(hidden_size=32, layers=2, heads=2, arch="gpt2"), seed=0
    ).eval()
    engine = HFEngine(gpt2, -1)
    assert engine.kv_cache == "slots" and not engine.fused and engine.kv.fused is None
    with pytest.raises(ValueError, match="no fused pass for this model: GPT2LMHeadModel"):
        HFEngine(gpt2, -1, fused=True)
    with pytest.raises(ValueError, match="fused=True needs kv_cache='slots'"):
        HFEngine(tiny_model, -1, kv_cache="padded", fused=True)
    assert HFEngine(tiny_model, -1).fused and not HFEngine(tiny_model, -1, fused=False).fused
    handle = tiny_model.model.layers[0].register_forward_hook(lambda *args: None)
    try:
        assert not HFEngine(tiny_model, -1).fused
    finally:
        handle.remove()
    prompt = tokenizer("x = 2 ** 5\n")["input_ids"]

    async def main():
        out = await engine.generate("k", prompt, max_new_tokens=4, temperature=0.0)
        engine.close()
        return out

    out = asyncio.run(main())  # GPT-2 through its modules: still the full forward's numbers
    ref = _reference_logprobs(gpt2, prompt + out.ids, len(prompt), out.ids)
    assert max(abs(a - b) for a, b in zip(ref, out.logprobs)) < 1e-4


def test_fused_tool_trajectories_are_those_of_the_modules_and_score_as_the_trainer_does(
    scripted_model, tokenizer
):
    """Seeded rollouts with real sandbox calls (an error, a timeout, printed output): the
    fused pass samples the trajectories the model's modules sample, and the trainer's own
    forward pass scores every sampled token as the sampler did."""
    from conftest import CODES

    from tirl.protocol.segments import SegmentKind
    from tirl.rollout.runner import Rollout, RolloutSettings
    from tirl.sandbox import Sandbox, SandboxLimits
    from tirl.train.batch import collate, token_logprobs

    prompts = list(CODES) * 2
    settings = RolloutSettings(max_model_tokens=40, tool_budget=2, temperature=1.0)

    def rollouts(fused: bool):
        async def main():
            async with Sandbox(SandboxLimits(timeout_s=0.5)) as sandbox:
                engine = HFEngine(scripted_model, tokenizer.eos_token_id, seed=0, fused=fused)
                metas = [{"seed": i} for i in range(len(prompts))]
                trajs = await Rollout(engine, tokenizer, sandbox).run_many(prompts, settings, metas)
                engine.close()
                return trajs

        return asyncio.run(main())

    fused, modules = rollouts(True), rollouts(False)
    assert any(t.tool_calls for t in fused)
    assert [t.ids for t in fused] == [t.ids for t in modules]
    batch = collate(fused, tokenizer.pad_token_id)
    other = collate(modules, tokenizer.pad_token_id)
    gap = ((batch.sampler_logprobs - other.sampler_logprobs).abs() * batch.loss_mask).max()
    assert gap.item() < 1e-5
    with torch.no_grad():
        logprobs, _ = token_logprobs(scripted_model, batch)
    assert ((logprobs - batch.sampler_logprobs).abs() * batch.loss_mask).max().item() < 1e-4
    assert all(s.kind is not SegmentKind.TOOL or s.ids for t in fused for s in t.segments)


def test_fused_pass_in_bfloat16_samples_what_the_modules_sample(tokenizer):
    """Weights held in bf16: the fused pass casts where the modules do (norms in float32)."""
    spec = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256)
    model = build_model(tokenizer, spec, seed=0, dtype="bf16").eval()
    prompts = [tokenizer(f"Problem: {i} * {i + 3} - 1\n")["input_ids"][: 4 + i] for i in range(5)]
    fused, engine = _seeded_workload(model, prompts, "slots", fused=True)
    modules, _ = _seeded_workload(model, prompts, "slots", fused=False)
    assert engine.fused and model.dtype == torch.bfloat16
    assert [ids for ids, _ in fused] == [ids for ids, _ in modules]
    gap = max(abs(a - b) for (_, x), (_, y) in zip(fused, modules) for a, b in zip(x, y))
    assert gap < 1e-5
