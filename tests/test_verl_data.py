"""`tirl verl data` / `tirl verl sft-data`: tasks and synth files as verl parquet, without verl.

Every RL row carries its task: rebuilt from the row (`task_of_row`), it scores the reference
answer 1 and a wrong one 0 for every source kind (arithmetic, RACES, a dataset file, a
benchmark). Rows survive parquet unchanged, also for a mixture of sources (whose task metas
differ), and an export is deterministic. SFT rows cut the one assistant turn at the interpreter:
put together, the messages are exactly the text tirl trains on, with every model segment an
assistant message (loss 1 in verl) and every interpreter output a tool message (loss 0). verl
itself loads both files in tests/verl/test_verl_data_loads.py. Bad input is one line naming the
key, task, file or line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tirl.config import ConfigError
from tirl.integrations.verl.cli import add_parser
from tirl.integrations.verl.data import (
    PromptSettings,
    export_sft,
    export_tasks,
    prompt_settings_of_row,
    read_rows,
    sft_rows,
    task_of_row,
    task_rows,
)
from tirl.protocol import get_protocol
from tirl.synth.formats import parse_solution, sft_record
from tirl.synth.records import Item
from tirl.tasks import Task, make_source
from tirl.tasks.prompts import default_system_prompt
from tirl.tasks.serialize import task_to_dict

DATA_DIR = Path(__file__).parents[1].parent / "shared" / "data" / "benchmarks"
SMALL_RACES = {"source": "races", "min_size": 1, "max_size": 2}
MATH_ROWS = [
    {"problem": "What share of a pizza is left after eating a quarter?", "answer": "\\frac{3}{4}"},
    {"problem": "Expand (x+i)(x-i).", "answer": "x^2+1"},
    {"problem": "How many primes are below 10?", "answer": "4"},
]


# ---------------------------------------------------------------------------- helpers


def tirl_main(argv: list[str]) -> tuple[int, str, str]:
    """Run `tirl ...` and return (exit code, stdout, stderr). Through `tirl.cli.main` once it
    has the `verl` command; until the lead wires it in, the same steps on a parser holding only
    `verl` (parse, run, a ConfigError as one line and exit 2)."""
    from tirl import cli
    from tirl.cliargs import ArgumentParser

    out, err = io.StringIO(), io.StringIO()
    subs = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if "verl" in subs[0].choices:
                code = cli.main(argv)
            else:
                parser = ArgumentParser(prog="tirl")
                add_parser(parser.add_subparsers(dest="command", required=True))
                try:
                    args = parser.parse_args(argv)
                    code = args.func(args)
                except ConfigError as e:
                    print(f"tirl: error: {e}", file=sys.stderr)
                    code = 2
        except SystemExit as e:  # --help
            code = e.code
    return code, out.getvalue(), err.getvalue()


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def right_and_wrong(task: Task) -> tuple[str, str]:
    """Model texts that answer `task` right and wrong, in its scorer's form."""
    if task.meta["scoring"] == "races":
        return task.answer, "<answer>\nnothing\n</answer>"
    if task.meta["scoring"] == "integer":
        return f"\\boxed{{{task.answer}}}", f"\\boxed{{{int(task.answer) + 1}}}"
    return f"So the answer is \\boxed{{{task.answer}}}.", "So the answer is \\boxed{123456789}."


def source_tasks(case: str, tmp_path: Path) -> list[Task]:
    if case == "arithmetic":
        source = make_source({"source": "arithmetic"})
        return [source.item("train", i) for i in range(3)]
    if case == "races":
        source = make_source(SMALL_RACES)
        return [source.item("train", i) for i in range(3)]
    if case == "dataset":
        path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
        source = make_source({"source": "dataset", "path": str(path), "test_share": 0.0})
        return [source.item("train", i) for i in range(3)]
    if not (DATA_DIR / "math500.jsonl").is_file():
        pytest.skip(f"the public benchmark files are not present at {DATA_DIR}")
    source = make_source(
        {"source": "benchmark", "benchmark": "math500", "benchmark_dir": str(DATA_DIR)}
    )
    return [source.item("test", i) for i in range(2)]


# ---------------------------------------------------------------------------- RL rows


@pytest.mark.parametrize("case", ["arithmetic", "races", "dataset", "benchmark"])
def test_every_row_rebuilds_a_task_that_scores_right_one_and_wrong_zero(case, tmp_path):
    tasks = source_tasks(case, tmp_path)
    rows = task_rows(tasks, "cir_fences")
    system = default_system_prompt(get_protocol("cir_fences"))
    for i, (task, row) in enumerate(zip(tasks, rows, strict=True)):
        assert row["data_source"] == task.source == case
        assert row["ability"] == ("races" if case == "races" else "math")
        assert row["reward_model"] == {"style": "rule", "ground_truth": task.answer}
        assert row["agent_name"] == "tirl"
        assert row["prompt"] == [
            {"role": "system", "content": system},
            {"role": "user", "content": task.problem},
        ]
        info = row["extra_info"]
        assert (info["index"], info["split"], info["task_id"]) == (i, task.split, task.id)
        copy = task_of_row(info)
        assert copy == task and copy.meta == json.loads(json.dumps(task.meta))
        right, wrong = right_and_wrong(task)
        assert copy.score(right).reward == 1.0 and copy.score(right).correct, (task.id, right)
        assert copy.score(wrong).reward == 0.0 and not copy.score(wrong).correct, task.id


def test_a_mixture_survives_parquet_unchanged_and_exports_deterministically(tmp_path):
    # arithmetic and RACES metas differ: as a parquet struct, each would come back padded with
    # the other's keys; as JSON text the task comes back as it was written
    entries = [{"source": "arithmetic", "weight": 2}, {**SMALL_RACES, "weight": 1}]
    first = export_tasks(entries, "train", 6, tmp_path / "a.parquet", "agentmath_tags")
    again = export_tasks(entries, "train", 6, tmp_path / "b.parquet", "agentmath_tags")
    assert first.rows == 6 and first.by_source == {"arithmetic": 4, "races": 2}
    rows = read_rows(first.path)
    assert rows == read_rows(again.path)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    for row in rows:
        task = task_of_row(row["extra_info"])
        assert json.loads(row["extra_info"]["tirl_task"]) == task_to_dict(task)
        assert set(task.meta) == set(json.loads(row["extra_info"]["tirl_task"])["meta"])
        assert task.score(right_and_wrong(task)[0]).reward == 1.0
        settings = prompt_settings_of_row(row["extra_info"])
        assert settings == PromptSettings(get_protocol("agentmath_tags"), None, None)
        assert row["prompt"] == settings.messages(task.problem)
    assert [r["extra_info"]["index"] for r in rows] == list(range(6))


def test_a_run_config_exports_its_train_mixture_and_its_eval_sets(tmp_path):
    from tirl.config import load_config
    from tirl.run.build import eval_sets
    from tirl.run.config import RunConfig
    from tirl.tasks import Mixture

    config = write_config(
        tmp_path / "run.yaml",
        {
            "protocol": {"name": "agentmath_tags", "boundary": "stop_token"},
            "seed": 3,
            "prompt": {"system": "Be brief."},
            "data": {
                "train": [{"source": "arithmetic", "weight": 2}, {**SMALL_RACES, "weight": 1}],
                "eval": [
                    {"name": "heldout", "items": 3},
                    {"name": "races_eval", "items": 2, **SMALL_RACES},
                ],
            },
        },
    )
    train = export_tasks(config, "train", 3, tmp_path / "train.parquet", start=5)
    rows = read_rows(train.path)
    cfg = load_config(RunConfig, config)
    mixture = Mixture.from_entries(cfg.data.train, "data.train", cfg.seed)
    assert [task_of_row(r["extra_info"]) for r in rows] == mixture.items("train", 3, start=5)
    assert [r["extra_info"]["index"] for r in rows] == [5, 6, 7]
    info = rows[0]["extra_info"]
    assert (info["protocol"], info["boundary"], info["prompt_system"]) == (
        "agentmath_tags",
        "stop_token",
        "Be brief.",
    )
    assert rows[0]["prompt"][0] == {"role": "system", "content": "Be brief."}

    test = export_tasks(config, "test", None, tmp_path / "test.parquet")
    rows = read_rows(test.path)
    assert test.by_source == {"heldout": 3, "races_eval": 2}
    want = eval_sets(cfg, mixture)  # the pipeline's own evaluation sets
    got = {name: [] for name in want}
    for row in rows:
        got[row["data_source"]].append(task_of_row(row["extra_info"]))
    assert got == want and all(r["extra_info"]["split"] == "test" for r in rows)
    capped = export_tasks(config, "test", 1, tmp_path / "capped.parquet")
    assert capped.by_source == {"heldout": 1, "races_eval": 1}


def test_the_cli_writes_once_and_replaces_only_with_force(tmp_path):
    config = write_config(tmp_path / "run.yaml", {"data": {"train": [{"source": "arithmetic"}]}})
    out = tmp_path / "train.parquet"
    argv = ["verl", "data", str(config), "--split", "train", "--n", "4", "--out", str(out)]
    code, stdout, stderr = tirl_main(argv)
    assert (code, stderr) == (0, "") and f"wrote 4 rows to {out} (arithmetic 4)" in stdout
    before = out.read_bytes()
    code, _, stderr = tirl_main([*argv[:-4], "--n", "2", "--out", str(out)])
    assert code == 2 and stderr == f"tirl: error: {out}: exists; pass --force to replace it\n"
    assert out.read_bytes() == before
    code, stdout, _ = tirl_main([*argv[:-4], "--n", "2", "--out", str(out), "--force"])
    assert code == 0 and len(read_rows(out)) == 2
    for command in (["verl", "data", "--help"], ["verl", "sft-data", "--help"]):
        code, stdout, _ = tirl_main(command)
        assert code == 0 and "--out" in stdout and "--force" in stdout


@pytest.mark.parametrize(
    "case",
    ["unknown source", "train without --n", "not parquet", "benchmark trains nothing"],
)
def test_bad_export_requests_are_one_line_naming_the_key(tmp_path, case):
    train = [{"source": "arithmetic"}]
    if case == "unknown source":
        train = [{"source": "arithmetic"}, {"source": "nope"}]
    if case == "benchmark trains nothing":
        bench = write_jsonl(tmp_path / "bench.jsonl", MATH_ROWS)
        train = [{"source": "benchmark", "benchmark": str(bench)}]
    config = write_config(tmp_path / "run.yaml", {"data": {"train": train}, "sft": {"steps": 0}})
    n = [] if case == "train without --n" else ["--n", "2"]
    out = tmp_path / ("x.csv" if case == "not parquet" else "x.parquet")
    code, stdout, stderr = tirl_main(["verl", "data", str(config), *n, "--out", str(out)])
    expected = {
        "unknown source": f"{config}: data.train[1].source: unknown task source 'nope'",
        "train without --n": "--n: say how many train tasks to export",
        "not parquet": f"{out}: the output must be a .parquet file",
        "benchmark trains nothing": f"benchmark {tmp_path / 'bench.jsonl'} is for evaluation only",
    }[case]
    assert code == 2 and stdout == "" and not out.exists()
    assert stderr.startswith("tirl: error: ") and stderr.count("\n") == 1
    assert expected in stderr, stderr


def test_the_export_modules_do_not_import_verl():
    code = "import sys, tirl.integrations.verl.cli, tirl.integrations.verl.data;"
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] == 'verl'))"
    src = str(Path(__file__).parents[1] / "src")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_an_unserializable_task_is_an_error_naming_it_not_a_dropped_row():
    good = make_source({"source": "arithmetic"}).item("train", 0)
    judged = Task("judge/7", "train", "p", "a", scorer=lambda text: None, meta={"scoring": "llm"})
    with pytest.raises(ConfigError, match="cannot export task judge/7: scoring 'llm'") as e:
        task_rows([good, judged], "cir_fences")
    assert "\n" not in str(e.value)
    odd = Task(
        "odd/1", "train", "p", "1", scorer=good.scorer, meta={"scoring": "integer", "x": {1, 2}}
    )
    with pytest.raises(ConfigError, match="cannot export task odd/1: its meta is not JSON-safe"):
        task_rows([odd], "cir_fences")


def test_a_row_without_a_serialized_task_is_a_one_line_error():
    row = task_rows([make_source({"source": "arithmetic"}).item("train", 0)], "cir_fences")[0]
    info = row["extra_info"]
    cases = {
        "verl row 0: no extra_info.tirl_task": {k: v for k, v in info.items() if k != "tirl_task"},
        "verl row 0: extra_info.tirl_task is not JSON": {**info, "tirl_task": "{oops"},
        "verl row 0: extra_info.tirl_task: task arithmetic/train/0: unknown scoring": {
            **info,
            "tirl_task": info["tirl_task"].replace('"integer"', '"judge"'),
        },
        "verl row ?: no extra_info.tirl_task": None,
    }
    for message, extra in cases.items():
        with pytest.raises(ConfigError) as e:
            task_of_row(extra)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


# ---------------------------------------------------------------------------- SFT rows

SOLUTION = (
    "<think>Multiply.</think>\n<code>\nprint(6 * 7)\n</code>\n<interpreter>\n40\n</interpreter>"
    "\nCheck it.\n<code>\nprint(42 // 6)\n</code>\nSo the answer is \\boxed{42}."
)


def synth_record(protocol: str, solution: str = SOLUTION) -> dict:
    """A `tirl synth` record as `sft_record` writes it, real outputs filled in."""
    item = Item("x", "What is 6 times 7?", "42", steps=parse_solution(solution), source="in:1")
    outputs = iter(["42", "7"])
    for step in item.steps:
        if step.kind == "code":
            step.output = next(outputs)
    return sft_record(item, protocol)


@pytest.mark.parametrize("protocol", ["cir_fences", "agentmath_tags"])
@pytest.mark.parametrize("boundary", ["exact_match", "stop_token"])
def test_sft_messages_put_together_are_tirls_text_with_outputs_as_tool_turns(
    tmp_path, protocol, boundary
):
    record = synth_record(protocol)
    path = write_jsonl(tmp_path / "trajectories.jsonl", [record, record])
    rows = sft_rows(path, protocol, boundary)
    assert len(rows) == 2
    messages = rows[0]["messages"]
    proto = get_protocol(protocol, boundary)
    assert messages[:2] == [
        {"role": "system", "content": default_system_prompt(proto)},
        {"role": "user", "content": "What is 6 times 7?"},
    ]
    turns = messages[2:]
    roles = [m["role"] for m in turns]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]
    text = "".join(m["content"] for m in turns)
    if boundary == "exact_match":  # the file's own text is tirl's exact-match trajectory
        parts = [p for p in record["parts"] if p["kind"] != "prompt"]
        assert text == "".join(p["text"] for p in parts)
        assert [(m["role"], m["content"]) for m in turns] == [
            ("assistant" if p["kind"] == "model" else "tool", p["text"]) for p in parts
        ]
    # the interpreter's real outputs are in tool turns only; the model's text never is
    tools = [m["content"] for m in turns if m["role"] == "tool"]
    assert tools == [proto.render_output("42"), proto.render_output("7")]
    assistant = "".join(m["content"] for m in turns if m["role"] == "assistant")
    assert "print(6 * 7)" in turns[0]["content"] and "\\boxed{42}" in turns[-1]["content"]
    assert proto.render_output("42") not in assistant and "40" not in text  # not the teacher's
    if boundary == "stop_token":
        assert turns[0]["content"].endswith(proto.render_code("print(6 * 7)"))
    assert rows[0]["id"] == "x" and rows[0]["answer"] == "42"
    assert rows[0]["where"] == f"{path}:1" and rows[1]["where"] == f"{path}:2"


def test_a_record_ending_in_an_output_ends_with_an_empty_assistant_turn(tmp_path):
    record = synth_record("cir_fences", "Compute.\n```python\nprint(6 * 7)\n```")
    record["steps"] = record["steps"][:2]
    record["steps"][1]["output"] = "42"
    path = write_jsonl(tmp_path / "t.jsonl", [record])
    (row,) = sft_rows(path, "cir_fences", system="")
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert row["messages"][-1]["content"] == ""  # the model's turn ends after the output


def test_sft_export_round_trips_and_refuses_bad_lines_in_one_line(tmp_path):
    good = json.dumps(synth_record("agentmath_tags"))
    path = tmp_path / "trajectories.jsonl"
    path.write_text(f"{good}\n{good}\n")
    out = tmp_path / "sft.parquet"
    code, stdout, stderr = tirl_main(["verl", "sft-data", str(path), "--out", str(out)])
    assert code == 0 and stderr == "" and f"wrote 2 rows to {out}" in stdout
    written = read_rows(out)
    assert written == sft_rows(path)
    code, _, stderr = tirl_main(["verl", "sft-data", str(path), "--out", str(out)])
    assert code == 2 and "exists; pass --force" in stderr
    path.write_text(f"{good}\n{{bad\n")
    code, _, stderr = tirl_main(["verl", "sft-data", str(path), "--out", str(out), "--force"])
    assert code == 2 and stderr.startswith(f"tirl: error: {path}:2: not JSON (")
    assert stderr.count("\n") == 1
    assert read_rows(out) == written  # a refused export leaves the old file as it was
    path.write_text(f"{good}\n")
    code, _, stderr = tirl_main(
        ["verl", "sft-data", str(path), "--protocol", "cir_fences", "--out", str(out), "--force"]
    )
    assert code == 2 and f"{path}:1: written in agentmath_tags, the run uses cir_fences" in stderr
    with pytest.raises(ConfigError, match="missing.jsonl: no such SFT file"):
        export_sft(tmp_path / "missing.jsonl", tmp_path / "m.parquet")
