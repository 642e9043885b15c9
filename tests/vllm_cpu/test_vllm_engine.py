"""`VLLMEngine` against the real vLLM (CPU build) and `HFEngine` on the same weights: the same
greedy ids in float32, the same log-probabilities, the same trajectories through the real
sandbox in both protocols with plain and chat prompts, partial rollouts, cancellation, and the
weights the trainer pushes after an update."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from conftest import SOURCE, STYLES, prompts, renderer

from tirl.backends.engine import WeightPushError
from tirl.backends.hf import HFEngine
from tirl.protocol import get_protocol
from tirl.rollout.runner import PartialRollout, Rollout, RolloutSettings
from tirl.train.batch import collate, token_logprobs

FP32_LOGPROB_TOL = 1e-4  # measured: max |delta| ~1e-6 on this model


async def _generate_all(engine, ids_list, **kw):
    keys = [object() for _ in ids_list]
    outs = await asyncio.gather(*(engine.generate(k, ids, **kw) for k, ids in zip(keys, ids_list)))
    for k in keys:
        engine.release(k)
    return outs


def _trainer_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """What the trainer computes for the sampled `ids` after `prompt`."""
    with torch.no_grad():
        full = torch.tensor([prompt + ids])
        logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]


def test_greedy_ids_equal_hf_in_float32(runner, engine, hf_engine, tokenizer):
    batch = prompts(tokenizer, "cir_fences", False, 32)
    kw = dict(max_new_tokens=48, temperature=0.0)
    ours = runner.run(_generate_all(engine, batch, **kw))
    theirs = runner.run(_generate_all(hf_engine, batch, **kw))
    assert [o.ids for o in ours] == [t.ids for t in theirs]
    assert [o.finish_reason for o in ours] == [t.finish_reason for t in theirs]
    gap = max(abs(a - b) for o, t in zip(ours, theirs) for a, b in zip(o.logprobs, t.logprobs))
    assert gap < FP32_LOGPROB_TOL


def test_sampled_log_probs_are_the_trainers(runner, engine, policy, tokenizer):
    batch = prompts(tokenizer, "agentmath_tags", True, 16)
    outs = runner.run(_generate_all(engine, batch, max_new_tokens=40, temperature=1.0, seed=7))
    gaps = [
        (torch.tensor(o.logprobs) - _trainer_logprobs(policy, p, o.ids)).abs().max().item()
        for p, o in zip(batch, outs)
    ]
    assert max(gaps) < FP32_LOGPROB_TOL
    # seeded sampling is reproducible
    again = runner.run(_generate_all(engine, batch, max_new_tokens=40, temperature=1.0, seed=7))
    assert [o.ids for o in again] == [o.ids for o in outs]


@pytest.mark.parametrize(("protocol", "chat"), STYLES, ids=lambda v: str(v))
def test_tool_rollouts_equal_hf_in_both_protocols_plain_and_chat(
    runner, engine, hf_engine, sandbox, tokenizer, protocol, chat
):
    settings = RolloutSettings(
        max_model_tokens=64, tool_budget=2, temperature=0.0, protocol=get_protocol(protocol)
    )
    r = renderer(tokenizer, protocol, chat)
    batch = [r.prompt_ids(SOURCE.item("test", i).problem) for i in range(12)]

    async def run(eng):
        return await Rollout(eng, tokenizer, sandbox).run_many(batch, settings)

    ours, theirs = runner.run(run(engine)), runner.run(run(hf_engine))
    assert [t.ids for t in ours] == [t.ids for t in theirs]
    assert [[s.kind for s in t.segments] for t in ours] == [
        [s.kind for s in t.segments] for t in theirs
    ]
    calls = [c for t in ours for c in t.tool_calls]
    assert calls and all(c.status == "ok" for c in calls)  # the boundary was found, code ran
    assert sum(t.finish_reason == "stop" for t in ours) >= len(ours) // 2  # answers end at eos


def test_partial_rollouts_resume_to_the_whole_trajectory(runner, engine, sandbox, tokenizer):
    """A trajectory sampled in segments of 8 model tokens (re-prefilled each time) is the
    trajectory sampled in one go, under the same weights."""
    batch = prompts(tokenizer, "cir_fences", False, 6)
    whole = RolloutSettings(max_model_tokens=48, tool_budget=2, temperature=0.0)
    parts = RolloutSettings(max_model_tokens=48, tool_budget=2, temperature=0.0, segment_tokens=8)

    async def segmented():
        rollout = Rollout(engine, tokenizer, sandbox)
        states = [await rollout.start(p, parts) for p in batch]
        rounds = 0
        while any(isinstance(s, PartialRollout) for s in states):
            states = [
                await rollout.resume(s, parts) if isinstance(s, PartialRollout) else s
                for s in states
            ]
            rounds += 1
        return states, rounds

    one_go = runner.run(Rollout(engine, tokenizer, sandbox).run_many(batch, whole))
    pieces, rounds = runner.run(segmented())
    assert rounds >= 2
    assert [t.ids for t in pieces] == [t.ids for t in one_go]


def test_unseeded_samples_of_one_prompt_are_independent(runner, engine, tokenizer):
    """avg@k draws k samples of a prompt with no seed of their own: they must not all be the
    same draw (the engine's seed starts a stream of request seeds)."""
    prompt = prompts(tokenizer, "cir_fences", False, 1)[0]
    outs = runner.run(_generate_all(engine, [prompt] * 8, max_new_tokens=24, temperature=1.0))
    assert len({tuple(o.ids) for o in outs}) > 1


def test_many_seeded_requests_with_long_prompts_are_served(runner, engine, tokenizer):
    """More prompt tokens at once than one step's default budget: vLLM's CPU runner would
    prefill them in chunks and die on the seeded ones (the engine turns chunking off)."""
    problems = [SOURCE.item("train", i).problem for i in range(400)]
    r = renderer(tokenizer, "cir_fences", False)
    long = [r.prompt_ids(" ".join(problems[6 * i : 6 * i + 6])) for i in range(64)]
    assert sum(map(len, long)) > 4096
    kw = dict(max_new_tokens=16, temperature=1.0, seed=11)
    first = runner.run(_generate_all(engine, long, **kw))
    again = runner.run(_generate_all(engine, long, **kw))
    assert [o.ids for o in first] == [o.ids for o in again]
    assert all(o.ids for o in first)


def test_a_cancelled_request_leaves_the_engine_serving(
    runner, engine, hf_engine, tokenizer, monkeypatch
):
    batch = prompts(tokenizer, "cir_fences", False, 4)
    streaming = asyncio.Event()
    serve = engine.llm.generate

    async def watched(*args, **kwargs):  # vLLM's stream, noting its first output
        async for out in serve(*args, **kwargs):
            streaming.set()
            yield out

    monkeypatch.setattr(engine.llm, "generate", watched)

    async def cancel_one():
        task = asyncio.create_task(
            engine.generate("doomed", batch[0], max_new_tokens=200, temperature=1.0, seed=1)
        )
        # cancelled mid-stream: not after a fixed pause, which a fast CPU outran (the whole
        # completion was done within 50 ms, and the cancel came too late to cancel anything)
        first = asyncio.create_task(streaming.wait())
        await asyncio.wait([first, task], return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        assert not task.done(), "the request ended before any output came"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        engine.release("doomed")

    runner.run(cancel_one())
    kw = dict(max_new_tokens=32, temperature=0.0)
    after = runner.run(_generate_all(engine, batch, **kw))
    assert [o.ids for o in after] == [
        t.ids for t in runner.run(_generate_all(hf_engine, batch, **kw))
    ]


def test_after_a_weight_push_greedy_equals_hf_on_the_new_weights(runner, engine, policy, tokenizer):
    batch = prompts(tokenizer, "cir_fences", False, 16)
    kw = dict(max_new_tokens=40, temperature=0.0)
    before = runner.run(_generate_all(engine, batch, **kw))  # fills the prefix cache
    updated = copy.deepcopy(policy)
    with torch.no_grad():  # a step's worth of change: different greedy outputs
        for p in updated.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    reference = HFEngine(updated, tokenizer.eos_token_id, max_batch=16, seed=0)
    try:
        runner.run(engine.load_weights(updated))
        after = runner.run(_generate_all(engine, batch, **kw))
        expected = runner.run(_generate_all(reference, batch, **kw))
    finally:
        reference.close()
        runner.run(engine.load_weights(policy))  # the next module's tests start from policy
    assert [o.ids for o in after] == [e.ids for e in expected]
    assert [o.ids for o in after] != [b.ids for b in before]


def test_collated_sampler_log_probs_match_the_trainer_on_tool_trajectories(
    runner, engine, sandbox, policy, tokenizer
):
    """Over whole trajectories (tool tokens between model segments), the sampler's log-probs
    that training collates sit on the model tokens and equal the trainer's there."""
    batch = prompts(tokenizer, "agentmath_tags", False, 8)
    settings = RolloutSettings(
        max_model_tokens=64, tool_budget=2, temperature=1.0, protocol=get_protocol("agentmath_tags")
    )
    trajs = runner.run(Rollout(engine, tokenizer, sandbox).run_many(batch, settings))
    tokens = collate(trajs, tokenizer.pad_token_id)
    with torch.no_grad():
        trainer, _ = token_logprobs(policy, tokens)
    sampled = tokens.sampled.bool()
    assert sampled.sum() > 0 and (tokens.sampled <= tokens.loss_mask).all()
    gap = (trainer - tokens.sampler_logprobs)[sampled].abs().max().item()
    assert gap < FP32_LOGPROB_TOL


def test_a_push_vllm_cannot_take_is_one_line_and_names_it(runner, engine, tokenizer):
    """Last in the module: a reload of the wrong shapes takes vLLM's engine down with it,
    which is why a failed push stops the run instead of sampling on."""
    from tirl.models.tiny import TinyModelSpec, build_model

    other = build_model(tokenizer, TinyModelSpec(hidden_size=32, layers=2, heads=2), seed=1)
    with pytest.raises(WeightPushError) as failed:
        runner.run(engine.load_weights(other))
    message = str(failed.value)
    assert message.startswith("vLLM did not take the new weights (") and "\n" not in message
