"""Reading `tirl synth` output files as demonstrations: the tokens are the text the file shows,
and every bad file is one ConfigError line naming file:line."""

from __future__ import annotations

import json

import pytest

from tirl.config import ConfigError
from tirl.protocol.segments import SegmentKind
from tirl.synth.formats import load_sft_trajectories, parse_solution, sft_record
from tirl.synth.records import Item
from tirl.tasks import Code, Think
from tirl.tasks.demos import demo_trajectory
from tirl.tasks.prompts import PromptRenderer
from tirl.tasks.sft_file import read_sft_file, read_sft_records

SOLUTION = (
    "<think>Multiply.</think>\n<code>\nprint(6 * 7)\n</code>\n<interpreter>\n40\n</interpreter>"
    "\nCheck it.\n<code>\nprint(42 // 6)\n</code>\nSo the answer is \\boxed{42}."
)


def item(steps_text: str = SOLUTION) -> Item:
    it = Item("x", "What is 6 times 7?", "42", steps=parse_solution(steps_text), source="in:1")
    it.steps[1].output = "42"  # the real output, as the replace stage sets it
    it.steps[3].output = "7"
    it.steps[3].status = "ok"
    return it


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize("protocol", ["agentmath_tags", "cir_fences"])
def test_records_become_the_text_the_file_shows(tmp_path, tokenizer, protocol):
    rec = sft_record(item(), protocol)
    path = write(tmp_path / "t.jsonl", [rec, rec])
    (problem, parts), _ = read_sft_file(path, protocol)
    assert problem == "What is 6 times 7?"
    assert [type(p) for p in parts] == [Think, Code, Think, Code, Think]
    assert parts[1] == Code("print(6 * 7)", "42")  # the real output, not the teacher's 40
    traj = demo_trajectory(PromptRenderer(tokenizer, protocol), problem, parts, None, {})
    assert "".join(s.text for s in traj.segments) == rec["text"]
    assert [(s.kind.value, s.text) for s in traj.segments] == [
        (p["kind"], p["text"]) for p in rec["parts"]
    ]
    for seg in traj.segments:  # each segment tokenized on its own
        want = tokenizer(seg.text, add_special_tokens=False)["input_ids"]
        assert seg.ids[: len(want)] == want
    assert traj.ids[-1] == tokenizer.eos_token_id
    tool = [s for s in traj.segments if s.kind is SegmentKind.TOOL]
    assert len(tool) == 2 and "40" not in tool[0].text


def test_the_synth_loader_reads_through_the_same_reader(tmp_path, tokenizer):
    path = write(tmp_path / "t.jsonl", [sft_record(item(), "cir_fences")])
    (traj,) = load_sft_trajectories(path, tokenizer, "cir_fences")
    (rec,) = read_sft_records(path, "cir_fences")
    want = demo_trajectory(PromptRenderer(tokenizer, "cir_fences"), rec.problem, rec.parts)
    assert traj.ids == want.ids and traj.loss_mask == want.loss_mask
    assert traj.meta == {"id": "x", "answer": "42"}
    assert [c.status for c in traj.tool_calls] == ["ok", "ok"]


def test_chat_prompts_for_file_demonstrations(tmp_path):
    from tirl.envs.arithmetic import ArithmeticEnv
    from tirl.models.tiny import IM_END, train_tokenizer

    texts = [it.question for it in ArithmeticEnv().items("train", 50)] + [SOLUTION] * 5
    chat = train_tokenizer(texts, vocab_size=320, chat_template=True)
    path = write(tmp_path / "t.jsonl", [sft_record(item(), "agentmath_tags")])
    renderer = PromptRenderer(chat, "agentmath_tags")
    (traj,) = load_sft_trajectories(path, chat, renderer=renderer)
    assert traj.segments[0].ids == renderer.prompt_ids("What is 6 times 7?")
    assert traj.ids[-1] == chat.convert_tokens_to_ids(IM_END)


def bad_cases(tmp_path):
    good = sft_record(item(), "cir_fences")

    def without(name):
        return {k: v for k, v in good.items() if k != name}

    def with_step(step):
        return {**good, "steps": [*good["steps"], step]}

    return [
        ("not json", "{oops\n", "t.jsonl:1: not JSON"),
        ("empty", "\n\n", "t.jsonl:1: empty SFT file (no records)"),
        ("list", "[1, 2]\n", "t.jsonl:1: not a JSON object (got list)"),
        ("no problem", without("problem"), "t.jsonl:1: missing field 'problem'"),
        ("no answer", without("answer"), "t.jsonl:1: missing field 'answer'"),
        ("no steps", without("steps"), "t.jsonl:1: missing field 'steps'"),
        ("no protocol", without("protocol"), "t.jsonl:1: missing field 'protocol'"),
        (
            "other protocol",
            {**good, "protocol": "agentmath_tags"},
            "t.jsonl:1: written in agentmath_tags, the run uses cir_fences",
        ),
        (
            "unknown protocol",
            {**good, "protocol": "xml"},
            "t.jsonl:1: unknown protocol 'xml'",
        ),
        (
            "unknown kind",
            with_step({"kind": "image", "text": "x"}),
            "t.jsonl:1: step 5 has unknown kind 'image' (expected 'text' or 'code')",
        ),
        ("code without text", with_step({"kind": "code"}), "t.jsonl:1: step 5 (code) has no text"),
        ("empty steps", {**good, "steps": []}, "t.jsonl:1: 'steps' must be a non-empty list"),
    ]


def test_each_bad_input_is_one_line_naming_file_and_line(tmp_path):
    for name, content, message in bad_cases(tmp_path):
        path = tmp_path / "t.jsonl"
        if isinstance(content, dict):
            content = json.dumps(content) + "\n"
        path.write_text(content)
        with pytest.raises(ConfigError) as e:
            read_sft_file(path, "cir_fences")
        assert message in str(e.value) and "\n" not in str(e.value), name
    good = json.dumps(sft_record(item(), "cir_fences"))
    (tmp_path / "t.jsonl").write_text(f"{good}\n\n{good}\n{{bad\n")
    with pytest.raises(ConfigError, match="t.jsonl:4: not JSON"):  # the line counts blanks
        read_sft_file(tmp_path / "t.jsonl", "cir_fences")
    with pytest.raises(ConfigError, match="missing.jsonl: no such SFT file"):
        read_sft_file(tmp_path / "missing.jsonl", "cir_fences")
