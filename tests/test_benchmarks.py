"""Benchmark loaders on the real public files, on hand-made files, and on bad input.

The real files live in shared/data/benchmarks/ beside the repository (README.md there gives the
row counts checked here). Nothing here touches the network: the `hf:` path is only exercised
with `datasets` made unimportable.
"""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from tirl.eval.benchmarks import (
    BENCHMARK_DIR_ENV,
    BENCHMARKS,
    BenchmarkItem,
    load_benchmark,
    load_races,
    races_task,
)

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"
needs_data = pytest.mark.skipif(
    not (DATA_DIR / "README.md").is_file(),
    reason=f"the public benchmark files are not present at {DATA_DIR}",
)

# Row counts from shared/data/benchmarks/README.md.
README_ROWS = {
    "math500": 500,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "olymmath-easy": 100,
    "olymmath-hard": 100,
}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- real files


@needs_data
@pytest.mark.parametrize("name", sorted(README_ROWS))
def test_real_file_loads_every_row_with_problem_answer_and_unique_id(name):
    items = load_benchmark(name, DATA_DIR)
    assert len(items) == README_ROWS[name] == BENCHMARKS[name].rows
    for item in items:
        assert isinstance(item, BenchmarkItem)
        assert item.problem.strip() and item.answer.strip()
        assert item.meta["benchmark"] == name
    assert len({item.id for item in items}) == len(items)


@needs_data
def test_amc_float_answers_become_integer_text():
    items = load_benchmark("amc23", DATA_DIR)
    assert not [it.answer for it in items if ".0" in it.answer]
    assert items[0].answer == "27" and items[0].meta["raw_answer"] == 27.0
    assert "-1" in {it.answer for it in items}  # -1.0 keeps its sign
    assert all(str(it.meta["answer_int"]) == it.answer for it in items)


@needs_data
def test_aime_leading_zeros_are_kept_and_noted():
    items = load_benchmark("aime24", DATA_DIR)
    padded = [it for it in items if it.answer.startswith("0")]
    assert len(padded) == 7  # README: 025 073 023 045 033 080 055
    item = next(it for it in padded if it.answer == "025")
    assert item.meta["answer_int"] == 25 and "leading zeros" in item.meta["answer_note"]


@needs_data
def test_aime25_answers_come_from_the_boxed_solution():
    items = load_benchmark("aime25", DATA_DIR)
    assert items[0].answer == "70"  # solution is exactly \boxed{70}
    assert all(it.meta["answer_from"] == "solution" for it in items)
    assert all(it.answer.isdigit() for it in items)
    assert [it.id for it in items[:2]] == ["aime25-0", "aime25-1"]  # no id column: line order


@needs_data
def test_math500_has_subject_categories_and_levels():
    items = load_benchmark("math500", DATA_DIR)
    assert all(it.category for it in items)
    assert len({it.category for it in items}) == 7
    assert {it.meta["level"] for it in items} == {1, 2, 3, 4, 5}


@needs_data
def test_olymmath_subject_counts_match_readme():
    easy = Counter(it.category for it in load_benchmark("olymmath-easy", DATA_DIR))
    assert easy == {"Geometry": 33, "Combinatorics": 29, "Algebra": 25, "Number Theory": 13}
    hard = Counter(it.category for it in load_benchmark("olymmath-hard", DATA_DIR))
    assert hard == dict.fromkeys(["Algebra", "Geometry", "Combinatorics", "Number Theory"], 25)


@needs_data
def test_path_alias_and_env_var_give_the_same_items(monkeypatch):
    by_name = load_benchmark("amc23", DATA_DIR)
    assert load_benchmark(DATA_DIR / "amc23.jsonl") == by_name  # file named like the default
    assert load_benchmark("AMC_2023", DATA_DIR) == by_name  # alias, case and _ do not matter
    monkeypatch.setenv(BENCHMARK_DIR_ENV, str(DATA_DIR))
    assert load_benchmark("amc23") == by_name


@needs_data
def test_parquet_gives_the_same_items_as_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [json.loads(line) for line in (DATA_DIR / "olymmath-en-easy.jsonl").open()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "olymmath-en-easy.parquet")
    from_parquet = load_benchmark("olymmath-easy", tmp_path)
    from_jsonl = load_benchmark("olymmath-easy", DATA_DIR)
    assert [(i.id, i.problem, i.answer, i.category) for i in from_parquet] == [
        (i.id, i.problem, i.answer, i.category) for i in from_jsonl
    ]
    assert from_parquet[0].meta["source"].endswith("olymmath-en-easy.parquet row 1")


# ---------------------------------------------------------------- HMMT and generic files


def test_hmmt_from_a_file_with_field_mapping(tmp_path):
    # MathArena-style columns: problem_idx, problem, answer, problem_type (a list)
    rows = [
        {"problem_idx": 1, "problem": "P1", "answer": "\\frac{1}{2}", "problem_type": ["Algebra"]},
        {"problem_idx": 2, "problem": "P2", "answer": "7", "problem_type": ["Geometry", "Combi"]},
    ]
    path = _write_jsonl(tmp_path / "feb25.jsonl", rows)
    items = load_benchmark("hmmt", path, fields={"id": "problem_idx"})
    assert [(i.id, i.answer, i.category) for i in items] == [
        ("1", "\\frac{1}{2}", "Algebra"),
        ("2", "7", "Geometry, Combi"),
    ]
    # the default file name in a directory
    _write_jsonl(tmp_path / "hmmt.jsonl", rows)
    assert load_benchmark("hmmt", tmp_path) == [
        BenchmarkItem(i.id, i.problem, i.answer, i.category, {**i.meta, "source": s})
        for i, s in zip(items, [f"{tmp_path / 'hmmt.jsonl'}:1", f"{tmp_path / 'hmmt.jsonl'}:2"])
    ]


def test_field_mapping_renames_columns(tmp_path):
    path = _write_jsonl(tmp_path / "custom.jsonl", [{"q": "What?", "gold": 3, "kind": "x"}])
    [item] = load_benchmark(path, fields={"problem": "q", "answer": "gold", "category": "kind"})
    assert (item.id, item.problem, item.answer, item.category) == ("custom-0", "What?", "3", "x")


def test_float_answers_in_hand_made_files(tmp_path):
    # AMC re-exported with text answers: "27.0" still means 27
    rows = [{"id": 0, "problem": "a", "answer": "27.0"}, {"id": 1, "problem": "b", "answer": -1.0}]
    path = _write_jsonl(tmp_path / "amc23.jsonl", rows)
    assert [it.answer for it in load_benchmark(path)] == ["27", "-1"]
    # anywhere else only real floats change, and a non-integral float keeps its digits
    rows = [{"problem": "a", "answer": 2.5}, {"problem": "b", "answer": "3.0"}]
    path = _write_jsonl(tmp_path / "other.jsonl", rows)
    assert [it.answer for it in load_benchmark(path)] == ["2.5", "3.0"]


def test_hf_source_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails; nothing is downloaded
    with pytest.raises(ImportError, match="pip install datasets"):
        load_benchmark("hmmt", "hf:MathArena/hmmt_feb_2025")
    with pytest.raises(ImportError, match="pip install datasets"):
        load_benchmark("hf:MathArena/hmmt_feb_2025")


# ---------------------------------------------------------------- bad input


def test_unknown_name_suggests_close_matches():
    with pytest.raises(ValueError, match="unknown benchmark 'aime42'.*Did you mean .*'aime24'"):
        load_benchmark("aime42")
    with pytest.raises(ValueError, match="Did you mean 'olymmath-hard'"):
        load_benchmark("olymath-hard")


def test_missing_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"no amc23 file in .*amc23\.jsonl"):
        load_benchmark("amc23", tmp_path)
    with pytest.raises(ValueError, match=r"nope\.jsonl does not exist"):
        load_benchmark(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="is a directory"):
        load_benchmark(tmp_path)


def test_name_without_source_or_env_var_says_where_to_point(monkeypatch):
    monkeypatch.delenv(BENCHMARK_DIR_ENV, raising=False)
    with pytest.raises(ValueError, match=BENCHMARK_DIR_ENV):
        load_benchmark("math500")


def test_row_without_answer_names_file_and_line(tmp_path):
    rows = [{"id": 0, "problem": "a", "answer": 1.0}, {"id": 1, "problem": "b"}]
    path = _write_jsonl(tmp_path / "amc23.jsonl", rows)
    with pytest.raises(ValueError, match=rf"{path}:2: no answer"):
        load_benchmark("amc23", path)


def test_row_without_answer_or_box_in_a_generic_file(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"problem": "a", "solution": "no box"}])
    with pytest.raises(ValueError, match=rf"{path}:1: no answer column and no \\boxed"):
        load_benchmark(path)


def test_other_bad_rows_are_errors_not_drops(tmp_path):
    path = tmp_path / "aime24.jsonl"
    path.write_text('{"id": 1, "problem": "a", "answer": "5"}\n\n{not json\n')
    with pytest.raises(ValueError, match=rf"{path}:3: not valid JSON"):
        load_benchmark(path)
    _write_jsonl(path, [{"id": 1, "problem": "a", "answer": "5"}, {"id": 1, "problem": "b"}])
    with pytest.raises(ValueError, match=rf"{path}:2: no answer"):
        load_benchmark(path)
    _write_jsonl(path, [{"id": 1, "problem": "a", "answer": "2.5"}])
    with pytest.raises(ValueError, match=rf"{path}:1: aime24 answers are integers"):
        load_benchmark(path)
    _write_jsonl(path, [{"id": 1, "problem": "a", "answer": "1"}] * 2)
    with pytest.raises(ValueError, match=rf"{path}:2: id '1' already used at {path}:1"):
        load_benchmark(path)
    _write_jsonl(path, [{"id": 1, "problem": " ", "answer": "1"}])
    with pytest.raises(ValueError, match=rf"{path}:1: no problem text"):
        load_benchmark(path)
    path.write_text("")
    with pytest.raises(ValueError, match="no rows"):
        load_benchmark(path)


def test_bad_arguments(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"problem": "a", "answer": "1"}])
    with pytest.raises(ValueError, match="unknown field role 'gold'"):
        load_benchmark(path, fields={"gold": "answer"})
    with pytest.raises(ValueError, match="must be None"):
        load_benchmark(path, tmp_path)
    (tmp_path / "math500.csv").write_text("problem,answer\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_benchmark("math500", tmp_path / "math500.csv")


# ---------------------------------------------------------------- RACES


def test_races_items_are_test_split_tasks_scored_by_their_operator():
    from tirl.envs.core import REGISTRY
    from tirl.envs.operators import OPERATORS, score

    items = load_races(n=6, seed=3)
    assert len(items) == 6
    assert items == load_races(n=6, seed=3)  # deterministic per seed
    for item in items:
        assert item.category in OPERATORS and item.problem and item.answer
        assert item.meta["scoring"] == "races-operator"
        task = races_task(item)
        assert task.meta["split"] == "test"
        assert score(task, item.answer, REGISTRY).value == 1.0  # the reference answer scores 1
