"""The pass-rate curriculum on verl 0.9.1's data path (`tirl.integrations.verl.curriculum`).

The dataset is built the way verl's v1 trainer builds it (`create_rl_dataset` with
`data.custom_cls`, `create_rl_sampler`, a single-process `StatefulDataLoader` with verl's
`collate_fn`); the "policy" is known pass rates per bucket, reported as tirl's agent loop
reports them. Its draws follow the rates; a checkpoint saved and loaded as verl saves `data.pt`
resumes the same stream; the validation set is served plainly; and tirl's agent loop, run by
verl's own AgentLoopWorker, reports each training sample to the named Ray actor.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import HFServer, dataset_batch, generate, rows_of
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from tirl.integrations.verl.curriculum import BOARD_KEY, POSITION_KEY, report_sample
from tirl.integrations.verl.data import export_tasks, task_of_row
from tirl.models.tiny import train_tokenizer
from tirl.tasks import make_source

RATES = {"product": 0.0, "chain": 0.5, "mod": 1.0}  # arithmetic tasks' `kind`: known rates
GROUP, BATCH = 4, 4


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    arithmetic = make_source({"source": "arithmetic"})
    texts = [arithmetic.item("train", i).problem for i in range(50)]
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(texts, vocab_size=300, chat_template=True).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """`tirl verl data`'s train and test files: arithmetic tasks of three kinds."""
    tmp = tmp_path_factory.mktemp("curriculum")
    entries = [{"source": "arithmetic", "weight": 1}]
    export_tasks(entries, "train", 60, tmp / "train.parquet", "cir_fences")
    export_tasks(entries, "test", 4, tmp / "test.parquet", "cir_fences")
    return tmp


def data_config(tmp: Path, run: str, metrics: Path | None = None):
    """verl's generated data config with what `tirl verl config` sets for the curriculum
    (`run`: the board's run name; `metrics`: the per-step metrics file, if any)."""
    import verl

    base = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(base).data
    settings = {
        "train_files": str(tmp / "train.parquet"),
        "val_files": str(tmp / "test.parquet"),
        "train_batch_size": BATCH,
        "seed": 5,
        "max_prompt_length": 256,
        "filter_overlong_prompts": False,
        "cache_dir": str(tmp / "cache"),
        "custom_cls.path": "pkg://tirl.integrations.verl.curriculum",
        "custom_cls.name": "CurriculumDataset",
        "dataloader_num_workers": 0,
        "tirl_curriculum": {
            "key": ["kind"], "band": [0.2, 0.8], "window": 4, "min_groups": 1,
            "explore": 0.1, "order_by": None, "widen_share": 0.5, "lookahead": 16,
            "group_size": GROUP, "run": run,
            **({} if metrics is None else {"batch_size": BATCH, "metrics_file": str(metrics)}),
        },
    }  # fmt: skip
    for key, value in settings.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def train_loader(config, tokenizer):
    """The train dataloader as verl's v1 trainer makes it (`_init_dataloader`)."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    dataset = create_rl_dataset(config.train_files, config, tokenizer, None)
    return StatefulDataLoader(
        dataset=dataset,
        batch_size=config.train_batch_size,
        num_workers=config.dataloader_num_workers,
        drop_last=True,
        collate_fn=collate_fn,
        sampler=create_rl_sampler(config, dataset),
    )


def run_steps(loader, steps: int) -> list[tuple[int, str]]:
    """Synchronous steps: fetch a batch (restarting the iterator at an epoch's end, as verl's
    `_fetch_one_gen_batch` does), then every one of a row's GROUP samples reports."""
    drawn = []
    it = iter(loader)
    for _ in range(steps):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        for extra_info in batch["extra_info"]:
            kind = task_of_row(extra_info).meta["kind"]
            drawn.append((extra_info[POSITION_KEY], kind))
            for k in range(GROUP):
                asyncio.run(report_sample(extra_info, k < RATES[kind] * GROUP))
    return drawn


def test_the_dataset_draws_the_buckets_the_pass_rates_say(exported, tokenizer, tmp_path):
    metrics = tmp_path / "run" / "curriculum_metrics.jsonl"
    loader = train_loader(data_config(exported, "curriculum-draws", metrics), tokenizer)
    drawn = run_steps(loader, steps=25)  # past an epoch of the 60 rows
    assert [p for p, _ in drawn] == list(range(25 * BATCH))  # positions in order
    late = Counter(kind for _, kind in drawn[40:])
    assert late["chain"] / sum(late.values()) > 0.8  # the only bucket inside the band
    # the per-step metrics verl cannot log: every step's but the last, its draws' shares
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(24))
    for r in records:
        kinds = Counter(kind for p, kind in drawn if p // BATCH == r["step"])
        assert {k: r[f"curriculum/{k}/share"] * BATCH for k in kinds} == dict(kinds)
    assert records[-1]["curriculum/chain/pass_rate"] == 0.5


def test_a_resume_from_verls_data_checkpoint_draws_the_same_stream(exported, tokenizer, tmp_path):
    whole = run_steps(train_loader(data_config(exported, "resume-a"), tokenizer), steps=12)

    loader = train_loader(data_config(exported, "resume-b"), tokenizer)
    first = run_steps(loader, steps=5)
    torch.save(loader.state_dict(), tmp_path / "data.pt")  # verl's _save_checkpoint

    resumed = train_loader(data_config(exported, "resume-c"), tokenizer)  # a fresh board
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False))
    assert first + run_steps(resumed, steps=7) == whole


def test_the_validation_set_is_served_plainly(exported, tokenizer):
    from verl.trainer.ppo.utils import create_rl_dataset

    config = data_config(exported, "curriculum-val")
    val = create_rl_dataset(config.val_files, config, tokenizer, None, is_train=False)
    rows = [val[i] for i in range(len(val))]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2, 3]
    assert all(POSITION_KEY not in r["extra_info"] for r in rows)


def test_the_agent_loop_reports_each_training_sample_to_the_named_actor(
    local_ray, agent_worker_factory, policy, chat_tokenizer, scripted
):
    import ray

    server = HFServer(policy, chat_tokenizer, version=0)
    worker, config, tmp = agent_worker_factory(server)
    batch = dataset_batch(
        rows_of([scripted.answer, scripted.held_out]), config, chat_tokenizer, tmp
    )
    board = "tirl-curriculum:loop-report-test"
    for position, extra_info in zip((5, 6), batch.non_tensor_batch["extra_info"], strict=True):
        extra_info.update({POSITION_KEY: position, BOARD_KEY: board})
    out = generate(worker, batch.repeat(2, interleave=True))

    reports = ray.get(ray.get_actor(board).take.remote())
    acc = out.non_tensor_batch["acc"]
    assert sorted(reports) == sorted((5, bool(a)) for a in acc[:2])  # the test row: none
