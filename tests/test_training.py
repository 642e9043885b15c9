"""Losses on real model outputs: what is trained on, and what never is."""

import asyncio

import pytest
import torch
from rl_trainer import rl_trainer

from tirl.algos.losses import agg_loss, ppo_clip_loss
from tirl.backends.hf import HFEngine
from tirl.config import ConfigError, from_dict
from tirl.protocol.segments import SegmentKind
from tirl.rollout.limits import budget_at
from tirl.rollout.runner import Rollout
from tirl.run.config import RLConfig, SFTConfig
from tirl.sandbox import Sandbox
from tirl.synth.arithmetic import code_demonstrations, demonstration_texts, text_demonstrations
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.batch import collate, token_logprobs
from tirl.train.sft import length_grouped_batches, sft_loss, train_sft

ARITHMETIC = ArithmeticSource()  # the arithmetic items as tirl.tasks.Task


def _demos(env, tokenizer, n=4):
    tasks = env.items("train", n)
    return code_demonstrations(tasks, [t.answer for t in tasks], tokenizer)


def test_loss_mask_is_one_on_model_tokens_only(env, tokenizer):
    (demo,) = _demos(env, tokenizer, 1)
    batch = collate([demo], tokenizer.pad_token_id)
    kinds = [s.kind for s in demo.segments for _ in s.ids][1:]  # targets are shifted by one
    assert batch.loss_mask[0].tolist() == [float(k is SegmentKind.MODEL) for k in kinds]
    unmasked = collate([demo], tokenizer.pad_token_id, mask_tool_output=False)
    assert unmasked.loss_mask[0].tolist() == [float(k is not SegmentKind.PROMPT) for k in kinds]


def test_tool_tokens_contribute_exactly_zero_to_sft_and_rl_losses(env, tokenizer, tiny_model):
    demos = _demos(env, tokenizer)
    batch = collate(demos, tokenizer.pad_token_id)
    tool = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    for row, demo in enumerate(demos):
        kinds = [s.kind for s in demo.segments for _ in s.ids][1:]
        tool[row, : len(kinds)] = torch.tensor([k is SegmentKind.TOOL for k in kinds])
    assert tool.any()

    logprobs, _ = token_logprobs(tiny_model, batch)
    logprobs.retain_grad()
    advantages = torch.where(
        tool, torch.tensor(1e6), torch.tensor(1.0)
    )  # huge where it must not count
    rl_loss, _ = ppo_clip_loss(logprobs, logprobs.detach() - 0.1, advantages, batch.loss_mask)
    nll = agg_loss(-logprobs, batch.loss_mask, "token-mean")
    (rl_loss + nll).backward()

    assert torch.all(logprobs.grad[tool] == 0)
    assert torch.all(logprobs.grad[batch.loss_mask > 0] != 0)
    model_positions = batch.loss_mask > 0
    assert torch.isclose(nll, -logprobs[model_positions].mean())  # denominator: model tokens only
    assert torch.isclose(sft_loss(tiny_model, batch), nll)


def test_sft_learns_the_demonstrations(env, tokenizer, tiny_model):
    demos = _demos(env, tokenizer, 16)
    batch = collate(demos, tokenizer.pad_token_id)
    before = sft_loss(tiny_model, batch).item()
    train_sft(
        tiny_model,
        demos,
        SFTConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=3),
        pad_id=tokenizer.pad_token_id,
        seed=0,
    )
    assert sft_loss(tiny_model, batch).item() < 0.7 * before


def test_length_grouped_batches_draw_the_same_rows_and_pad_less():
    lengths = [
        int(n) for n in torch.randint(10, 200, (500,), generator=torch.Generator().manual_seed(1))
    ]

    def draw(window):
        gen = torch.Generator().manual_seed(7)
        return list(length_grouped_batches(lengths, 16, 21, window, gen))

    plain, grouped = draw(1), draw(8)
    assert len(plain) == len(grouped) == 21 and all(len(b) == 16 for b in plain + grouped)
    # window 1 is the plain stream: one independent uniform draw per step
    gen = torch.Generator().manual_seed(7)
    assert plain == [torch.randint(500, (16,), generator=gen).tolist() for _ in range(21)]
    # the first window's rows are the same uniform draw, only regrouped
    gen = torch.Generator().manual_seed(7)
    first = torch.randint(500, (8 * 16,), generator=gen).tolist()
    assert sorted(first) == sorted(r for b in grouped[:8] for r in b)

    def padded(batches):
        return sum(len(b) * max(lengths[r] for r in b) for b in batches)

    assert padded(grouped) < 0.8 * padded(plain)


def test_micro_batches_sorted_by_length_give_one_batchs_gradient_with_less_padding(
    env, tokenizer, tiny_model
):
    import copy

    from tirl.train.sft import sft_backward

    tasks = env.items("train", 12)
    demos = code_demonstrations(tasks[:6], [t.answer for t in tasks[:6]], tokenizer)
    demos += text_demonstrations(tasks[6:], tokenizer)  # short rows beside long ones
    grads, pads = [], []
    for parts in (1, 3):
        model = copy.deepcopy(tiny_model).train()
        loss, pad = sft_backward(model, demos, tokenizer.pad_token_id, True, parts, "cpu")
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        pads.append(pad)
        if parts == 1:  # one micro-batch is the plain token-mean loss
            batch = collate(demos, tokenizer.pad_token_id)
            assert abs(loss - sft_loss(tiny_model.train(), batch).item()) < 1e-5
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert pads[1] < pads[0] / 2


def test_tis_with_the_samplers_own_log_probs_is_refused():
    with pytest.raises(ConfigError, match="rl.tis_cap"):
        from_dict(RLConfig, {"old_logprobs": "sampler", "tis_cap": 2.0})


def test_budget_schedule_grows_two_three_four():
    schedule = RLConfig().budget_schedule
    assert [budget_at(schedule, f) for f in (0.0, 0.2, 0.34, 0.5, 0.67, 0.99)] == [2, 2, 3, 3, 4, 4]
    assert budget_at([[0, 1]], 0.9) == 1


@pytest.mark.parametrize("old_logprobs", ["trainer", "sampler"])
def test_one_rl_step_updates_the_policy_and_reports(env, tokenizer, tiny_model, old_logprobs):
    cfg = RLConfig(
        steps=4,
        prompts_per_step=2,
        group_size=3,
        max_model_tokens=24,
        lr=1e-3,
        old_logprobs=old_logprobs,
        tis_cap=2.0 if old_logprobs == "trainer" else None,
    )
    before = [p.detach().clone() for p in tiny_model.parameters()]

    async def main():
        async with Sandbox() as sandbox:
            engine = HFEngine(tiny_model, tokenizer.eos_token_id, seed=0)
            trainer = rl_trainer(
                tiny_model,
                cfg,
                Rollout(engine, tokenizer, sandbox),
                lambda i: ARITHMETIC.item("train", i),
                pad_id=tokenizer.pad_token_id,
                variant="code",
            )
            metrics = await trainer.step()
            engine.close()
            return metrics

    metrics = asyncio.run(main())
    assert metrics["rl/budget"] == 2 and metrics["phase"] == "rl"
    if old_logprobs == "trainer":  # it scores the sampled ids as the sampler did
        assert metrics["mismatch/abs_diff_max"] < 1e-4 and metrics["mismatch/kl_k3"] < 1e-8
        assert metrics["mismatch/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    else:  # no scoring pass, nothing to compare
        assert not any(k.startswith("mismatch/") for k in metrics)
    for key in (
        "train/reward_mean",
        "train/accuracy",
        "actor/clip_frac",
        "actor/grad_norm",
        "length/model_tokens_mean",
        "mem/peak_rss_gb",
    ):
        assert key in metrics
    moved = any(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))
    # An untrained model usually fails every sample: groups with equal rewards get zero GRPO
    # advantage, hence zero gradient, and the policy must not move at all.
    assert moved == (metrics["train/uniform_group_share"] < 1)


def test_text_demonstrations_have_no_tool_segment(env, tokenizer):
    (demo,) = text_demonstrations(env.items("train", 1), tokenizer)
    assert [s.kind for s in demo.segments] == [SegmentKind.PROMPT, SegmentKind.MODEL]
    assert demo.segments[-1].ids[-1] == tokenizer.eos_token_id


def test_demonstrations_tokenize_each_segment_on_its_own(env, tokenizer):
    task = env.items("train", 1)[0]
    (demo,) = code_demonstrations([task], [task.answer], tokenizer)
    for seg, (_, text) in zip(demo.segments, demonstration_texts(task, task.answer)):
        assert tokenizer.decode(seg.ids, skip_special_tokens=True) == text


def test_stop_token_demonstrations_have_the_model_write_the_marker(env):
    from tirl.protocol import get_protocol

    task = env.item("train", 0)
    exact = demonstration_texts(task, "42")
    stop = demonstration_texts(task, "42", get_protocol("cir_fences", "stop_token"))
    assert "".join(t for _, t in exact) == "".join(t for _, t in stop)  # same text
    assert stop[1][1].endswith("```output") and not exact[1][1].endswith("```output")
    assert get_protocol("cir_fences", "stop_token").closed_block(stop[1][1]) is not None
