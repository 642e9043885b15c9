"""verl 0.9.1's own datasets read what `tirl verl data` / `tirl verl sft-data` write.

RL: `RLHFDataset` keeps every exported row (none is filtered out as unrenderable), and yields
it with `extra_info.tirl_task` intact (the task it rebuilds is the exported one and scores),
`raw_prompt` the exported messages and `agent_name` tirl's; verl's own prompt tokens for those
messages equal tirl's `PromptRenderer` ids, so the loop may use either. SFT:
`MultiTurnSFTDataset` tokenizes the exported messages (its own per-turn vs whole-conversation
check passes), and its loss mask is 0 on every token of the interpreter's output and 1 on every
token of the model's text, located by character offsets in the rendered conversation, not by
verl's own per-message bookkeeping.
"""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from tirl.integrations.verl.data import (
    export_sft,
    export_tasks,
    prompt_settings_of_row,
    read_rows,
    task_of_row,
)
from tirl.models.tiny import train_tokenizer
from tirl.synth.formats import parse_solution, sft_record
from tirl.synth.records import Item
from tirl.tasks import make_source
from tirl.tasks.prompts import DEFAULT_SYSTEM_PROMPTS

SMALL_RACES = {"source": "races", "min_size": 1, "max_size": 2}
SOLUTION = (
    "<think>Multiply.</think>\n<code>\nprint(6 * 7)\n</code>\n<interpreter>\n40\n</interpreter>"
    "\nCheck it.\n<code>\nprint(42 // 6)\n</code>\nSo the answer is \\boxed{42}."
)


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    """A tiny chat tokenizer (Qwen2.5's turn format), saved and loaded back as verl loads one."""
    arithmetic = make_source({"source": "arithmetic"})
    texts = [arithmetic.item("train", i).problem for i in range(100)]
    texts += [SOLUTION] * 5 + list(DEFAULT_SYSTEM_PROMPTS.values())
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(texts, vocab_size=400, chat_template=True).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_rlhf_dataset_yields_every_row_with_its_task(tmp_path, chat_tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    entries = [{"source": "arithmetic", "weight": 1}, {**SMALL_RACES, "weight": 1}]
    path = tmp_path / "train.parquet"
    export_tasks(entries, "train", 6, path, "agentmath_tags")
    rows = read_rows(path)
    config = OmegaConf.create(
        {"max_prompt_length": 4096, "cache_dir": str(tmp_path / "cache"), "shuffle": False}
    )
    dataset = RLHFDataset([str(path)], chat_tokenizer, config)
    assert len(dataset) == len(rows) == 6  # nothing filtered out
    builder = create_continuous_token_builder(chat_tokenizer)
    for row, i in zip(rows, range(len(dataset)), strict=True):
        item = dataset[i]
        assert item["agent_name"] == "tirl" and item["data_source"] == row["data_source"]
        assert item["extra_info"]["tirl_task"] == row["extra_info"]["tirl_task"]
        assert item["reward_model"]["ground_truth"] == row["reward_model"]["ground_truth"]
        assert item["index"] == i
        task = task_of_row(item["extra_info"])
        assert task == task_of_row(row["extra_info"])
        right = task.answer if task.meta["scoring"] == "races" else f"\\boxed{{{task.answer}}}"
        assert task.score(right).reward == 1.0
        assert [dict(m) for m in item["raw_prompt"]] == row["prompt"]
        renderer = prompt_settings_of_row(item["extra_info"]).renderer(chat_tokenizer)
        verl_ids = builder.build_initial_tokens(list(item["raw_prompt"]))
        assert list(verl_ids) == renderer.prompt_ids(task.problem)


def synth_records() -> list[dict]:
    item = Item("x", "What is 6 times 7?", "42", steps=parse_solution(SOLUTION), source="in:1")
    outputs = iter(["42", "7"])
    for step in item.steps:
        if step.kind == "code":
            step.output = next(outputs)
    return [sft_record(item, "agentmath_tags")]


@pytest.mark.parametrize("pad_mode", ["no_padding", "right"])
def test_multiturn_sft_masks_exactly_the_interpreter_output(tmp_path, chat_tokenizer, pad_mode):
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    synth = tmp_path / "trajectories.jsonl"
    synth.write_text("".join(json.dumps(r) + "\n" for r in synth_records()))
    path = tmp_path / "sft.parquet"
    export_sft(synth, path, "agentmath_tags")
    (row,) = read_rows(path)
    messages = row["messages"]
    config = OmegaConf.create({"max_length": 1024, "pad_mode": pad_mode, "truncation": "error"})
    dataset = MultiTurnSFTDataset(str(path), chat_tokenizer, config)
    sample = dataset[0]  # runs verl's own check: per-turn ids == whole-conversation ids
    loss_mask = sample["loss_mask"].tolist()

    # where each message's content lies in the rendered conversation, by character offsets
    rendered = chat_tokenizer.apply_chat_template(messages, tokenize=False)
    encoded = chat_tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    assert sample["input_ids"][: len(ids)].tolist() == ids
    assert all(m == 0 for m in loss_mask[len(ids) :])  # padding
    spans, cursor = [], 0
    for message in messages:
        start = rendered.index(message["content"], cursor)
        spans.append((message["role"], start, start + len(message["content"])))
        cursor = start + len(message["content"])
    counts = {"tool": 0, "assistant": 0}
    for (begin, end), mask in zip(encoded["offset_mapping"], loss_mask, strict=False):
        inside = [role for role, s, e in spans if s <= begin < end <= e]
        piece = rendered[begin:end]
        if inside:  # a token of a message's content: loss iff the model wrote it
            (role,) = inside
            assert mask == (role == "assistant"), (role, piece)
            counts[role] = counts.get(role, 0) + 1
        elif mask:  # template text: only the end of an assistant turn is trained on
            before = [role for role, s, e in spans if e <= begin][-1]
            assert before == "assistant" and piece in ("<|im_end|>", "\n"), piece
    assert counts["tool"] > 0 and counts["assistant"] > 0
    # what is trained on, put together: the model's text and the end of each of its turns
    trained = chat_tokenizer.decode([i for i, m in zip(ids, loss_mask, strict=False) if m])
    turns = [m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant"]
    assert trained == "".join(turns)
    assert isinstance(sample["input_ids"], torch.Tensor)


def test_plain_prompt_rows_load_with_the_length_filter_off(tmp_path):
    """A tokenizer without a chat template (a base model, tirl's tiny one): verl's length filter
    cannot render `prompt` and silently drops every row, so such runs turn it off; the loop then
    renders tirl's plain prompt from the row's settings."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from tirl.tasks.prompts import PLAIN_TEMPLATE

    plain = train_tokenizer(["Compute 384 * 106."] * 20, vocab_size=300)
    path = tmp_path / "plain.parquet"
    export_tasks([{"source": "arithmetic"}], "train", 3, path, "cir_fences")
    settings = {"cache_dir": str(tmp_path / "cache")}
    dropped = RLHFDataset([str(path)], plain, OmegaConf.create(settings))
    assert len(dropped) == 0  # verl 0.9.1: each failed render counts as too long
    kept = RLHFDataset(
        [str(path)], plain, OmegaConf.create({**settings, "filter_overlong_prompts": False})
    )
    assert len(kept) == 3
    item = kept[0]
    task = task_of_row(item["extra_info"])
    renderer = prompt_settings_of_row(item["extra_info"]).renderer(plain)
    assert not renderer.chat
    assert renderer.prompt_text(task.problem) == PLAIN_TEMPLATE.format(problem=task.problem)
