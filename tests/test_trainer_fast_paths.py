"""The RL step's fast paths (issue 30): passes cut to their longest row and planned by a token
budget, the sampler's log-probs as pi_old where they are the trainer's, and sampling of the
next step overlapped with the update (one step off-policy). Each must train on what the slow
path trains on, or, for the overlap, on what it says it does."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
import torch
from dist_update_worker import small_model
from rl_trainer import rl_trainer
from test_trainer import _train, synthetic_batch
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


def test_tirl_train_runs_one_step_off_policy_end_to_end(tmp_path: Path):
    cmd = train_cmd(tmp_path, "overlap", "rl.one_step_off_policy=true")
    done = run(cmd)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "overlap" / "metrics.jsonl").open()]
    rl = [r for r in records if r.get("phase") == "rl"]
    assert [r["step"] for r in rl] == list(range(RL_STEPS))
    assert all("rl/staleness_mean" in r for r in rl if r["train/updated"])


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
