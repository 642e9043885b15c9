"""The RL trainer's batch rule (`tirl.train.feed`): every update trains on exactly
`prompts_per_step` usable groups, a step short of them does not update and says so, waiting
groups survive a checkpoint, and stage expansion counts truncation over everything sampled.

Real tiny models, real rollouts in the real sandbox. Reward patterns are set through the
trainer's public `reward_fn`, keyed on the task index, the trajectory's seed and its real
finish reason; truncation comes from tasks whose prompts fill the model's context."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from rl_trainer import rl_trainer

from tirl.backends.hf import HFEngine
from tirl.models.tiny import TinyModelSpec, build_model
from tirl.protocol.segments import Trajectory
from tirl.rollout.limits import is_truncated
from tirl.rollout.runner import Rollout
from tirl.run.config import RLConfig, RLStage, SFTConfig
from tirl.sandbox import Sandbox
from tirl.synth.arithmetic import text_only_texts, to_trajectory
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.feed import plain_prompt
from tirl.train.metrics import MetricsLogger
from tirl.train.sft import train_sft

MAX_POSITIONS = 256  # the fixtures' context window

ARITHMETIC = ArithmeticSource()  # the arithmetic items as tirl.tasks.Task


def seed_parity(traj: Trajectory) -> float:
    """Differs between the two samples of a group (seeds are task * 1009 + sample)."""
    return float(traj.meta["seed"] % 2)


def informative_on(tasks: set[int], seen: list[Trajectory] | None = None):
    """A reward with spread inside the groups of `tasks` and all 0 elsewhere; records every
    call in `seen` (the trainer scores each finished trajectory once)."""

    def reward(traj: Trajectory) -> float:
        if seen is not None:
            seen.append(traj)
        return seed_parity(traj) if traj.meta["task"] in tasks else 0.0

    return reward


def trainer_for(model, tokenizer, sandbox, task_at, cfg, reward_fn, logger=None):
    engine = HFEngine(model, tokenizer.eos_token_id, seed=0)
    trainer = rl_trainer(
        model,
        cfg,
        Rollout(engine, tokenizer, sandbox),
        task_at,
        pad_id=tokenizer.pad_token_id,
        reward_fn=reward_fn,
        logger=logger,
    )
    return trainer, engine


def params_of(model) -> dict[str, torch.Tensor]:
    return copy.deepcopy(model.state_dict())


def same_params(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------- adaptive batches


def test_a_step_short_of_informative_groups_does_not_update_and_they_wait(
    env, tokenizer, tiny_model
):
    """Informative tasks: 1, 5, 6, 7. Two rounds per step (max_refill_rounds=1), 2 groups per
    update. Step 0 finds task 1 only, step 1 finds nothing (all groups uniform), step 2 adds
    task 5, step 3 samples 6 and 7."""
    cfg = RLConfig(
        steps=4,
        prompts_per_step=2,
        group_size=2,
        max_model_tokens=8,
        adaptive_batch=True,
        max_refill_rounds=1,
    )
    seen: list[Trajectory] = []

    async def main():
        async with Sandbox() as sandbox:
            trainer, engine = trainer_for(
                tiny_model, tokenizer, sandbox, lambda i: ARITHMETIC.item("train", i), cfg,
                informative_on({1, 5, 6, 7}, seen),
            )  # fmt: skip
            metrics, params, waiting = [], [params_of(tiny_model)], []
            for _ in range(cfg.steps):
                metrics.append(await trainer.step())
                params.append(params_of(tiny_model))
                waiting.append([g[0].meta["task"] for g in trainer.feed.ready])
            engine.close()
            return metrics, params, waiting

    metrics, params, waiting = asyncio.run(main())
    assert [m["train/updated"] for m in metrics] == [0, 0, 1, 1]
    assert [m["batch/cap_hit"] for m in metrics] == [1, 1, 0, 0]
    assert [m["train/updates"] for m in metrics] == [0, 0, 1, 2]
    assert waiting == [[1], [1], [], []]
    assert [m["batch/groups_carried_in"] for m in metrics] == [0, 1, 1, 0]
    assert [m["batch/groups_sampled"] for m in metrics] == [3, 2, 1, 2]
    assert [m["batch/groups_dropped"] for m in metrics] == [2, 2, 0, 0]
    assert [m["batch/fill"] for m in metrics] == [0.5, 0.5, 1.0, 1.0]
    # nothing trains on a short batch: no update metrics and not a weight moved
    for m, before, after in zip(metrics, params, params[1:]):
        if m["train/updated"]:
            assert m["train/groups"] == cfg.prompts_per_step
            assert m["train/uniform_group_share"] == 0.0
            assert not same_params(before, after)
        else:
            assert not any(k.startswith(("train/reward", "actor/")) for k in m)
            assert same_params(before, after)
    # every task was sampled once, every member scored once: nothing lost, nothing redone
    assert Counter(t.meta["task"] for t in seen) == {i: 2 for i in range(8)}


def test_refill_rounds_sample_only_the_shortfall_and_fill_the_batch_exactly(
    env, tokenizer, tiny_model
):
    """Odd tasks are informative. Round 0 samples tasks 0-2 (keeps 1), round 1 samples the two
    missing (keeps 3), round 2 the one missing (keeps 5): never a surplus group to discard."""
    cfg = RLConfig(
        steps=1, prompts_per_step=3, group_size=2, max_model_tokens=8, adaptive_batch=True
    )

    async def main():
        async with Sandbox() as sandbox:
            odd = {1, 3, 5, 7, 9}
            trainer, engine = trainer_for(
                tiny_model, tokenizer, sandbox, lambda i: ARITHMETIC.item("train", i), cfg,
                informative_on(odd),
            )  # fmt: skip
            m = await trainer.step()
            engine.close()
            return m, trainer

    m, trainer = asyncio.run(main())
    assert (m["train/updated"], m["batch/cap_hit"], m["train/groups"]) == (1, 0, 3)
    assert (m["batch/tasks_started"], m["batch/groups_sampled"]) == (6, 6)
    assert (m["batch/groups_dropped"], m["batch/refill_rounds"]) == (3, 2)
    assert m["batch/groups_waiting"] == 0 and trainer.feed.ready == []
    assert trainer.feed.next_task == 6


async def _train(model, tokenizer, env, cfg, reward_fn, run_dir: Path, until=None, resume=False):
    async with Sandbox() as sandbox:
        logger = MetricsLogger(run_dir / "metrics.jsonl")
        trainer, engine = trainer_for(
            model, tokenizer, sandbox, lambda i: ARITHMETIC.item("train", i), cfg, reward_fn, logger
        )
        if resume:
            trainer.load_checkpoint(run_dir / "ckpt")
        await trainer.train(until=until, checkpoint_dir=run_dir / "ckpt")
        logger.close()
        engine.close()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_resume_with_waiting_groups_continues_exactly(env, tokenizer, tiny_model, tmp_path):
    """Tasks 0, 3, 6, ... are uniform, one round per step: steps alternate between a short
    batch (its informative group waits) and an update. The run stops after step 2, whose
    group (task 4) waits in the checkpoint; the resumed run must train on it at step 3."""
    cfg = RLConfig(
        steps=6,
        prompts_per_step=2,
        group_size=2,
        max_model_tokens=8,
        lr=1e-3,
        warmup_steps=1,
        adaptive_batch=True,
        max_refill_rounds=0,
    )
    reward = informative_on({i for i in range(20) if i % 3})
    start_state = params_of(tiny_model)
    torch.manual_seed(5)
    straight = asyncio.run(_train(tiny_model, tokenizer, env, cfg, reward, tmp_path / "a"))
    straight_params = params_of(tiny_model)

    tiny_model.load_state_dict(start_state)
    torch.manual_seed(5)
    asyncio.run(_train(tiny_model, tokenizer, env, cfg, reward, tmp_path / "b", until=3))
    tiny_model.load_state_dict(start_state)  # a new process starts from the initial policy
    torch.manual_seed(123)  # whatever the new process's RNG is, the checkpoint's wins
    resumed = asyncio.run(
        _train(tiny_model, tokenizer, env, cfg, reward, tmp_path / "b", resume=True)
    )

    assert [m["train/updated"] for m in straight] == [0, 1, 0, 1, 0, 1]
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4, 5]
    assert resumed[3]["batch/groups_carried_in"] == 1  # task 4, restored from the checkpoint
    for a, b in zip(straight, resumed):
        assert a["train/updated"] == b["train/updated"]
        if a["train/updated"]:
            assert a["train/reward_mean"] == b["train/reward_mean"]
            assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], abs=1e-6)
    assert any(m.get("actor/grad_norm", 0) > 0 for m in straight)
    for key, value in straight_params.items():
        torch.testing.assert_close(tiny_model.state_dict()[key], value, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------- expansion


@pytest.fixture(scope="module")
def answering_model(env, tokenizer):
    """A real tiny model fine-tuned on text-only answers: it ends with end-of-sequence after a
    dozen tokens, so its trajectories are not truncated unless the context runs out."""
    model = build_model(
        tokenizer,
        TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=MAX_POSITIONS),
        seed=0,
    )
    demos = [to_trajectory(text_only_texts(t), tokenizer, {}) for t in env.items("train", 64)]
    train_sft(
        model,
        demos,
        SFTConfig(steps=100, batch_size=16, lr=3e-3, warmup_steps=5),
        pad_id=tokenizer.pad_token_id,
        seed=0,
    )
    return model.eval()


def context_filling(task, tokenizer, room: int = 2):
    """`task` with its question padded until the prompt leaves `room` tokens of context: any
    answer to it is cut by the context limit (finish_reason "length")."""
    pad = ""
    while len(tokenizer(plain_prompt(task) + pad, add_special_tokens=False)["input_ids"]) < (
        MAX_POSITIONS - room
    ):
        pad += " ."
    return dataclasses.replace(task, problem=task.problem + pad)


def test_expansion_counts_truncation_in_dropped_groups(env, tokenizer, answering_model):
    """Tasks 0, 2 and 3 fill the context, so all their answers are cut (reward 0: uniform,
    dropped); tasks 1 and 4 are answered in full. Step 0 trains on task 1 only (no
    truncation in the batch) yet expands, step 1 finds no usable group and expands too."""
    long_tasks = {0, 2, 3}

    def task_at(i: int):
        task = ARITHMETIC.item("train", i)
        return context_filling(task, tokenizer) if i in long_tasks else task

    seen: list[Trajectory] = []

    def reward(traj: Trajectory) -> float:  # a cut answer earns nothing
        seen.append(traj)
        return 0.0 if is_truncated(traj) else seed_parity(traj)

    stages = [RLStage(24, 0), RLStage(28, 0), RLStage(32, 0)]
    cfg = RLConfig(
        steps=3,
        prompts_per_step=1,
        group_size=2,
        adaptive_batch=True,
        max_refill_rounds=1,
        stages=stages,
        expansion_threshold=0.1,
    )

    async def main():
        async with Sandbox() as sandbox:
            trainer, engine = trainer_for(answering_model, tokenizer, sandbox, task_at, cfg, reward)
            metrics = [await trainer.step() for _ in range(cfg.steps)]
            engine.close()
            return metrics

    metrics = asyncio.run(main())
    cut = {t.meta["task"] for t in seen if is_truncated(t)}
    assert cut == long_tasks, "only the context-filling tasks are truncated"
    assert [m["train/updated"] for m in metrics] == [1, 0, 1]
    assert [m["batch/truncation_rate_sampled"] for m in metrics] == [0.5, 1.0, 0.0]
    # the trained batch of step 0 shows no truncation: measured there, nothing would expand
    assert metrics[0]["train/truncation_rate"] == 0.0 <= cfg.expansion_threshold
    assert [m["rl/stage"] for m in metrics] == [1, 2, 2]
    assert [m["rl/max_model_tokens"] for m in metrics] == [24, 28, 32]


# ---------------------------------------------------------------------------- partial rollouts


def test_partial_rollouts_train_the_oldest_complete_groups_never_more_than_a_batch(
    env, tokenizer, tiny_model, tmp_path
):
    """Segments of 4 tokens, 12 per trajectory: tasks with ordinary prompts take three steps,
    those filling the context (2-5) finish in their first. So groups started in different
    steps complete together, more than a batch of them: the oldest two train, the rest wait
    (and survive a checkpoint), and no more than two batches of groups are ever open."""
    long_tasks = {2, 3, 4, 5}

    def task_at(i: int):
        task = ARITHMETIC.item("train", i)
        return context_filling(task, tokenizer) if i in long_tasks else task

    seen: list[Trajectory] = []
    cfg = RLConfig(steps=7, prompts_per_step=2, group_size=2, max_model_tokens=12, segment_tokens=4)
    want = cfg.prompts_per_step

    async def main():
        async with Sandbox() as sandbox:
            trainer, engine = trainer_for(
                tiny_model, tokenizer, sandbox, task_at, cfg, informative_on(set(range(99)), seen)
            )
            metrics, saved = [], None
            members = Counter()
            for _ in range(cfg.steps):
                before = {g[0].meta["task"] for g in trainer.feed.ready}
                n_seen = len(seen)
                metrics.append(m := await trainer.step())
                members.update(t.meta["task"] for t in seen[n_seen:])
                done_now = {t.meta["task"] for t in seen[n_seen:]}
                complete = before | {t for t in done_now if members[t] == cfg.group_size}
                after = [g[0].meta["task"] for g in trainer.feed.ready]
                if m["train/updated"]:  # the oldest `want` complete groups, the rest wait
                    assert m["train/groups"] == want
                    assert after == sorted(complete)[want:]
                else:
                    assert set(after) == complete and len(complete) < want
                assert m["batch/tasks_started"] <= want
                assert m["batch/groups_waiting"] + m["batch/groups_in_flight"] <= 2 * want
                if saved is None and m["batch/groups_waiting"]:
                    trainer.save_checkpoint(tmp_path)
                    saved = [[t.to_dict() for t in g] for g in trainer.feed.ready]
                    pending = {k: [t.to_dict() for t in v] for k, v in trainer.feed.pending.items()}
            restored, _ = trainer_for(tiny_model, tokenizer, sandbox, task_at, cfg, None)
            restored.load_checkpoint(tmp_path)
            engine.close()
            return metrics, saved, pending, restored

    metrics, saved, pending, restored = asyncio.run(main())
    assert saved, "some step completed more groups than one batch"
    assert [[t.to_dict() for t in g] for g in restored.feed.ready] == saved
    assert {k: [t.to_dict() for t in v] for k, v in restored.feed.pending.items()} == pending
    assert sum(m["train/updated"] for m in metrics) >= 3
