"""The RL trainer's switches: micro-batches and ranks, gloo data parallelism, exact resume,
adaptive batches and multi-stage expansion. Real tiny models, real sandbox, real processes."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from rl_trainer import rl_trainer  # noqa: E402

from tirl.backends.hf import HFEngine
from tirl.config import ConfigError, load_config
from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.rollout.runner import Rollout
from tirl.run.config import RLConfig, RLStage, RunConfig
from tirl.sandbox import Sandbox
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.batch import collate
from tirl.train.distributed import fsdp_policy
from tirl.train.metrics import MetricsLogger
from tirl.train.update import Shard, batch_logprobs, minibatch_loss_backward

sys.path.insert(0, str(Path(__file__).parent))
from dist_update_worker import small_model  # noqa: E402

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

ARITHMETIC = ArithmeticSource()  # the arithmetic items as tirl.tasks.Task


def synthetic_batch(groups: int, group_size: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories shaped like real ones: prompt, model, tool output, model; random ids."""
    g = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> list[int]:
        n = int(torch.randint(lo, hi, (1,), generator=g))
        return torch.randint(1, 64, (n,), generator=g).tolist()

    def model_segment(lo: int, hi: int) -> Segment:
        tokens = ids(lo, hi)
        return Segment(SegmentKind.MODEL, tokens, logprobs=[-1.0] * len(tokens))

    trajs = []
    for task in range(groups):
        for _ in range(group_size):
            segments = [Segment(SegmentKind.PROMPT, ids(3, 6)), model_segment(2, 8)]
            if torch.rand(1, generator=g) < 0.6:  # a tool call, then more model text
                segments += [Segment(SegmentKind.TOOL, ids(2, 6)), model_segment(1, 6)]
            correct = bool(torch.rand(1, generator=g) < 0.5)
            trajs.append(
                Trajectory(segments, meta={"task": task}, score=Score(float(correct), correct))
            )
    return trajs


def grads_after(model, trajs, cfg: RLConfig, shards: list[Shard]) -> list[torch.Tensor]:
    """Gradients of one minibatch holding every row, summed over `shards` (as all-reduce)."""
    trainer = rl_trainer(model, cfg, pad_id=0)
    batch = collate(trajs, 0)
    rewards = trainer.feed.rewards_of(trajs, cfg.max_model_tokens)
    from tirl.algos.advantages import token_advantages

    groups = torch.tensor([t.meta["task"] for t in trajs])
    adv = token_advantages(cfg.advantage, rewards, groups, batch.loss_mask, gamma=cfg.gamma)
    old = batch_logprobs(model, batch, 0) - 0.05  # off-policy enough for some clipping
    model.zero_grad()
    for shard in shards:
        minibatch_loss_backward(
            model, batch, torch.arange(len(trajs)), old, adv, None, cfg, shard, norm_len=20
        )
    return [p.grad.clone() / len(shards) for p in model.parameters()]


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_and_shards_give_the_gradient_of_the_whole_minibatch(agg):
    torch.manual_seed(0)
    model = small_model()
    trajs = synthetic_batch(groups=3, group_size=3)
    base = RLConfig(loss_agg=agg, entropy_coef=0.01)
    whole = grads_after(model, trajs, base, [Shard()])
    micro = grads_after(model, trajs, dataclasses.replace(base, micro_batch_size=2), [Shard()])
    ranks = grads_after(model, trajs, base, [Shard(0, 2), Shard(1, 2)])
    # passes of at most 24 padded tokens, longest rows first, on one process and on two ranks
    budget = dataclasses.replace(base, micro_batch_tokens=24)
    by_tokens = grads_after(model, trajs, budget, [Shard()])
    by_tokens_ranks = grads_after(model, trajs, budget, [Shard(0, 2), Shard(1, 2)])
    for a, *others in zip(whole, micro, ranks, by_tokens, by_tokens_ranks):
        for other in others:
            torch.testing.assert_close(a, other, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in whole)


def with_uniform_groups(trajs: list[Trajectory], uniform: dict[int, bool]) -> list[Trajectory]:
    """`trajs` with every row of the groups in `uniform` scored alike (right or wrong)."""
    return [
        dataclasses.replace(t, score=Score(float(uniform[t.meta["task"]]), uniform[t.meta["task"]]))
        if t.meta["task"] in uniform
        else t
        for t in trajs
    ]


class RowCounter:
    """Counts the rows `model` is run on (forward passes of the update and of batch_logprobs)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows = 0
        model.register_forward_pre_hook(self.count, with_kwargs=True)

    def count(self, module, args, kwargs) -> None:
        ids = args[0] if args else kwargs["input_ids"]
        self.rows += ids.shape[0]


@pytest.mark.parametrize("agg", AGG_MODES)
def test_rows_of_groups_that_scored_alike_are_skipped_with_the_same_gradient(agg):
    """GRPO gives a group that scored alike advantage 0 on every row; those rows add exactly 0
    to the PPO-clip gradient, so the update leaves them out of its passes
    (rl.skip_zero_advantage) and the gradient stays the minibatch's, on micro-batches and on
    two ranks too."""
    torch.manual_seed(0)
    model = small_model()
    trajs = with_uniform_groups(synthetic_batch(groups=4, group_size=3), {0: True, 2: False})
    counter = RowCounter(model)
    for extra in ({}, {"micro_batch_size": 2}, {"micro_batch_tokens": 24}):
        base = RLConfig(loss_agg=agg, entropy_coef=0.0, **extra)
        off = dataclasses.replace(base, skip_zero_advantage=False)
        counter.rows = 0
        full = grads_after(model, trajs, off, [Shard()])
        rows_full = counter.rows
        counter.rows = 0
        skipped = grads_after(model, trajs, base, [Shard()])
        rows_skipped = counter.rows
        ranks = grads_after(model, trajs, base, [Shard(0, 2), Shard(1, 2)])
        for a, b, c in zip(full, skipped, ranks):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(c, a, atol=1e-6, rtol=1e-5)
        # batch_logprobs (pi_old in grads_after) runs all 12 rows either way; the update runs
        # 12 without skipping and the 6 rows of the two mixed groups with it
        assert (rows_full - 12, rows_skipped - 12) == (12, 6), extra
    assert any(g.abs().sum() > 0 for g in full)


def test_a_minibatch_without_any_advantage_still_steps_on_a_zero_gradient():
    """Every group scored alike: one row still runs (weighted 0), so every gradient is an exact
    0 tensor, not None, and Adam steps on it as it would have without the skipping."""
    torch.manual_seed(0)
    model = small_model()
    trajs = with_uniform_groups(synthetic_batch(groups=2, group_size=3), {0: True, 1: False})
    cfg = RLConfig(entropy_coef=0.0)
    grads = grads_after(model, trajs, cfg, [Shard()])
    assert all(g is not None and torch.count_nonzero(g) == 0 for g in grads)
    batch = collate(trajs, 0)
    adv = torch.zeros(batch.loss_mask.shape)
    metrics = minibatch_loss_backward(
        model, batch, torch.arange(len(trajs)), batch_logprobs(model, batch, 0), adv, None, cfg
    )
    assert metrics["actor/trained_row_share"] == 0.0


def test_rows_are_not_skipped_where_a_term_survives_at_zero_advantage():
    """An entropy bonus (or a KL term) is nonzero on every row: nothing is skipped then."""
    torch.manual_seed(0)
    model = small_model()
    trajs = with_uniform_groups(synthetic_batch(groups=3, group_size=3), {0: True})
    batch = collate(trajs, 0)
    groups = torch.tensor([t.meta["task"] for t in trajs])
    rewards = torch.tensor([t.score.reward for t in trajs])
    from tirl.algos.advantages import token_advantages

    adv = token_advantages("grpo", rewards, groups, batch.loss_mask)
    old = batch_logprobs(model, batch, 0)
    rows = torch.arange(len(trajs))
    for cfg, share in ((RLConfig(entropy_coef=0.01), 1.0), (RLConfig(entropy_coef=0.0), 6 / 9)):
        metrics = minibatch_loss_backward(model, batch, rows, old, adv, None, cfg)
        assert metrics["actor/trained_row_share"] == pytest.approx(share)
        assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # a mean, not diluted


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_workers(*jobs: tuple[list, int]) -> None:
    """Run each job (worker arguments, world size) as its own process group, all at once: the
    single-process reference and the gloo ranks are independent runs, so they need not wait for
    each other (each pays its imports; overlapping them saves wall time)."""
    worker = Path(__file__).parent / "dist_update_worker.py"
    procs = []
    for args, world in jobs:
        port = _free_port()
        for rank in range(world):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            cmd = [sys.executable, str(worker), *map(str, args)]
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def fsdp_updates(tmp_path_factory) -> dict:
    """The same update made by one process and by two gloo ranks with FSDP2, the ranks then
    again under the bfloat16 policy: one launch serves the two tests below."""
    tmp_path = tmp_path_factory.mktemp("fsdp_updates")
    torch.manual_seed(1)
    torch.save(small_model().state_dict(), tmp_path / "model.pt")
    trajs = synthetic_batch(groups=4, group_size=3, seed=1)
    (tmp_path / "trajs.jsonl").write_text("\n".join(json.dumps(t.to_dict()) for t in trajs))
    cfg = {"lr": 1e-3, "updates_per_step": 2, "advantage": "reinforce++", "warmup_steps": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _run_workers(
        (["update", tmp_path, tmp_path / "one.pt", 0], 1),
        (["update", tmp_path, tmp_path / "two.pt", 2, "bf16-too"], 2),
    )
    return {
        "start": torch.load(tmp_path / "model.pt"),
        "one": torch.load(tmp_path / "one.pt"),
        "two": torch.load(tmp_path / "two.pt"),
    }


def test_two_gloo_ranks_with_fsdp_make_the_update_of_one_process(fsdp_updates):
    start, one, two = fsdp_updates["start"], fsdp_updates["one"], fsdp_updates["two"]
    moved = [k for k in start if not torch.equal(start[k], one["params"][k])]
    assert moved, "the update must change the parameters"
    # Float rounding only: each pass is cut to its own longest row, so the two runs compute
    # the same sums over different shapes (an lr-1e-3 update moves weights by ~1e-3).
    for key, value in one["params"].items():
        torch.testing.assert_close(two["params"][key], value, atol=5e-6, rtol=0)
    for key in ("actor/pg_loss", "actor/clip_frac", "actor/entropy"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], abs=1e-6)


def _relative_error(got: dict, want: dict) -> float:
    """||got - want|| / ||want|| over all tensors of two same-keyed dicts."""
    diff = sum(float((got[k].double() - want[k].double()).square().sum()) for k in want)
    norm = sum(float(want[k].double().square().sum()) for k in want)
    return (diff / norm) ** 0.5


def test_fsdp_policy_computes_in_bf16_and_reduces_in_fp32_only_with_rl_bf16():
    policy = fsdp_policy(RLConfig(bf16=True))
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert policy.output_dtype is None  # logits stay bf16; token_logprobs upcasts them
    assert fsdp_policy(RLConfig()) is None


def test_fsdp_bf16_policy_computes_in_bf16_keeps_fp32_weights_and_updates_like_fp32(
    fsdp_updates,
):
    """`rl.bf16` under FSDP (`fsdp_policy`): the blocks run on bfloat16 weights, while the
    sharded weights, their gradients and Adam's moments are float32, and the update is the
    full-precision one up to bfloat16 rounding."""
    start, one, two = fsdp_updates["start"], fsdp_updates["one"], fsdp_updates["two"]
    bf16 = two["bf16"]
    fp32_probe, probe = two["probe"], bf16["probe"]
    assert (fp32_probe["bf16_policy"], probe["bf16_policy"]) == (False, True)
    assert fp32_probe["forward_weight"] == {torch.float32}
    assert probe["forward_weight"] == {torch.bfloat16}  # all-gathered and computed in bf16
    assert probe["sharded"] and probe["param_dtypes"] == {torch.float32}  # master weights
    assert probe["grad_dtypes"] == {torch.float32}  # what the optimizer steps with
    assert probe["optimizer_dtypes"] == {torch.float32}
    assert {v.dtype for v in bf16["params"].values()} == {torch.float32}

    # The first step's gradient (same weights, same minibatch in all runs), after clipping to
    # norm 1, and the norm before clipping. Two fp32 ranks match one process to float32
    # rounding (measured 1e-7). bfloat16 keeps 8 significant bits (unit roundoff 2^-8 = 0.4%);
    # the rounding through two blocks puts the gradient 0.6% off (measured) and its norm 0.02%.
    # 5% and 2% leave room for other CPUs' bf16 kernels and still catch a gradient taken at
    # other weights, or scaled wrong (x2 from summing instead of averaging over the two ranks:
    # 100% on the norm); above 1e-4 shows the compute did happen in bfloat16.
    norm = one["metrics"]["actor/grad_norm"]
    assert bf16["metrics"]["actor/grad_norm"] == pytest.approx(norm, rel=0.02)
    want = one["probe"]["grads"]
    assert _relative_error(fp32_probe["grads"], want) < 1e-5
    assert 1e-4 < _relative_error(probe["grads"], want) < 0.05
    # After two AdamW steps the weights moved the same way (measured 5% apart; a gradient
    # unrelated to the true one gives ~140%). Adam's first steps move each weight by about lr
    # whatever its gradient's size, so this compares steps, not weights (any weights are within
    # 2 lr of each other), and it is blind to a gradient's scale, which the check above covers.
    step_fp32 = {k: one["params"][k] - start[k] for k in start}
    step_bf16 = {k: bf16["params"][k] - start[k] for k in start}
    assert _relative_error(step_bf16, step_fp32) < 0.2
    # The loss and the entropy are computed in float32 from the (bf16) logits: measured 2e-5
    # apart on a pg_loss of 1e-3, and 4e-7 relative.
    assert bf16["metrics"]["actor/pg_loss"] == pytest.approx(
        one["metrics"]["actor/pg_loss"], abs=2e-4
    )
    assert bf16["metrics"]["actor/entropy"] == pytest.approx(
        one["metrics"]["actor/entropy"], rel=1e-3
    )


def test_two_gloo_ranks_train_like_one_process_rollouts_included(tmp_path):
    """Each rank rolls out half the groups (its own sandbox), all ranks update on the gathered
    batch, and each rank's sampling copy receives the new weights."""
    _run_workers((["rl", tmp_path / "one.pt"], 1), (["rl", tmp_path / "two.pt"], 2))
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    for a, b in zip(one["metrics"], two["metrics"]):
        assert a["train/reward_mean"] == b["train/reward_mean"]
        assert a["length/model_tokens_mean"] == b["length/model_tokens_mean"]
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], abs=1e-6)
    assert any(m["actor/grad_norm"] > 0 for m in one["metrics"])
    for key, value in one["params"].items():
        torch.testing.assert_close(two["params"][key], value, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- with rollouts


def varied_reward(traj: Trajectory) -> float:
    """A reward with spread inside groups even for an untrained model, so updates happen."""
    return float(sum(traj.ids) % 2)


async def _train(model, tokenizer, env, cfg, run_dir, until=None, resume=False, engine_model=None):
    """RL steps with the HF engine on `model` itself or on `engine_model` (a copy that the
    trainer pushes its weights into, as for one step off-policy); the log's records."""
    async with Sandbox() as sandbox:
        engine = HFEngine(engine_model or model, tokenizer.eos_token_id, seed=0)
        logger = MetricsLogger(run_dir / "metrics.jsonl")
        trainer = rl_trainer(
            model,
            cfg,
            Rollout(engine, tokenizer, sandbox),
            lambda i: ARITHMETIC.item("train", i),
            pad_id=tokenizer.pad_token_id,
            logger=logger,
            reward_fn=varied_reward,
        )
        if resume:
            trainer.load_checkpoint(run_dir / "ckpt")
        await trainer.train(until=until, checkpoint_dir=run_dir / "ckpt")
        logger.close()
        engine.close()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_resume_continues_exactly_where_the_run_stopped(env, tokenizer, tiny_model, tmp_path):
    cfg = RLConfig(steps=4, prompts_per_step=2, group_size=3, max_model_tokens=20, lr=1e-3)
    start_state = copy.deepcopy(tiny_model.state_dict())
    torch.manual_seed(5)
    straight = asyncio.run(_train(tiny_model, tokenizer, env, cfg, tmp_path / "a"))
    straight_params = copy.deepcopy(tiny_model.state_dict())

    tiny_model.load_state_dict(start_state)
    torch.manual_seed(5)
    asyncio.run(_train(tiny_model, tokenizer, env, cfg, tmp_path / "b", until=2))
    tiny_model.load_state_dict(start_state)  # a new process starts from the initial policy
    torch.manual_seed(123)  # whatever the new process's RNG is, the checkpoint's wins
    resumed = asyncio.run(_train(tiny_model, tokenizer, env, cfg, tmp_path / "b", resume=True))

    assert [r["step"] for r in resumed] == [0, 1, 2, 3]
    for a, b in zip(straight, resumed):
        assert a["train/reward_mean"] == b["train/reward_mean"]
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], abs=1e-6)
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], abs=1e-6)
    assert any(r["actor/grad_norm"] > 0 for r in straight)
    for key, value in straight_params.items():
        torch.testing.assert_close(tiny_model.state_dict()[key], value, atol=1e-6, rtol=0)


def _one_step(env, tokenizer, model, cfg, reward_fn, use_train=False):
    """`cfg.steps` steps, one by one or through `train()` (then read back from the log)."""
    log = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    logger = MetricsLogger(log)

    async def main():
        async with Sandbox() as sandbox:
            engine = HFEngine(model, tokenizer.eos_token_id, seed=0)
            trainer = rl_trainer(
                model,
                cfg,
                Rollout(engine, tokenizer, sandbox),
                lambda i: ARITHMETIC.item("train", i),
                pad_id=tokenizer.pad_token_id,
                reward_fn=reward_fn,
                logger=logger,
            )
            if use_train:
                await trainer.train()
                logger.close()
                metrics = [json.loads(line) for line in log.read_text().splitlines()]
            else:
                metrics = [await trainer.step() for _ in range(cfg.steps)]
            engine.close()
            return trainer, metrics

    return asyncio.run(main())


def test_adaptive_batch_drops_groups_with_equal_rewards_and_refills(env, tokenizer, tiny_model):
    """Odd tasks get rewards with spread, even ones all 0: task 0 and 2 are dropped."""

    def reward(traj: Trajectory) -> float:
        return float(traj.meta["task"] % 2 == 1 and traj.meta["seed"] % 2 == 0)

    cfg = RLConfig(
        steps=1, prompts_per_step=2, group_size=3, max_model_tokens=8, adaptive_batch=True
    )
    trainer, (m,) = _one_step(env, tokenizer, tiny_model, cfg, reward)
    assert (m["batch/groups_sampled"], m["batch/groups_dropped"]) == (4, 2)
    assert (m["batch/refill_rounds"], m["batch/fill"]) == (2, 1.0)
    assert m["train/uniform_group_share"] == 0.0
    assert trainer.feed.next_task == 4

    bounded = dataclasses.replace(cfg, max_refill_rounds=0)
    _, (m,) = _one_step(env, tokenizer, tiny_model, bounded, reward)
    assert (m["batch/groups_sampled"], m["batch/fill"]) == (2, 0.5)


def test_expansion_moves_one_stage_when_truncation_exceeds_the_threshold(
    env, tokenizer, tiny_model
):
    """An untrained model rarely stops on its own within 4 tokens: truncation near 100%."""
    stages = [RLStage(4, 1), RLStage(6, 2), RLStage(8, 3)]
    cfg = RLConfig(steps=3, prompts_per_step=1, group_size=2, max_model_tokens=8, stages=stages)
    trainer, metrics = _one_step(env, tokenizer, tiny_model, cfg, varied_reward)
    assert [m["rl/max_model_tokens"] for m in metrics] == [4, 6, 8]
    assert [m["rl/budget"] for m in metrics] == [1, 2, 3]
    assert [m["rl/stage"] for m in metrics] == [1, 2, 2]  # and never past the last stage
    assert all(m["train/truncation_rate"] > 0.1 for m in metrics)


@pytest.mark.parametrize(
    "override, words",
    [
        ("rl.bf16=true", ["bf16", "GPU"]),
        ("rl.clip_ratio_c=0.9", ["clip_ratio_c", "(1, 1000]"]),
        ("rl.advantage=ppo", ["rl.advantage", "ppo"]),
        ("rl.stages=[{max_model_tokens: 0, tool_budget: 1}]", ["stages", "max_model_tokens"]),
        ("rl.overlong_buffer=64", ["overlong_buffer"]),
        ("rl.gamma=0", ["gamma"]),
    ],
)
def test_bad_rl_switches_are_refused_with_a_message(override, words):
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, overrides=[override])
    for word in words:
        assert word in str(err.value)


def test_partial_rollouts_train_groups_once_all_members_finish(env, tokenizer, tiny_model):
    """Segments of 4 tokens, 12 per trajectory: a group started at step 0 is trained on at
    step 2, its tokens sampled by three policy versions; resuming restarts carried ones."""
    from tirl.rollout.runner import token_policy_versions

    cfg = RLConfig(steps=4, prompts_per_step=1, group_size=2, max_model_tokens=12, segment_tokens=4)
    seen: list[Trajectory] = []

    def reward(traj: Trajectory) -> float:
        seen.append(traj)
        return float(sum(traj.ids) % 2)

    trainer, metrics = _one_step(env, tokenizer, tiny_model, cfg, reward, use_train=True)
    fills = [m["batch/fill"] for m in metrics]
    assert fills[:2] == [0.0, 0.0] and fills[2] == 1.0
    assert metrics[2]["rollout/partial_resumed"] >= 4
    first = [t for t in seen if t.meta["task"] == 0]
    versions = {v for v in token_policy_versions(first[0]) if v >= 0}
    assert versions == {0, 1, 2}
    assert all(t.num_model_tokens == 12 for t in first)
    # at most 2 * prompts_per_step groups open: step 2 (tasks 0 and 1 open) starts none,
    # step 3 starts task 2; carried trajectories are named in the checkpoint, to restart
    assert [m["batch/tasks_started"] for m in metrics] == [1, 1, 0, 1]
    assert {m["task"] for m in trainer.feed.carried_metas()} == {2}


def test_partial_rollouts_refuse_torch_distributed():
    from tirl.train.distributed import DistContext

    cfg = RLConfig(segment_tokens=8)
    with pytest.raises(ConfigError, match="partial rollouts"):
        rl_trainer(small_model(), cfg, pad_id=0, dist=DistContext(0, 2))
