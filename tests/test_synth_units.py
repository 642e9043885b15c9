"""The synth pieces on their own: filters, format correction, records, config, SFT loading,
and the RACES teacher-free path."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from tirl.cli import main
from tirl.config import ConfigError, load_config
from tirl.protocol.segments import SegmentKind
from tirl.synth.config import InputConfig, SynthConfig
from tirl.synth.filters import ContaminationIndex, ast_depth, code_limit_reason
from tirl.synth.formats import FormatError, load_sft_trajectories, parse_solution, sft_record
from tirl.synth.prompts import CODEIFY_EXAMPLES, codeify_messages
from tirl.synth.records import Item, RecordError, Rejected, read_records


def test_ngram_contamination_ignores_case_and_punctuation_and_catches_short_copies():
    index = ContaminationIndex(
        ["What is 2+2?", "Find all real x such that x squared equals four"], 5
    )
    assert index.contaminated("FIND all real x, such that x squared equals four!")
    assert index.contaminated("Problem: what is 2 + 2? Show work.")  # a short benchmark copied
    assert not index.contaminated("Find all real y such that y cubed equals eight")


def test_code_limits():
    assert ast_depth("x = 1") == 3
    assert code_limit_reason("print(1+1+1+1+1+1+1+1)", 8, 10) == "AST too deep"
    assert code_limit_reason("\n".join(f"a{i} = {i}" for i in range(11)), 8, 10) == "too many lines"
    assert code_limit_reason("print(1)", 8, 10, min_depth=5) == "trivial code"
    assert code_limit_reason("print(sum(range(10)))", 8, 10) is None


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think>\n<code>\nprint(1)\n</code>\n<interpreter>\n1\n</interpreter>\nso \\boxed{1}",
        "a\n```python\nprint(1)\n```\n```output\n1\n```\nso \\boxed{1}",
        "a\n```py\nprint(1)  \n```\n\n```output\n1\n```\nso \\boxed{1}",
    ],
)
def test_format_correction_reads_every_convention_the_same(text):
    steps = parse_solution(text)
    assert [(s.kind, s.text.strip(), s.simulated) for s in steps] == [
        ("text", "a", None),
        ("code", "print(1)", "1"),
        ("text", "so \\boxed{1}", None),
    ]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<code>\nprint(1)\n", "unclosed or unknown block"),
        ("```js\nx\n```", "unclosed or unknown block"),
        ("<interpreter>\n1\n</interpreter>", "output block without its code block"),
        ("just text \\boxed{1}", "no code block"),
        ("<code>\n\n</code>", "empty code block"),
    ],
)
def test_unrecoverable_formats_are_rejected_with_a_reason(text, reason):
    with pytest.raises(FormatError) as e:
        parse_solution(text)
    assert e.value.reason == reason


def test_bad_records_name_file_and_line_or_are_counted_when_skipped(tmp_path):
    path = tmp_path / "in.jsonl"
    good = {"id": "a", "problem": "p", "solution": "s", "answer": "1"}
    path.write_text(json.dumps(good) + "\n{not json\n" + json.dumps({"problem": "q"}) + "\n")
    with pytest.raises(RecordError, match=r"in.jsonl:2: bad JSON"):
        list(read_records(str(path), InputConfig()))
    out = list(read_records(str(path), InputConfig(skip_bad_records=True)))
    assert [type(r) for r in out] == [Item, Rejected, Rejected]
    assert [r.reason for r in out[1:]] == ["bad JSON", "missing field 'answer'"]
    with pytest.raises(RecordError, match="no such input file"):
        list(read_records(str(tmp_path / "nope.jsonl"), InputConfig()))
    with pytest.raises(RecordError, match="missing field 'question'"):
        list(read_records(str(path), InputConfig(problem_field="question")))


def test_config_errors_are_one_line_and_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="teacher.url is required"):
        load_config(SynthConfig, None, [])
    with pytest.raises(ConfigError, match="teacher.concurrency must be in \\[1, 10000\\], got 0"):
        load_config(SynthConfig, None, ["teacher.url=http://127.0.0.1:1", "teacher.concurrency=0"])
    with pytest.raises(ConfigError, match="output_format must name a registered protocol"):
        load_config(SynthConfig, None, ["output_format=xml"])
    with pytest.raises(ConfigError, match="stages.self_correct needs stages.execute"):
        load_config(SynthConfig, None, ["stages.execute=false", "teacher.url=http://127.0.0.1:1"])


def test_cli_user_errors_are_one_line(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    data.write_text('{"id": 1, "problem": "p", "solution": "s"}\n')
    url = "teacher.url=http://127.0.0.1:9"
    cases = [
        (["--input", str(tmp_path / "missing.jsonl")], "no such file"),
        ([], "missing field 'answer'"),
        (["teacher.concurrency=zero"], "teacher.concurrency must be an int"),
        (["limits.max_lines=0"], "max_lines must be >= 1"),
    ]
    for extra, message in cases:
        args = ["synth", "run", url, "stages.decontaminate=false", *extra]
        if "--input" not in extra:
            args += ["--input", str(data)]
        assert main([*args, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    with pytest.raises(SystemExit) as e:
        main(["synth", "run", "--help"])
    assert e.value.code == 0


def test_sft_loader_tokenizes_segments_separately_and_masks_tool_output(tmp_path, tokenizer):
    item = Item(
        "x",
        "What is 6 times 7?",
        "42",
        steps=parse_solution(
            "<think>Multiply.</think>\n<code>\nprint(6 * 7)\n</code>\n<interpreter>\n40\n</interpreter>"
            "\nThe answer is \\boxed{42}."
        ),
    )
    item.steps[1].output = "42"  # the real output, as the replace stage sets it
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(sft_record(item, "agentmath_tags")) + "\n")
    for protocol, marker in (("agentmath_tags", "<interpreter>"), (None, "<interpreter>")):
        (traj,) = load_sft_trajectories(path, tokenizer, protocol)
        kinds = [s.kind for s in traj.segments]
        assert kinds == [SegmentKind.PROMPT, SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.MODEL]
        tool = traj.segments[2]
        assert marker in tool.text and "42" in tool.text and "40" not in tool.text
        assert tool.ids == tokenizer(tool.text, add_special_tokens=False)["input_ids"]
        mask = traj.loss_mask
        start = len(traj.segments[0].ids) + len(traj.segments[1].ids)
        assert set(mask[start : start + len(tool.ids)]) == {0}
        assert traj.segments[-1].ids[-1] == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="written in agentmath_tags, the run uses cir_fences"):
        load_sft_trajectories(path, tokenizer, "cir_fences")  # an error, not a re-render
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: missing field 'problem'"):
        load_sft_trajectories(bad, tokenizer)


def test_races_trajectories_are_executed_and_score_one(tmp_path):
    assert main(["synth", "races", "--out", str(tmp_path), "-n", "6", "--sizes", "2-3"]) == 0
    records = [
        json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
    ]
    stats = json.loads((tmp_path / "stats.json").read_text())["stages"]
    (races,) = stats
    assert races["in"] == 6 == races["out"] + races["rejected"] and len(records) == races["out"] > 0
    for rec in records:
        codes = [s for s in rec["steps"] if s["kind"] == "code"]
        assert all(s["status"] == "ok" and s["output"] == s["real"] for s in codes)
        model = "".join(p["text"] for p in rec["parts"] if p["kind"] == "model")
        assert model.rstrip().endswith(rec["answer"])  # scored 1 by the task's verifier
    # a rerun skips the composites already done
    assert main(["synth", "races", "--out", str(tmp_path), "-n", "6", "--sizes", "2-3"]) == 0
    assert len((tmp_path / "stages" / "01_races.jsonl").read_text().splitlines()) == 6


def test_races_format_is_any_registered_protocol_and_refuses_others_in_one_line(tmp_path, capsys):
    out = tmp_path / "fences"
    assert main(["synth", "races", "--out", str(out), "-n", "2", "--format", "cir_fences"]) == 0
    (first, *_) = (out / "trajectories.jsonl").read_text().splitlines()
    assert json.loads(first)["protocol"] == "cir_fences"
    capsys.readouterr()  # the first run's progress bar
    assert main(["synth", "races", "--out", str(tmp_path / "x"), "--format", "nope"]) == 2
    err = capsys.readouterr().err
    registered = "agentmath_tags, cir_fences, hermes_tools"
    assert err == f"tirl: error: --format nope: must name a registered protocol ({registered})\n"
    assert not (tmp_path / "x").exists()


def test_parquet_input_reads_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"id": "a", "problem": "p", "solution": "s", "answer": 3}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    (item,) = read_records(str(tmp_path / "in.parquet"), InputConfig())
    assert (item.id, item.answer, item.source.endswith("in.parquet:row 1")) == ("a", "3", True)
    try:
        import datasets  # noqa: F401  (then hf: would go to the network: not tested here)
    except ImportError:
        with pytest.raises(RecordError, match="needs `datasets`"):
            list(read_records("hf:owner/name", InputConfig()))


def test_codeify_examples_come_first_as_earlier_turns_and_print_what_they_show():
    plain = codeify_messages("Calculate 2 + 3.", "2 + 3 = 5.")
    shown = codeify_messages("Calculate 2 + 3.", "2 + 3 = 5.", examples=2)
    assert [m["role"] for m in plain] == ["system", "user"]
    assert [m["role"] for m in shown] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert shown[0] == plain[0] and shown[-1] == plain[-1]
    assert shown[1]["content"].startswith(f"Problem:\n{CODEIFY_EXAMPLES[0][0]}\n")
    for problem, cot, rewritten in CODEIFY_EXAMPLES:
        steps = parse_solution(rewritten)
        answer = cot.rsplit("\\boxed{", 1)[1].split("}")[0]
        assert steps[-1].kind == "text" and steps[-1].text.endswith(f"\\boxed{{{answer}}}")
        session: dict = {}  # one session per example, as the execute stage runs them
        for step in (s for s in steps if s.kind == "code"):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(step.text, session)  # noqa: S102 - the examples above, written here
            assert printed.getvalue().strip() == step.simulated, (problem, step.text)
    with pytest.raises(ConfigError, match="codeify_examples"):
        load_config(SynthConfig, overrides=[f"codeify_examples={len(CODEIFY_EXAMPLES) + 1}"])
