"""The pass-rate curriculum (`tirl.train.curriculum`, `rl.curriculum`): its draws follow the
bucket pass rates on a synthetic source of known difficulties, it opens harder buckets as easy
ones saturate, a resume draws the same stream, bad settings are one-line ConfigErrors naming
the key, and with it off the trainer's stream is the source's own order.

The policy is a stub of known pass rates per bucket (the curriculum is what is under test);
the trainer tests run the real trainer, a real tiny model and the real sandbox on a synthetic
source whose scorers pass with known probabilities."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections import Counter

import pytest
from rl_trainer import rl_trainer

from tirl.backends.hf import HFEngine
from tirl.config import ConfigError, load_config
from tirl.protocol.score import Score
from tirl.rollout.runner import Rollout
from tirl.run.config import CurriculumConfig, RLConfig, RunConfig
from tirl.sandbox import Sandbox
from tirl.tasks.base import Task
from tirl.train.curriculum import (
    BucketView,
    Curriculum,
    bucket_weights,
    should_widen,
    unit_draw,
)
from tirl.train.metrics import MetricsLogger

OPS = ("add", "mul")
SIZES = (1, 2, 3)


def _unit(*parts) -> float:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def synthetic_task(position: int, pass_prob: dict[int, float] | None = None) -> Task:
    """Stream item `position`: an operator and a size fixed by a hash of the position (every
    bucket about equally often); its scorer passes a model text with probability
    `pass_prob[size]` (by a hash of the text: 0 never, 1 always)."""
    u = _unit("synthetic", position)
    op, size = OPS[int(u * 2) % 2], SIZES[int(u * 6) % 3]
    probs = pass_prob or {}

    def scorer(text: str) -> Score:
        ok = _unit(position, text) < probs.get(size, 0.0)
        return Score(float(ok), ok, "stub", None)

    return Task(
        id=f"synthetic/train/{position}",
        split="train",
        problem=f"{op} of size {size}, item {position}",
        answer="0",
        scorer=scorer,
        source="synthetic",
        meta={"operator": op, "size": size},
    )


def curriculum(**settings) -> Curriculum:
    cfg = CurriculumConfig(enabled=True, **settings)
    cfg.validate()
    return Curriculum(synthetic_task, cfg, seed=3)


def simulate(cur: Curriculum, pass_rate, n: int, start: int = 0, group: int = 8, batch: int = 8):
    """Draw positions start..n in batches as the trainer does (assign a batch, then feed back
    its groups); `pass_rate(bucket, cur)` is the stub policy's. Returns the buckets drawn."""
    drawn = []
    for first in range(start, n, batch):
        cur.assign(min(n, first + batch))
        for i in range(first, min(n, first + batch)):
            bucket = cur.assigned[i][1]
            rng = random.Random(i)
            passed = sum(rng.random() < pass_rate(bucket, cur) for _ in range(group))
            cur.observe(i, passed / group)
            drawn.append(bucket)
    return drawn


def size_of(bucket: str) -> int:
    return int(bucket.split(":")[1])


# ---------------------------------------------------------------------------- the math


def test_in_band_buckets_share_all_but_the_exploration_share():
    views = [
        BucketView("a", None, 0.5),
        BucketView("b", None, 1.0),
        BucketView("c", None, None),
        BucketView("d", None, 0.3),
    ]
    weights = bucket_weights(views, None, (0.2, 0.8), 0.1)
    assert weights == pytest.approx({"a": 0.45, "d": 0.45, "b": 0.05, "c": 0.05})


def test_with_nothing_in_band_every_open_bucket_and_the_next_level_are_probed():
    views = [
        BucketView("s1", 1.0, 1.0),
        BucketView("s2", 2.0, None),
        BucketView("s3", 3.0, None),
    ]
    assert bucket_weights(views, 1.0, (0.2, 0.8), 0.1) == pytest.approx({"s1": 0.5, "s2": 0.5})


def test_widening_waits_for_the_share_of_saturated_buckets_at_the_hardest_open_level():
    views = [
        BucketView("a1", 1.0, 1.0),
        BucketView("a2", 2.0, 0.9),
        BucketView("b2", 2.0, 0.5),
        BucketView("a3", 3.0, 0.0),
    ]
    assert should_widen(views, 2.0, 0.8, 0.5)
    assert not should_widen(views, 2.0, 0.8, 0.6)  # level 1's saturated bucket does not count
    assert not should_widen(views, 3.0, 0.8, 0.1)  # no level above


def test_a_draw_depends_only_on_the_seed_and_the_position():
    assert unit_draw(3, 17) == unit_draw(3, 17)
    assert len({unit_draw(3, i) for i in range(100)}) == 100


# ---------------------------------------------------------------------------- the sampling


KNOWN = {1: 1.0, 2: 0.5, 3: 0.0}  # size 1 saturated, size 2 in band, size 3 dead


def test_sampling_concentrates_on_the_buckets_whose_pass_rate_is_in_band():
    cur = curriculum(order_by=None, explore=0.1)
    drawn = simulate(cur, lambda b, c: KNOWN[size_of(b)], 800)
    late = Counter(size_of(b) for b in drawn[400:])
    assert late[2] / 400 > 0.85  # 1 - explore, less noise
    assert late[1] > 0 and late[3] > 0  # the exploration share keeps the others' rates fresh
    metrics = cur.step_metrics()
    assert metrics["curriculum/add:2/pass_rate"] == pytest.approx(0.5, abs=0.2)
    assert metrics["curriculum/mul:1/pass_rate"] == 1.0
    assert metrics["curriculum/mul:3/pass_rate"] == 0.0
    assert metrics["curriculum/buckets_in_band"] == 2


def test_it_opens_harder_levels_as_easy_ones_saturate_and_finds_more_signal_than_the_stream():
    """A stub policy that learns: skill grows with every group that has signal (some but not
    all members correct, GRPO's non-zero advantage), and size s passes at skill - (s-1)/2."""

    def learner():
        state = {"skill": 0.5}

        def pass_rate(bucket, _):
            return min(1.0, max(0.0, state["skill"] - (size_of(bucket) - 1) / 2))

        return state, pass_rate

    def run(cur: Curriculum | None, n: int):
        state, pass_rate = learner()
        live, frontiers, drawn = 0, [], []
        for i in range(n):
            if cur:
                cur.assign(i + 1)
            bucket = cur.assigned[i][1] if cur else ":".join(map(str, _meta(i)))
            rng = random.Random(i)
            passed = sum(rng.random() < pass_rate(bucket, None) for _ in range(8))
            if 0 < passed < 8:
                live += 1
                state["skill"] += 0.0015
            if cur:
                cur.observe(i, passed / 8)
                frontiers.append(cur.frontier)
            drawn.append(size_of(bucket))
        return live, frontiers, drawn

    def _meta(i):
        task = synthetic_task(i)
        return task.meta["operator"], task.meta["size"]

    cur = curriculum(order_by="size", explore=0.1)
    live, frontiers, drawn = run(cur, 1000)
    assert frontiers == sorted(frontiers)  # the frontier never moves back
    assert frontiers[0] == 1.0 and frontiers[-1] == 3.0
    to_2, to_3 = frontiers.index(2.0), frontiers.index(3.0)
    assert Counter(drawn[:to_2])[1] / to_2 > 0.8  # the easy level first
    assert Counter(drawn[to_2 + 50 : to_3])[2] / (to_3 - to_2 - 50) > 0.8  # then the next
    assert Counter(drawn[to_3 + 50 : to_3 + 250])[3] / 200 > 0.8  # then the hardest
    uniform_live, _, _ = run(None, 1000)
    assert live > uniform_live  # more groups with signal than the source's own order


def test_each_stream_item_is_drawn_at_most_once():
    cur = curriculum(order_by=None)
    simulate(cur, lambda b, c: KNOWN[size_of(b)], 500)
    positions = [p for p, _ in cur.assigned]
    assert len(set(positions)) == len(positions) == 500


def test_the_default_key_buckets_races_tasks_by_operator_and_size_smallest_size_first():
    from tirl.tasks.registry import Mixture

    mixture = Mixture.from_entries([{"source": "races"}], "data.train", 0)
    cur = Curriculum(lambda p: mixture.item("train", p), CurriculumConfig(enabled=True), 0)
    assert cur.frontier == 2.0
    assert {"sequential:2", "sequential:3", "parallel:2", "sort:2"} <= set(cur.levels)
    cur.assign(32)
    for position, bucket in cur.assigned:  # the bucket is the task's own operator and size
        task = mixture.item("train", position)
        assert bucket == f"{task.meta['operator']}:{task.meta['size']}"
    assert {size_of(b) for _, b in cur.assigned} <= {2, 3}  # the open level and its probes


# ---------------------------------------------------------------------------- resume


def test_a_resumed_curriculum_draws_the_same_stream():
    def policy(bucket, _):
        return KNOWN[size_of(bucket)]

    whole = curriculum()
    simulate(whole, policy, 400)
    first = curriculum()
    simulate(first, policy, 200)
    saved = json.loads(json.dumps(first.state_dict()))  # plain data, as the checkpoint holds it
    resumed = curriculum()
    resumed.load_state_dict(saved)
    simulate(resumed, policy, 400, start=200)
    assert resumed.assigned == whole.assigned
    assert resumed.state_dict() == whole.state_dict()


# ---------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    "override,key",
    [
        ("rl.curriculum.band=[0.9, 0.1]", "rl.curriculum.band"),
        ("rl.curriculum.band=[0.2, 1.5]", "rl.curriculum.band"),
        ("rl.curriculum.band=[-0.1, 0.5]", "rl.curriculum.band"),
        ("rl.curriculum.band=[0.5]", "rl.curriculum.band"),
        ("rl.curriculum.key=[]", "rl.curriculum.key"),
        ("rl.curriculum.key=[size, size]", "rl.curriculum.key"),
        ("rl.curriculum.window=0", "rl.curriculum.window"),
        ("rl.curriculum.min_groups=9", "rl.curriculum.min_groups"),
        ("rl.curriculum.explore=1.5", "rl.curriculum.explore"),
        ("rl.curriculum.widen_share=0", "rl.curriculum.widen_share"),
        ("rl.curriculum.order_by=level", "rl.curriculum.order_by"),
        ("rl.curriculum.lookahead=0", "rl.curriculum.lookahead"),
        ("rl.curriculum.bands=[0.2, 0.8]", "rl.curriculum.bands"),
    ],
)
def test_a_bad_curriculum_setting_is_a_one_line_error_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, None, ["rl.curriculum.enabled=true", override])
    message = str(err.value)
    assert "\n" not in message and key.rsplit(".", 1)[1] in message
    assert err.value.key == key


@pytest.mark.parametrize(
    "settings,key,words",
    [
        ({"key": ["opertor", "size"]}, "rl.curriculum.key", "'opertor' is not a field"),
        ({"key": ["operator"], "order_by": "operator"}, "rl.curriculum.order_by", "a number"),
    ],
)
def test_a_bucket_key_the_tasks_do_not_have_is_a_one_line_error_naming_it(settings, key, words):
    with pytest.raises(ConfigError) as err:
        curriculum(**settings)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_the_defaults_leave_the_curriculum_off():
    assert load_config(RunConfig).rl.curriculum.enabled is False


# ---------------------------------------------------------------------------- the trainer


def known_task(position: int) -> Task:
    return synthetic_task(position, KNOWN)


def make_trainer(model, tokenizer, sandbox, cfg, logger=None):
    engine = HFEngine(model, tokenizer.eos_token_id, seed=0)
    trainer = rl_trainer(
        model,
        cfg,
        Rollout(engine, tokenizer, sandbox),
        known_task,
        pad_id=tokenizer.pad_token_id,
        logger=logger,
        seed=3,
    )
    return trainer, engine


RL = dict(steps=4, prompts_per_step=2, group_size=2, max_model_tokens=8, warmup_steps=0)


def test_with_the_curriculum_off_the_trainer_asks_the_source_in_order(tokenizer, tiny_model):
    async def main():
        async with Sandbox() as sandbox:
            trainer, engine = make_trainer(tiny_model, tokenizer, sandbox, RLConfig(**RL))
            records = [await trainer.step() for _ in range(2)]
            engine.close()
            return trainer, records

    trainer, records = asyncio.run(main())
    assert trainer.curriculum is None and trainer.task_at is known_task
    assert [r["train/tasks"] for r in records] == [
        [known_task(i).id for i in (0, 1)],
        [known_task(i).id for i in (2, 3)],
    ]
    assert not any(k.startswith("curriculum/") for r in records for k in r)


def test_the_trainer_feeds_back_pass_rates_logs_them_and_resumes_the_same_stream(
    tokenizer, tiny_model, tmp_path
):
    cfg = RLConfig(**RL, curriculum=CurriculumConfig(enabled=True, min_groups=1))
    start = {k: v.clone() for k, v in tiny_model.state_dict().items()}

    async def run(steps: int, save_after: int | None = None, load: bool = False):
        tiny_model.load_state_dict(start)
        logger = MetricsLogger(tmp_path / f"m{steps}{save_after}{load}.jsonl")
        async with Sandbox() as sandbox:
            trainer, engine = make_trainer(tiny_model, tokenizer, sandbox, cfg, logger)
            if load:
                trainer.load_checkpoint(tmp_path / "state")
            records = []
            while trainer.state.step < steps:
                records.append(await trainer.step())
                if trainer.state.step == save_after:
                    trainer.save_checkpoint(tmp_path / "state")
            engine.close()
        logger.close()
        return trainer, records

    whole, records = asyncio.run(run(4, save_after=2))
    assert whole.curriculum.groups  # every finished group was fed back
    rates = {
        k: v for k, v in records[-1].items() if k.startswith("curriculum/") and "pass_rate" in k
    }
    for name, rate in rates.items():
        assert rate == {"1": 1.0, "3": 0.0}.get(name.split(":")[1].split("/")[0], rate)
    assert all("curriculum/buckets_open" in r for r in records)
    logged = [json.loads(line) for line in (tmp_path / "m42False.jsonl").read_text().splitlines()]
    assert any(k.startswith("curriculum/") for k in logged[0])

    resumed, later = asyncio.run(run(4, load=True))
    assert [r["train/tasks"] for r in later] == [r["train/tasks"] for r in records[2:]]
    assert resumed.curriculum.state_dict() == whole.curriculum.state_dict()


def test_a_checkpoint_written_without_the_curriculum_is_refused_with_it_on(
    tokenizer, tiny_model, tmp_path
):
    async def main():
        async with Sandbox() as sandbox:
            plain, engine = make_trainer(tiny_model, tokenizer, sandbox, RLConfig(**RL))
            plain.save_checkpoint(tmp_path)
            engine.close()
            cfg = RLConfig(**RL, curriculum=CurriculumConfig(enabled=True))
            on, engine = make_trainer(tiny_model, tokenizer, sandbox, cfg)
            try:
                on.load_checkpoint(tmp_path)
            finally:
                engine.close()

    with pytest.raises(ConfigError) as err:
        asyncio.run(main())
    assert err.value.key == "rl.curriculum.enabled" and "\n" not in str(err.value)


# ---------------------------------------------------------------------------- the report


def test_the_report_plots_the_bucket_rates_only_when_a_run_logged_them(tmp_path):
    from tirl.eval.report import write_plots

    cur = curriculum(order_by=None)
    records = []
    for step in range(6):
        simulate(cur, lambda b, c: KNOWN[size_of(b)], 8 * (step + 1), start=8 * step)
        records.append({"variant": "code", "phase": "rl", "step": step, **cur.step_metrics()})
    written = dict(write_plots(records, {}, tmp_path / "on"))
    assert written["Curriculum buckets"].read_bytes().startswith(b"\x89PNG")
    plain = [{k: v for k, v in r.items() if not k.startswith("curriculum/")} for r in records]
    assert "Curriculum buckets" not in dict(write_plots(plain, {}, tmp_path / "off"))


# ---------------------------------------------------------------------------- end to end


def test_a_tirl_train_run_with_the_curriculum_logs_the_bucket_rates_every_rl_step(tmp_path):
    from tiny_run import RL_STEPS, run, train_cmd

    on = ["rl.curriculum.enabled=true", "rl.curriculum.key=[kind]", "rl.curriculum.order_by=null"]
    done = run(train_cmd(tmp_path, "cur", *on, "rl.curriculum.min_groups=1"))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "cur" / "metrics.jsonl").read_text().splitlines()
    rl = [r for r in map(json.loads, lines) if r["phase"] == "rl"]
    assert len(rl) == RL_STEPS
    for record in rl:
        shares = [v for k, v in record.items() if k.endswith("/share")]
        assert sum(shares) == pytest.approx(1.0)  # every drawn task is in some bucket
        assert any(k.endswith("/pass_rate") for k in record)
    assert "curriculum" in (tmp_path / "cur" / "config.yaml").read_text()
    assert (tmp_path / "cur" / "plots" / "curriculum.png").is_file()
    assert "Curriculum buckets" in (tmp_path / "cur" / "report.md").read_text()

    bad = run(train_cmd(tmp_path, "bad", "rl.curriculum.enabled=true"))  # arithmetic: no size
    line = bad.stderr.strip()
    assert bad.returncode == 2 and "\n" not in line, bad.stderr[-2000:]
    assert "rl.curriculum.key" in line and "'operator' is not a field" in line
