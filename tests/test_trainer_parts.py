"""The RL trainer's parts, each on its own (`tirl.train.rl` joins them): the optimizer and its
schedule, the KL reference, the rollout feed, the learner, the checkpoint and the engine's
capabilities. Real tiny models, the real HF engine and sandbox; no stubs."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random

import pytest
import torch
from dist_update_worker import small_model
from rl_trainer import rl_trainer
from test_trainer import synthetic_batch

from tirl.backends.hf import HFEngine
from tirl.backends.openai import OpenAIEngine
from tirl.config import ConfigError
from tirl.protocol import get_protocol
from tirl.rollout.runner import Rollout
from tirl.run.build import phase_settings
from tirl.run.config import RLConfig
from tirl.sandbox import Sandbox
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train import checkpoint
from tirl.train.batch import collate
from tirl.train.capabilities import EngineCapabilities, check_overlap, probe_capabilities
from tirl.train.feed import RolloutFeed
from tirl.train.learner import Learner
from tirl.train.optim import PolicyOptimizer
from tirl.train.reference import reference_logprobs, reference_policy
from tirl.train.update import batch_logprobs

ARITHMETIC = ArithmeticSource()


def seed_parity(traj) -> float:
    return float(traj.meta["seed"] % 2)  # differs inside every group


def backward_some_loss(model) -> None:
    ids = torch.randint(1, 64, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()


# ---------------------------------------------------------------------------- the optimizer


def test_the_learning_rate_warms_up_over_warmup_steps_worth_of_updates_then_stays():
    cfg = RLConfig(lr=1e-3, warmup_steps=2, updates_per_step=2)
    optim = PolicyOptimizer(small_model(), cfg)
    lrs = [optim.lr]
    for _ in range(5):
        optim.step()  # no gradients: AdamW skips every parameter, the schedule still moves
        lrs.append(optim.lr)
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_a_step_clips_the_gradient_and_reports_its_norm_before_clipping():
    torch.manual_seed(0)
    model = small_model()
    optim = PolicyOptimizer(model, RLConfig(max_grad_norm=1e-3))
    backward_some_loss(model)
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert optim.step() == pytest.approx(float(norm), rel=1e-5) and norm > 1e-3
    clipped = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert float(clipped) == pytest.approx(1e-3, rel=1e-3)


def test_only_trainable_parameters_are_optimized():
    model = small_model()
    model.model.embed_tokens.weight.requires_grad_(False)  # frozen, as a LoRA base is
    optim = PolicyOptimizer(model, RLConfig())
    assert len(optim.params) == len(list(model.parameters())) - 1
    assert all(p.requires_grad for p in optim.optimizer.param_groups[0]["params"])


# ---------------------------------------------------------------------------- the reference


def test_no_reference_without_a_kl_term_and_a_frozen_copy_with_one():
    model = small_model()
    assert reference_policy(model, RLConfig(kl_coef=0.0)) is None
    batch = collate(synthetic_batch(groups=2, group_size=2), pad_id=0)
    assert reference_logprobs(None, batch, RLConfig(), torch.device("cpu")) is None

    cfg = RLConfig(kl_coef=0.1, micro_batch_size=2)
    reference = reference_policy(model, cfg)
    before = batch_logprobs(model, batch, 0)
    optim = PolicyOptimizer(model, RLConfig(lr=1e-2))
    backward_some_loss(model)
    optim.step()  # the policy moves, the reference does not
    assert not torch.equal(batch_logprobs(model, batch, 0), before)
    scored = (batch.loss_mask + batch.sampled) > 0
    got = reference_logprobs(reference, batch, cfg, torch.device("cpu"))
    torch.testing.assert_close(got[scored], before[scored], atol=1e-5, rtol=0)
    assert not reference.training


# ---------------------------------------------------------------------------- the rollout feed


def test_the_feed_samples_scores_and_batches_groups_and_its_state_restores(tokenizer, tiny_model):
    cfg = RLConfig(prompts_per_step=2, group_size=3, max_model_tokens=8)
    weights = copy.deepcopy(tiny_model.state_dict())
    settings = phase_settings(
        get_protocol("cir_fences"), 2000, True, max_model_tokens=8, tool_budget=1, temperature=1.0
    )

    async def main():
        async with Sandbox() as sandbox:
            engine = HFEngine(tiny_model, tokenizer.eos_token_id, seed=0)
            feed = RolloutFeed(
                Rollout(engine, tokenizer, sandbox),
                lambda i: ARITHMETIC.item("train", i),
                cfg,
                reward_fn=seed_parity,
            )
            batch, stats = await feed.collect(settings, step=0, policy_version=7)
            engine.close()
            return feed, batch, stats

    feed, batch, stats = asyncio.run(main())
    assert [[t.meta["task"] for t in group] for group in batch] == [[0, 0, 0], [1, 1, 1]]
    for traj in (t for group in batch for t in group):
        assert traj.meta["reward"] == seed_parity(traj)  # scored once, as it finished
        assert traj.meta["policy_version"] == 7 and traj.task_id is not None
    assert stats["batch/fill"] == 1.0 and stats["batch/trajectories_sampled"] == 6
    assert feed.next_task == 2 and feed.ready == []
    assert all(torch.equal(v, tiny_model.state_dict()[k]) for k, v in weights.items())

    feed.ready = batch[1:]  # as a step short of a batch leaves a group waiting
    other = RolloutFeed(None, lambda i: ARITHMETIC.item("train", i), cfg)
    other.load_state_dict(feed.state_dict(), path=None)
    assert other.next_task == 2
    assert [[t.to_dict() for t in g] for g in other.ready] == [[t.to_dict() for t in batch[1]]]


def test_the_feeds_rewards_take_the_overlong_penalty_of_the_limit_they_were_sampled_under():
    trajs = synthetic_batch(groups=1, group_size=4)
    feed = RolloutFeed(None, None, RLConfig(overlong_buffer=4), reward_fn=lambda t: 1.0)
    longest = max(t.num_model_tokens for t in trajs)
    assert feed.rewards_of(trajs, max_tokens=100).tolist() == [1.0] * 4
    assert feed.rewards_of(trajs, max_tokens=longest).min() < 1.0


def test_a_reward_an_agent_program_posted_counts_over_the_configured_one():
    """`rollout.agent` (tirl.apps.agents): a program may post its own reward to the gateway."""
    trajs = synthetic_batch(groups=1, group_size=2)
    trajs[0].meta["posted_reward"] = 0.25
    feed = RolloutFeed(None, lambda i: ARITHMETIC.item("train", i), RLConfig())
    feed.reward_fn = lambda t: -1.0
    feed.score(trajs, max_tokens=100, policy_version=0)
    assert [t.meta["reward"] for t in trajs] == [0.25, -1.0]


# ---------------------------------------------------------------------------- the learner


def learner_for(model, cfg: RLConfig, old_from_sampler: bool = False) -> Learner:
    optim = PolicyOptimizer(model, cfg)
    reference = reference_policy(model, cfg)
    return Learner(model, cfg, optim, reference, pad_id=0, old_from_sampler=old_from_sampler)


def test_the_learner_takes_updates_per_step_optimizer_steps_and_reports_them():
    torch.manual_seed(0)
    trajs = synthetic_batch(groups=3, group_size=3)
    for traj in trajs:
        traj.meta["policy_version"] = 4
    rewards = torch.tensor([float(i % 2) for i in range(len(trajs))])  # spread in every group
    cfg = RLConfig(lr=1e-2, updates_per_step=3, warmup_steps=1, kl_coef=0.1)
    model = small_model()
    start = copy.deepcopy(model.state_dict())
    learner = learner_for(model, cfg)
    m = learner.update(trajs, rewards, torch.randperm(len(trajs)), max_tokens=20, updates=5)
    assert learner.optim.schedule.last_epoch == 3  # one schedule step per optimizer step
    assert m["train/groups"] == 3 and m["actor/grad_norm"] > 0
    assert (m["rl/staleness_mean"], m["rl/staleness_max"]) == (1.0, 1.0)
    assert "mismatch/abs_diff_mean" in m and "actor/kl_ref" in m
    assert not model.training
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in start.items())

    # the sampler's log-probs as pi_old: no scoring pass, so no mismatch to report
    from_sampler = learner_for(small_model(), dataclasses.replace(cfg, kl_coef=0.0), True)
    m = from_sampler.update(trajs, rewards, torch.arange(len(trajs)), max_tokens=20, updates=4)
    assert not any(k.startswith("mismatch/") for k in m) and "actor/kl_ref" not in m


# ---------------------------------------------------------------------------- the checkpoint


def test_save_then_restore_gives_the_same_weights_optimizer_schedule_and_rng(tmp_path):
    torch.manual_seed(0)
    model = small_model()
    optim = PolicyOptimizer(model, RLConfig(lr=1e-2, warmup_steps=3))
    for _ in range(2):
        optim.zero_grad()
        backward_some_loss(model)
        optim.step()
    random.seed(11)
    checkpoint.save(tmp_path, model, optim, {"state": {"step": 2}})
    saved = {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(optim.optimizer.state_dict()),
        "schedule": optim.schedule.state_dict(),
        "torch": torch.rand(3),
        "python": random.random(),
    }

    torch.manual_seed(99)  # a new process: other weights, other RNG, a fresh optimizer
    random.seed(99)
    fresh = small_model()
    fresh_optim = PolicyOptimizer(fresh, RLConfig(lr=1e-2, warmup_steps=3))
    payload = checkpoint.restore(tmp_path, fresh, fresh_optim)
    assert payload["state"] == {"step": 2}
    assert torch.equal(torch.rand(3), saved["torch"]) and random.random() == saved["python"]
    for key, value in saved["model"].items():
        assert torch.equal(fresh.state_dict()[key], value)
    assert fresh_optim.schedule.state_dict() == saved["schedule"]
    assert fresh_optim.lr == optim.lr
    restored = fresh_optim.optimizer.state_dict()

    def hyper(groups):  # the round trip through torch.distributed.checkpoint lists tuples
        return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in groups]

    assert hyper(restored["param_groups"]) == hyper(saved["optimizer"]["param_groups"])
    for index, state in saved["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(restored["state"][index][name], value), (index, name)


def test_restoring_where_nothing_was_saved_says_so(tmp_path):
    model = small_model()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.restore(tmp_path, model, PolicyOptimizer(model, RLConfig()))


# ---------------------------------------------------------------------------- capabilities


def test_the_probe_reads_what_each_engine_offers(tiny_model):
    on_model = HFEngine(tiny_model, eos_id=0)
    on_copy = HFEngine(copy.deepcopy(tiny_model), eos_id=0)
    assert probe_capabilities(on_model, tiny_model) == EngineCapabilities(
        receives_weights=True, logprobs_match_trainer=True, samples_trained_model=True
    )
    assert not probe_capabilities(on_copy, tiny_model).samples_trained_model
    assert probe_capabilities(OpenAIEngine, tiny_model) == EngineCapabilities()
    assert probe_capabilities(None, tiny_model) == EngineCapabilities()
    on_model.close()
    on_copy.close()


@pytest.mark.parametrize(
    "engine, words",
    [
        (EngineCapabilities(samples_trained_model=True), "copy of the"),
        (EngineCapabilities(sleeps_during_update=True), "sleep_during_update"),
    ],
)
@pytest.mark.parametrize(
    "overlap, key",
    [
        (RLConfig(one_step_off_policy=True), "rl.one_step_off_policy"),
        (RLConfig(off_policy_steps=3), "rl.off_policy_steps"),
    ],
)
def test_async_rl_is_refused_where_nothing_may_sample_during_the_update(
    engine, words, overlap, key
):
    with pytest.raises(ConfigError, match=words) as err:
        check_overlap(overlap, None, engine)
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
    check_overlap(RLConfig(), None, engine)  # without the overlap, nothing to refuse
    check_overlap(overlap, None, EngineCapabilities(receives_weights=True))


def test_async_rl_is_refused_under_torch_distributed_naming_its_key():
    with pytest.raises(ConfigError, match="rl.off_policy_steps does not run under torch"):
        check_overlap(RLConfig(off_policy_steps=2), object(), EngineCapabilities())


def test_capabilities_given_to_the_trainer_win_over_the_probe(tokenizer, tiny_model):
    """An engine on a copy that the trainer is told receives no weights keeps its own."""
    sampler = copy.deepcopy(tiny_model)
    engine = HFEngine(sampler, tokenizer.eos_token_id)
    trainer = rl_trainer(
        tiny_model,
        RLConfig(lr=1e-2),
        Rollout(engine, tokenizer, None),
        pad_id=0,
        capabilities=EngineCapabilities(),
    )
    trajs = synthetic_batch(groups=3, group_size=3)
    rewards = torch.tensor([float(i % 2) for i in range(len(trajs))])
    trainer.update(trajs, max_tokens=20, rewards=rewards)
    asyncio.run(trainer.push_weights())
    assert any(not torch.equal(a, b) for a, b in zip(sampler.parameters(), tiny_model.parameters()))
    engine.close()
