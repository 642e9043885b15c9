"""The RL step's fast paths (issue 30): passes cut to their longest row and planned by a token
budget, the sampler's log-probs as pi_old where they are the trainer's, and sampling of the
next steps overlapped with the updates (async RL with a staleness bound k, issue 47; one step
off-policy is k = 1). Each must train on what the slow path trains on, or, for the overlap, on
what it says it does."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path

import pytest
import torch
from dist_update_worker import small_model
from rl_trainer import rl_trainer
from test_trainer import _train, synthetic_batch, varied_reward
from tiny_run import RL_STEPS, run, train_cmd

from tirl.backends.hf import HFEngine
from tirl.backends.openai import OpenAIEngine
from tirl.config import ConfigError, load_config
from tirl.rollout.runner import Rollout
from tirl.run.config import RLConfig, RunConfig
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.batch import collate, token_logprobs
from tirl.train.capabilities import probe_capabilities
from tirl.train.learner import old_logprobs_from_sampler
from tirl.train.metrics import MetricsLogger
from tirl.train.update import Shard, batch_logprobs, shard_micro_batches, token_budget_runs

ARITHMETIC = ArithmeticSource()


def test_token_budget_runs_take_the_longest_rows_first_within_the_budget():
    lengths = torch.tensor([5, 9, 3, 9, 2, 4])
    ordered = lengths.argsort(descending=True, stable=True)  # rows 1, 3, 0, 5, 2, 4
    runs = token_budget_runs(ordered, lengths, 20)
    # 2 rows of 9 (18 <= 20), then 4 rows padded to 5 (20), nothing left
    assert [r.tolist() for r in runs] == [[1, 3], [0, 5, 2, 4]]
    # a row longer than the budget runs alone
    assert [r.tolist() for r in token_budget_runs(ordered, lengths, 8)][:2] == [[1], [3]]


def test_micro_batches_are_planned_over_the_minibatch_then_sharded_evenly():
    lengths = torch.tensor([7, 1, 6, 2, 5, 3, 4])
    rows = torch.arange(7)
    one = shard_micro_batches(rows, lengths, 3, Shard())
    assert [m.tolist() for m in one] == [[0, 2, 4], [6, 5], [3, 1]]  # sorted, near-equal
    ranks = [shard_micro_batches(rows, lengths, 0, Shard(r, 2), tokens=10) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1])  # FSDP: every rank runs as many passes
    seen = sorted(int(x) for plan in ranks for m in plan for x in m)
    assert seen == list(range(7))  # every row once


def test_passes_cut_to_their_longest_row_give_the_full_width_log_probs():
    torch.manual_seed(0)
    model = small_model().eval()
    batch = collate(synthetic_batch(groups=3, group_size=3), pad_id=0)
    with torch.no_grad():
        full = token_logprobs(model, batch)[0]  # one pass, padded to the batch's longest
    for micro, tokens in ((0, 0), (2, 0), (0, 16)):
        cut = batch_logprobs(model, batch, micro, tokens)
        scored = (batch.loss_mask + batch.sampled) > 0  # the positions a loss or gap reads
        torch.testing.assert_close(cut[scored], full[scored], atol=1e-5, rtol=0)


def test_auto_takes_the_samplers_log_probs_only_where_they_are_the_trainers(tiny_model):
    hf = HFEngine(tiny_model, eos_id=0)
    ours = probe_capabilities(hf, tiny_model)  # its log-probs are the trainer's numbers
    server = probe_capabilities(OpenAIEngine, tiny_model)  # a server's numbers
    auto = RLConfig()
    assert old_logprobs_from_sampler(auto, ours, partial=False)
    assert not old_logprobs_from_sampler(auto, ours, partial=True)  # several policy versions
    assert not old_logprobs_from_sampler(RLConfig(tis_cap=2.0), ours, partial=False)
    assert not old_logprobs_from_sampler(RLConfig(old_logprobs="trainer"), ours, partial=False)
    assert not old_logprobs_from_sampler(auto, server, partial=False)
    assert old_logprobs_from_sampler(RLConfig(old_logprobs="sampler"), server, False)
    # a stale batch: pi_old is the behaviour policy, the sampler's own numbers; with a cap,
    # the trainer recomputes the proximal policy (AReaL's decoupled PPO)
    assert old_logprobs_from_sampler(RLConfig(off_policy_steps=2), ours, partial=False)
    assert old_logprobs_from_sampler(RLConfig(one_step_off_policy=True), ours, False)
    stale_capped = RLConfig(off_policy_steps=2, tis_cap=2.0)
    assert not old_logprobs_from_sampler(stale_capped, ours, partial=False)
    hf.close()


OVERLAP = RLConfig(
    steps=4, prompts_per_step=2, group_size=3, max_model_tokens=20, lr=1e-3,
    one_step_off_policy=True, checkpoint_every=2,
)  # fmt: skip


def test_one_step_off_policy_trains_each_batch_one_update_stale_and_resumes_exactly(
    tokenizer, tiny_model, tmp_path
):
    def train(run_dir, until=None, resume=False):
        engine_model = copy.deepcopy(tiny_model)  # the engine samples a copy (tirl train's)
        records = asyncio.run(
            _train(tiny_model, tokenizer, None, OVERLAP, run_dir, until, resume, engine_model)
        )
        return records, engine_model.state_dict()

    start = copy.deepcopy(tiny_model.state_dict())
    torch.manual_seed(5)
    straight, sampled = train(tmp_path / "a")
    trained = copy.deepcopy(tiny_model.state_dict())

    assert [r["step"] for r in straight] == [0, 1, 2, 3]  # logged in order, once each
    assert all(r["train/updated"] == 1 and "actor/pg_loss" in r for r in straight)
    assert [r["train/updates"] for r in straight] == [1, 2, 3, 4]
    # step 0 samples the start; each later step is sampled while the previous one updated,
    # except right after the checkpoint at step 2, where the run waits for the update
    assert [r["rl/staleness_max"] for r in straight] == [0.0, 1.0, 0.0, 1.0]
    assert any(r["actor/grad_norm"] > 0 for r in straight)
    for key, value in trained.items():  # the engine got the last update's weights
        assert torch.equal(sampled[key], value)

    tiny_model.load_state_dict(start)
    torch.manual_seed(5)
    train(tmp_path / "b", until=2)
    tiny_model.load_state_dict(start)
    torch.manual_seed(123)
    resumed, _ = train(tmp_path / "b", resume=True)
    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    for a, b in zip(straight, resumed):
        assert a["train/reward_mean"] == b["train/reward_mean"]
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], abs=1e-6)
    for key, value in trained.items():
        torch.testing.assert_close(tiny_model.state_dict()[key], value, atol=1e-6, rtol=0)


def test_one_step_off_policy_refuses_an_engine_on_the_trained_model(tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer.eos_token_id)
    with pytest.raises(ConfigError, match="copy of the"):
        rl_trainer(
            tiny_model,
            OVERLAP,
            Rollout(engine, tokenizer, None),
            lambda i: None,
            pad_id=0,
            use_tools=False,
        )
    engine.close()


def test_one_step_off_policy_with_partial_rollouts_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="rl.one_step_off_policy") as err:
        load_config(RunConfig, overrides=["rl.one_step_off_policy=true", "rl.segment_tokens=8"])
    assert "\n" not in str(err.value)


def test_one_step_off_policy_is_shorthand_for_k_1_and_a_conflict_is_one_line():
    assert load_config(RunConfig, overrides=["rl.one_step_off_policy=true"]).rl.staleness_bound == 1
    both = ["rl.one_step_off_policy=true", "rl.off_policy_steps=1"]
    assert load_config(RunConfig, overrides=both).rl.staleness_bound == 1  # they agree
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, overrides=["rl.one_step_off_policy=true", "rl.off_policy_steps=3"])
    line = str(err.value)
    assert "\n" not in line and "rl.one_step_off_policy" in line and "rl.off_policy_steps" in line
    with pytest.raises(ConfigError, match="rl.off_policy_steps does not combine") as err:
        load_config(RunConfig, overrides=["rl.off_policy_steps=2", "rl.segment_tool_calls=1"])
    assert "\n" not in str(err.value)


def _clone(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def async_run(model, tokenizer, cfg, run_dir, *, until=None, resume=False, slow_s=0.0):
    """RL steps without tools, the HF engine on a copy that the trainer pushes into, each
    optimizer step made `slow_s` slower by a hook on the trainer's optimizer (so a running
    update holds a half-updated model that long). Returns the log's records, what each push
    handed the engine (the updates finished then, the weights, whether an update was running)
    and the weights each update left when it finished."""
    finished: list[dict] = []
    pushes: list[tuple[int, dict, bool]] = []

    async def go():
        engine = HFEngine(copy.deepcopy(model), tokenizer.eos_token_id, seed=0)
        logger = MetricsLogger(run_dir / "metrics.jsonl")
        trainer = rl_trainer(
            model, cfg, Rollout(engine, tokenizer, None), lambda i: ARITHMETIC.item("train", i),
            pad_id=tokenizer.pad_token_id, logger=logger, reward_fn=varied_reward,
            use_tools=False,
        )  # fmt: skip
        step, learn, load = trainer.optim.step, trainer.learn, engine.load_weights

        def slow_step():
            norm = step()
            time.sleep(slow_s)
            return norm

        def recorded_learn(*args):
            metrics = learn(*args)
            finished.append(_clone(model))  # in the worker, before the next update starts
            return metrics

        async def recorded_load(source):
            await asyncio.sleep(slow_s)  # the next update's first optimizer step happens here
            running = any(p.update is not None and not p.update.done() for p in trainer.pending)
            pushes.append((trainer.state.updates, _clone(source), running))
            await load(source)

        trainer.optim.step, trainer.learn, engine.load_weights = (
            slow_step, recorded_learn, recorded_load,
        )  # fmt: skip
        if resume:
            trainer.load_checkpoint(run_dir / "ckpt")
        await trainer.train(until=until, checkpoint_dir=run_dir / "ckpt")
        logger.close()
        engine.close()

    asyncio.run(go())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return records, pushes, finished


@pytest.mark.parametrize("k", [2, 4])
def test_every_batch_is_at_most_k_updates_stale_and_slow_updates_reach_k(
    k, tokenizer, tiny_model, tmp_path
):
    cfg = RLConfig(
        steps=k + 3, prompts_per_step=2, group_size=2, max_model_tokens=12, lr=1e-3,
        off_policy_steps=k,
    )  # fmt: skip
    torch.manual_seed(0)
    records, pushes, finished = async_run(tiny_model, tokenizer, cfg, tmp_path, slow_s=0.05)

    assert [r["step"] for r in records] == list(range(k + 3))  # logged in order, once each
    assert [r["train/updates"] for r in records] == list(range(1, k + 4))
    lags = [r["rl/staleness_max"] for r in records]
    assert all(r["rl/staleness_mean"] <= k for r in records)
    # the first steps sample the start while the first updates queue, then the bound holds
    assert lags == [*range(k), k, k, k]
    # the engine got each finished update's weights, never a model halfway through one,
    # though the next update was running during the pushes
    # one push a step once k updates are pending, then one for the rest at the end
    assert [n for n, _, _ in pushes] == [1, 2, 3, k + 3]
    assert any(running for _, _, running in pushes)
    for n, weights, _ in pushes:
        for key, value in finished[n - 1].items():
            assert torch.equal(weights[key], value), (n, key)


def test_k_2_resumes_exactly_where_an_uninterrupted_run_goes(tokenizer, tiny_model, tmp_path):
    cfg = RLConfig(
        steps=6, prompts_per_step=2, group_size=3, max_model_tokens=20, lr=1e-3,
        off_policy_steps=2, checkpoint_every=3,
    )  # fmt: skip
    start = copy.deepcopy(tiny_model.state_dict())
    torch.manual_seed(5)
    straight, _, _ = async_run(tiny_model, tokenizer, cfg, tmp_path / "a")
    trained = copy.deepcopy(tiny_model.state_dict())
    # the checkpoint at step 3 finishes every pending update: the lag starts over after it
    assert [r["rl/staleness_max"] for r in straight] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]

    tiny_model.load_state_dict(start)
    torch.manual_seed(5)
    async_run(tiny_model, tokenizer, cfg, tmp_path / "b", until=3)
    tiny_model.load_state_dict(start)  # a new process starts from the initial policy
    torch.manual_seed(123)  # whatever the new process's RNG is, the checkpoint's wins
    resumed, _, _ = async_run(tiny_model, tokenizer, cfg, tmp_path / "b", resume=True)
    assert [r["step"] for r in resumed] == list(range(6))
    for a, b in zip(straight, resumed):
        assert a["train/reward_mean"] == b["train/reward_mean"]
        assert a["rl/staleness_max"] == b["rl/staleness_max"]
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], abs=1e-6)
    for key, value in trained.items():
        torch.testing.assert_close(tiny_model.state_dict()[key], value, atol=1e-6, rtol=0)


def test_tirl_train_runs_async_rl_end_to_end(tmp_path: Path):
    cmd = train_cmd(tmp_path, "overlap", "rl.off_policy_steps=2")
    done = run(cmd)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "overlap" / "metrics.jsonl").open()]
    rl = [r for r in records if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == list(range(RL_STEPS))
    assert all(r["rl/staleness_max"] <= 2 for r in rl if r["train/updated"])


def test_only_the_positions_a_row_trains_on_or_sampled_cost_logits(tokenizer):
    """The leading positions no row needs get no logits (`logits_to_keep`): the log-probs
    and entropies of every needed position are those of the full pass, the others are 0."""
    from tirl.models.tiny import TinyModelSpec, build_model

    model = build_model(tokenizer, TinyModelSpec(hidden_size=32, layers=2, heads=2), 0).eval()
    batch = collate(synthetic_batch(groups=2, group_size=3), pad_id=0)
    calls = []
    model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw.get("logits_to_keep")),
                                    with_kwargs=True)  # fmt: skip
    with torch.no_grad():
        lp, ent = token_logprobs(model, batch, with_entropy=True)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_p = torch.log_softmax(logits[:, :-1].float(), -1)
    want = log_p.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    scored = (batch.loss_mask + batch.sampled) > 0
    first = int(scored.any(0).nonzero()[0])
    assert first > 0 and calls[0] == batch.input_ids.shape[1] - first
    torch.testing.assert_close(lp[scored], want[scored], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        ent[scored], -(log_p.exp() * log_p).sum(-1)[scored], atol=1e-5, rtol=0
    )
    assert not lp[:, :first].any() and not ent[:, :first].any()
