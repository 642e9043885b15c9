"""Every registered task source through one template, then each source's bad input and a mixture.

The template (reasoning-gym style, STYLE.md): an item is deterministic, the two splits share no
problem, ids are unique within a split, the reference answer (or the demonstration) scores 1
and a wrong answer 0, and a serialized task scores as the original. Every registered source
runs through it: one whose defaults make a working source (`{source: NAME}`) gets its case
here by itself; one that needs keys (a file, a dataset name) has an entry in `CASES` giving
them, and without one `test_every_registered_source_has_a_case` names it and what to add.
Math answers go through the real verifier (one worker, shared by the module); benchmark cases
read the public files in shared/data/benchmarks beside the repository and skip when they are
absent.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tirl.config import ConfigError
from tirl.envs.core import REGISTRY
from tirl.envs.demos import operator_steps
from tirl.envs.operators import OperatorTask, answer_block
from tirl.tasks import Code, Mixture, Think, make_source, source_names
from tirl.tasks.contamination import ContaminationIndex

DATA_DIR = Path(__file__).parents[1].parent / "shared" / "data" / "benchmarks"
needs_data = pytest.mark.skipif(
    not (DATA_DIR / "math500.jsonl").is_file(),
    reason=f"the public benchmark files are not present at {DATA_DIR}",
)
SMALL_RACES = {"min_size": 2, "max_size": 3}  # short chains keep the search fast

# Math problems with distinct answers of several forms (checked through the verifier).
MATH_ROWS = [
    {"problem": "What share of a pizza is left after eating a quarter?", "answer": "\\frac{3}{4}"},
    {"problem": "Solve 1 < x <= 2 for x as an interval.", "answer": "(1, 2]"},
    {"problem": "Expand (x+i)(x-i).", "answer": "x^2+1"},
    {"problem": "Give the square root of 2.", "answer": "\\sqrt{2}"},
    *[
        {"problem": f"Compute {a} + {b} * 7 exactly.", "answer": str(a + 7 * b), "topic": "sums"}
        for a, b in ((i, i * i + 3) for i in range(1, 37))
    ],
]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def verifier():
    from tirl.rewards.verify import MathVerifier

    v = MathVerifier(workers=1, timeout_s=10.0)
    yield v
    v.close()


@pytest.fixture(scope="module")
def math_file(tmp_path_factory) -> Path:
    return _write_jsonl(tmp_path_factory.mktemp("data") / "math.jsonl", MATH_ROWS)


@pytest.fixture(scope="module")
def races_file(tmp_path_factory) -> Path:
    """A `tirl envs build`-style tasks file holding train and test tasks (written by the same
    functions the command uses)."""
    import tirl.envs.library  # noqa: F401
    from tirl.envs.dataset import BuildConfig, build_tasks, write_tasks

    tasks = [
        task
        for split, n in (("train", 24), ("test", 12))
        for task in build_tasks(REGISTRY, BuildConfig(n=n, split=split, seed=5, **SMALL_RACES))
    ]
    path = tmp_path_factory.mktemp("races") / "tasks.jsonl"
    write_tasks(tasks, path)
    return path


# Cases whose config entry sets keys: a source that needs some (a file, a dataset name), one
# whose defaults are slow here (long RACES chains), and other input forms of a source. Case
# name ("<source>" or "<source>-<form>") -> the config entry, from the fixture files. A source
# not named here runs from its defaults (`DEFAULT_CASES` below).
KEYED_CASES = {
    "races": lambda files: {"source": "races", **SMALL_RACES},
    "races-file": lambda files: {"source": "races", "path": str(files["races"])},
    "dataset": lambda files: {"source": "dataset", "path": str(files["math"]), "test_share": 0.3},
    "benchmark-math500": lambda files: {
        "source": "benchmark",
        "benchmark": "math500",
        "benchmark_dir": str(DATA_DIR),
    },
    "benchmark-races-file": lambda files: {"source": "benchmark", "benchmark": str(files["races"])},
    "reasoning_gym": lambda files: {"source": "reasoning_gym", "dataset": "leg_counting"},
}

# Sources whose package clashes with this environment's pins: their own suite runs them.
SIDE_SUITE_SOURCES = {"verifiers": "tests/verifiers_side (the verifiers package, its own venv)"}


def _default_entry(name: str):
    return lambda files: {"source": name}


# Every other registered source, from its defaults alone: a new source that needs no keys is
# in the template without an edit here.
DEFAULT_CASES = {
    name: _default_entry(name)
    for name in source_names()
    if name not in SIDE_SUITE_SOURCES and not any(c.split("-")[0] == name for c in KEYED_CASES)
}
CASES = {**KEYED_CASES, **DEFAULT_CASES}


@pytest.fixture
def files(math_file, races_file):
    return {"math": math_file, "races": races_file}


_BUILT: dict = {}  # one source per case for the module: a source caches what it has read


def built(case: str, files, verifier):
    if case.startswith("benchmark-math") and not (DATA_DIR / "math500.jsonl").is_file():
        pytest.skip(f"the public benchmark files are not present at {DATA_DIR}")
    if case not in _BUILT:
        source = make_source(CASES[case](files), f"data.train[{case}]", seed=0)
        source.verifier = verifier  # math sources score through the module's verifier
        _BUILT[case] = source
    return _BUILT[case]


def splits_of(source) -> list[str]:
    return ["test"] if source.name == "benchmark" else ["train", "test"]


def reference_text(source, task) -> str:
    """Model text that should score 1: the demonstration without tools, else the boxed gold."""
    demo = source.demonstration(task, use_tools=False)
    if demo is not None:
        return rendered(demo)
    if task.meta.get("scoring") in ("races", "reasoning_gym"):
        return task.answer
    return f"So the answer is \\boxed{{{task.answer}}}."


def rendered(demo) -> str:
    """The model's own text of a demonstration (interpreter output is not model text)."""
    return "\n".join(
        p.text if isinstance(p, Think) else f"```python\n{p.source}\n```" for p in demo
    )


def wrong_text(task, other) -> str:
    """A wrong answer of the right shape: another item's answer (math), or the reference block
    with unreadable values (SEQUENTIAL/PARALLEL) or only its first letter (SORT/SELECT); for
    reasoning-gym, an unreadable answer (another item's answer may contain this one's, which
    its default scorer gives partial credit)."""
    if task.meta.get("scoring") == "reasoning_gym":
        return "<answer>???</answer>"
    if task.meta.get("scoring") != "races":
        return f"So the answer is \\boxed{{{other.answer}}}."
    if task.meta["operator"] in ("sequential", "parallel"):
        return re.sub(r"^(Step|Branch) (\d+): .*$", r"\1 \2: ???", task.answer, flags=re.M)
    first = task.answer.removeprefix("<answer>").split(",")[0].strip()
    return f"<answer>{first}</answer>"


def test_every_registered_source_has_a_case():
    """Each registered source is in the template: a named case, its own suite, or its defaults,
    which must then make a source (else the message says what to add)."""
    cased = {case.split("-")[0] for case in CASES} | set(SIDE_SUITE_SOURCES)
    assert cased >= set(source_names()), sorted(set(source_names()) - cased)
    unknown = cased - set(source_names())
    assert not unknown, f"CASES name sources that are not registered: {sorted(unknown)}"
    for name in DEFAULT_CASES:
        try:
            make_source({"source": name}, f"data.train[{name}]")
        except ConfigError as e:
            pytest.fail(
                f"task source {name!r} cannot be made from its defaults ({e}): add an entry"
                f" {name!r}: lambda files: {{'source': {name!r}, <the keys it needs>}} to"
                " KEYED_CASES in tests/test_task_sources.py (docs/extending.md, 'A task source')"
            )


@pytest.mark.parametrize("case", sorted(CASES))
def test_items_are_deterministic_and_ids_unique(case, files, verifier):
    source = built(case, files, verifier)
    fresh = make_source(CASES[case](files), "data.train[0]", seed=0)
    for split in splits_of(source):
        n = min(200, source.size(split) or 200)
        tasks = [source.item(split, i) for i in range(n)]
        assert [source.item(split, i) for i in range(n)] == tasks  # the same object twice
        assert [fresh.item(split, i) for i in range(0, n, 7)] == tasks[::7]  # a new instance too
        assert len({t.id for t in tasks}) == n, f"{split} ids repeat within one pass"
        assert all(t.split == split and t.problem and t.answer for t in tasks)


@pytest.mark.parametrize("case", sorted(CASES))
def test_splits_share_no_problem(case, files, verifier):
    source = built(case, files, verifier)
    if source.name == "benchmark":
        with pytest.raises(ConfigError, match="is for evaluation only"):
            source.item("train", 0)
        return
    train = {source.item("train", i).problem for i in range(200)}
    test = {source.item("test", i).problem for i in range(200)}
    assert train and test and not train & test


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_scores_one_and_a_wrong_answer_zero(case, files, verifier):
    source = built(case, files, verifier)
    for split in splits_of(source):
        tasks = [source.item(split, i) for i in range(12)]
        for task, other in zip(tasks, tasks[1:] + tasks[:1]):
            good = task.score(reference_text(source, task))
            assert good.reward == 1.0 and good.correct, (task.id, good)
            if task.answer == other.answer:
                continue
            bad = task.score(wrong_text(task, other))
            assert bad.reward == 0.0 and not bad.correct, (task.id, bad)
            assert task.score("I cannot tell.").reward == 0.0


# ------------------------------------------------------------------ races


def _run_blocks(demo) -> list[str]:
    """Run a demonstration's code blocks in one namespace (as one interpreter session); the
    last line each printed."""
    namespace: dict = {}
    printed = []
    for part in demo:
        if isinstance(part, Code):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(part.source, "<demo>", "exec"), namespace)
            printed.append(out.getvalue().strip().splitlines()[-1])
    return printed


def test_races_demonstrations_score_one_for_every_operator_and_their_code_computes_the_states():
    source = make_source(
        {"source": "races", **SMALL_RACES, "seed": 3, "search_orders": True}, "data.train[0]"
    )
    default = make_source({"source": "races", **SMALL_RACES, "seed": 3}, "data.train[0]")
    seen: dict[str, int] = {}
    searched = 0
    for i in range(80):
        task = source.item("train", i)
        op = task.meta["operator"]
        if seen.get(op, 0) >= 20:
            continue
        seen[op] = seen.get(op, 0) + 1
        for use_tools in (True, False):
            demo = source.demonstration(task, use_tools)
            assert task.score(rendered(demo)).reward == 1.0, (task.id, use_tools)
            assert isinstance(demo[-1], Think)
        assert task.answer in demo[-1].text  # without tools: the reference answer
        demo = source.demonstration(task, use_tools=True)
        stored = OperatorTask.from_dict(task.meta["races_task"])
        printed = _run_blocks(demo)
        if op in ("sort", "select"):
            assert default.demonstration(task, use_tools=True) == [Think(task.answer)]
            # a search prints the order the answer gives (any order that reaches the target
            # scores 1, not only the reference); without a search, the reference alone
            assert printed == [answer_block(demo[-1].text)] or demo == [Think(task.answer)]
            searched += bool(printed)
            continue
        # each block prints its value as the answer writes it; a parallel branch its own only
        assert printed == list(stored.xs if op == "sequential" else stored.xs[1:])
    assert set(seen) == {"sequential", "parallel", "sort", "select"}, seen
    assert searched >= 3, searched  # most of the whole registry's orders mix types: no search


def test_a_sort_or_select_search_finds_an_order_that_reaches_the_target():
    import tirl.envs.library  # noqa: F401  (registers the environments)

    # 6 -> clear the lowest set bit -> 4 -> << 3 -> 32 -> << 3 -> 256; the reference order is
    # B, C, A (6 -> 48 -> 384 -> 256), and the search tries A, B, C first: both score 1
    names = ("bits.clear_lowest_set_bit", "bits.shift_left_3", "bits.shift_left_3")
    path = ("bits.shift_left_3", "bits.shift_left_3", "bits.clear_lowest_set_bit")
    sort = OperatorTask(
        "sort", "(prompt)", path, ("6", "48", "384", "256"), "<answer>B, C, A</answer>", names
    )
    steps = operator_steps(sort, REGISTRY)
    assert steps[-1][1].endswith("<answer>A, B, C</answer>")
    assert _run_blocks([Code(text) for kind, text in steps if kind == "code"]) == ["A, B, C"]
    # SELECT tries shorter orders first: 6 << 3 = 48 is reached by B alone
    select = replace(
        sort, operator="select", envs=path[:1], xs=("6", "48"), answer="<answer>B</answer>"
    )
    assert operator_steps(select, REGISTRY)[-1][1].endswith("<answer>B</answer>")
    # an order the code would find but the task's domains refuse (-26 << 3 is outside
    # shift_left_3's inputs) is no demonstration: no order then scores 1
    negative = replace(select, candidates=("bits.shift_left_3", "numbers.absolute_value"),
                       envs=("numbers.absolute_value", "bits.shift_left_3"),
                       xs=("-26", "26", "208"), answer="<answer>B, A</answer>")  # fmt: skip
    assert operator_steps(negative, REGISTRY) == "the order the search finds does not score"
    # operations between types: no search (a mapper could be handed any value)
    mixed = replace(sort, candidates=("lists.reverse", "bits.shift_left_3"))
    assert "an order search needs operations from int to int" in operator_steps(mixed, REGISTRY)
    assert "is off" in operator_steps(sort, REGISTRY, search_orders=False)


def test_races_stream_continues_in_a_pickled_copy():
    source = make_source({"source": "races", **SMALL_RACES, "seed": 2}, "w")
    first = [source.item("train", i) for i in range(30)]
    copy = pickle.loads(pickle.dumps(source))
    assert [copy.item("train", i) for i in range(30)] == first
    assert copy.item("train", 70) == source.item("train", 70)


def test_races_envs_subset_only_uses_those_environments():
    domain = "lists"
    source = make_source({"source": "races", **SMALL_RACES, "envs": [domain]}, "w")
    for i in range(10):
        assert all(n.startswith(f"{domain}.") for n in source.item("train", i).meta["envs"])


def test_races_bad_inputs_are_one_line_config_errors(tmp_path, races_file):
    cases = [
        (
            {"envs": ["lists.revrese"]},
            r"data\.train\[1\]: envs\[0\]: unknown .*'lists\.revrese'.*lists\.reverse",
        ),
        ({"mixture": {"sequentail": 1.0}}, r"data\.train\[1\]\.mixture .*'sequentail'"),
        ({"min_size": 4, "max_size": 3}, r"min_size \(4\) must not exceed max_size \(3\)"),
        ({"level": 7}, r"data\.train\[1\]\.level must be in \[1, 3\]"),
        ({"path": str(races_file), "max_size": 4}, r"max_size: applies to generated tasks only"),
        ({"path": str(tmp_path / "none.jsonl")}, r"path: .*none\.jsonl: no such tasks file"),
    ]
    rows = [json.loads(line) for line in races_file.read_text().splitlines()]
    rows[2]["envs"] = ["no.such_env", *rows[2]["envs"][1:]]
    bad = _write_jsonl(tmp_path / "bad.jsonl", rows)
    cases.append(({"path": str(bad)}, rf"{re.escape(str(bad))}:3: not a RACES task: unknown env"))
    for params, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            make_source({"source": "races", **params}, "data.train[1]")
        assert "\n" not in str(info.value)


def test_races_file_with_train_tasks_only_has_no_test_split(tmp_path, races_file):
    rows = [json.loads(line) for line in races_file.read_text().splitlines()]
    train_only = [r for r in rows if r["meta"]["split"] == "train"]
    path = _write_jsonl(tmp_path / "train.jsonl", train_only)
    source = make_source({"source": "races", "path": str(path)}, "w")
    assert source.size("train") == len(train_only) and source.size("test") == 0
    with pytest.raises(ConfigError, match="gives no test task"):
        source.item("test", 0)


# ------------------------------------------------------------------ dataset


def test_dataset_answers_are_checked_by_the_verifier(math_file, verifier):
    source = make_source({"source": "dataset", "path": str(math_file), "test_share": 0}, "w")
    source.verifier = verifier
    by_answer = {
        t.answer: t for t in (source.item("train", i) for i in range(source.size("train")))
    }
    checks = [
        ("\\frac{3}{4}", "0.75", True),
        ("\\frac{3}{4}", "3/4", True),
        ("\\frac{3}{4}", "\\frac{4}{3}", False),
        ("(1, 2]", "(1,2]", True),
        ("(1, 2]", "[1, 2]", False),
        ("x^2+1", "1+x^2", True),
        ("x^2+1", "x^2-1", False),
    ]
    for gold, said, correct in checks:
        score = by_answer[gold].score(f"Thus \\boxed{{{said}}}.")
        assert score.correct is correct and score.predicted == said, (gold, said, score)
        assert score.reason  # the verifier's reason
    last_counts = by_answer["x^2+1"].score("\\boxed{1+x^2} or rather \\boxed{x^2-1}")
    assert not last_counts.correct and last_counts.predicted == "x^2-1"


def test_dataset_test_share_splits_by_problem_hash(math_file):
    counts = {}
    for share in (0.0, 0.3, 1.0):
        source = make_source(
            {"source": "dataset", "path": str(math_file), "test_share": share}, "w"
        )
        counts[share] = (source.size("train"), source.size("test"))
    n = len(MATH_ROWS)
    assert counts[0.0] == (n, 0) and counts[1.0] == (0, n)
    assert 0 < counts[0.3][1] < n and sum(counts[0.3]) == n


def test_dataset_order_is_shuffled_per_pass_and_every_pass_holds_each_row_once(math_file):
    source = make_source({"source": "dataset", "path": str(math_file), "seed": 4}, "w")
    n = source.size("train")
    first = [source.item("train", i).id for i in range(n)]
    second = [source.item("train", n + i).id for i in range(n)]
    assert sorted(first) == sorted(second) and len(set(first)) == n
    assert first != second  # a new shuffle each pass
    other = make_source({"source": "dataset", "path": str(math_file), "seed": 5}, "w")
    assert [other.item("train", i).id for i in range(n)] != first


def test_dataset_category_and_parquet(tmp_path, math_file):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "math.parquet"
    rows = [{**r, "topic": r.get("topic", "other")} for r in MATH_ROWS]
    pq.write_table(pa.Table.from_pylist(rows), path)
    entry = {"source": "dataset", "path": str(path), "category_key": "topic"}
    parquet = make_source(entry, "w")
    jsonl = make_source({**entry, "path": str(math_file)}, "w")
    for i in range(10):
        a, b = parquet.item("train", i), jsonl.item("train", i)
        assert (a.id, a.problem, a.answer) == (b.id, b.problem, b.answer)
        assert a.meta["category"] in ("sums", "other")
        assert a.meta["where"].startswith(f"{path} row ")


def test_dataset_bad_inputs_name_file_and_line_or_key(tmp_path):
    p = tmp_path / "d.jsonl"
    good = json.dumps({"problem": "p0", "answer": "1"})
    cases = [
        ("", r"d\.jsonl: the dataset holds no rows", {}),
        (f"{good}\n{{not json\n", r"d\.jsonl:2: not valid JSON", {}),
        (f"{good}\n[1, 2]\n", r"d\.jsonl:2: expected a JSON object, got list", {}),
        (f'{good}\n{{"question": "q", "answer": "2"}}\n', r"d\.jsonl:2: no 'problem' field", {}),
        (f'{good}\n\n{{"problem": "q"}}\n', r"d\.jsonl:3: no 'answer' field", {}),
        (f'{good}\n{{"problem": "q", "answer": "  "}}\n', r"d\.jsonl:2: 'answer' is empty", {}),
        (f'{good}\n{{"problem": 7, "answer": "2"}}\n', r"d\.jsonl:2: 'problem' is int", {}),
        (f'{good}\n{{"problem": "q", "answer": 2.5}}\n', r"d\.jsonl:2: 'answer' is float", {}),
        ('{"q": "p0", "a": "1"}\n', r"d\.jsonl:1: no 'q2' field", {"problem_key": "q2"}),
    ]
    for text, message, params in cases:
        p.write_text(text)
        with pytest.raises(ConfigError, match=message) as info:
            make_source({"source": "dataset", "path": str(p), **params}, "data.train[0]")
        assert str(info.value).startswith("data.train[0]: ") and "\n" not in str(info.value)
    for params, message in (
        ({"path": str(tmp_path / "missing.jsonl")}, r"path: .*missing\.jsonl: no such file"),
        ({"path": str(p), "test_share": 1.5}, r"data\.train\[0\]\.test_share must be in \[0, 1\]"),
        ({"path": str(p), "answer": "x"}, r"unknown key 'data\.train\[0\]\.answer'"),
    ):
        with pytest.raises(ConfigError, match=message):
            make_source({"source": "dataset", **params}, "data.train[0]")


def test_dataset_empty_split_says_why(tmp_path, math_file):
    source = make_source({"source": "dataset", "path": str(math_file), "test_share": 1}, "w")
    with pytest.raises(ConfigError, match=r"the train split is empty: test_share=1 puts all"):
        source.item("train", 0)
    assert source.item("test", 0).split == "test"


def test_dataset_decontamination_drops_and_reports(tmp_path, math_file, capsys):
    bench = _write_jsonl(
        tmp_path / "bench.jsonl",
        [
            {"problem": "Expand (x+i)(x-i).", "answer": "x^2+1"},
            {"problem": "Unrelated.", "answer": "1"},
        ],
    )
    entry = {"source": "dataset", "path": str(math_file), "decontaminate": [str(bench)]}
    source = make_source(entry, "w")
    assert source.dropped == 1
    assert "dropped 1 of 40 rows" in capsys.readouterr().err
    problems = {source.item(s, i).problem for s in ("train", "test") for i in range(40)}
    assert "Expand (x+i)(x-i)." not in problems and len(problems) == 39
    with pytest.raises(ConfigError, match=r"decontaminate\[0\]: unknown benchmark 'math5000'"):
        make_source({**entry, "decontaminate": ["math5000"]}, "w")


def test_contamination_index_moved_and_still_catches_long_and_short_copies():
    from tirl.synth.filters import ContaminationIndex as FromSynth

    assert FromSynth is ContaminationIndex
    index = ContaminationIndex(["one two three four five six", "short one"], n=4)
    assert index.contaminated("so: two three four five, said he")
    assert index.contaminated("a short one indeed")
    assert not index.contaminated("two three five four")


def test_dataset_hf_without_the_datasets_package_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails; nothing is downloaded
    with pytest.raises(ConfigError, match=r"hf:some/set needs the Hugging Face `datasets`"):
        make_source({"source": "dataset", "path": "hf:some/set"}, "w")


def test_dataset_hf_folder_saved_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the optional `datasets` package")
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(MATH_ROWS[:10]).save_to_disk(str(folder))
    source = make_source({"source": "dataset", "path": f"hf:{folder}", "test_share": 0}, "w")
    assert source.size("train") == 10
    assert source.item("train", 0).meta["where"].startswith(f"hf:{folder} row ")


# ------------------------------------------------------------------ benchmark


@needs_data
def test_benchmark_files_read_through_the_source(verifier):
    for name, size in (("aime25", 30), ("amc23", 40), ("olymmath-easy", 100)):
        source = make_source(
            {"source": "benchmark", "benchmark": name, "benchmark_dir": str(DATA_DIR)}, "w"
        )
        source.verifier = verifier
        assert source.size("test") == size and source.size("train") == 0
        task = source.item("test", 3)
        assert task.id.startswith(f"benchmark/{name}/") and task.meta["scoring"] == "math"
        assert task.score(f"\\boxed{{{task.answer}}}").correct
    amc = make_source(
        {"source": "benchmark", "benchmark": "amc23", "benchmark_dir": str(DATA_DIR)}, "w"
    )
    amc.verifier = verifier
    assert amc.item("test", 0).answer == "27"  # the file's 27.0
    assert amc.item("test", 0).score("\\boxed{27}").correct


def test_benchmark_bad_inputs(tmp_path):
    cases = [
        ({"benchmark": "math5000"}, r"benchmark: unknown benchmark 'math5000'.*'math500'"),
        ({"benchmark": str(tmp_path / "x.jsonl")}, r"benchmark: .*x\.jsonl does not exist"),
        ({"benchmark": "math500", "benchmark_dir": str(tmp_path)}, r"no math500 file in"),
    ]
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"problem": "p", "answer": "1"}\n{"problem": "q"}\n')
    cases.append(({"benchmark": str(bad)}, rf"{re.escape(str(bad))}:2: no answer"))
    for params, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            make_source({"source": "benchmark", **params}, "eval.tasks[0]")
        assert "\n" not in str(info.value)


# ------------------------------------------------------------------ mixture


def test_mixture_of_three_sources_keeps_exact_shares_and_restarts_anywhere(math_file):
    entries = [
        {"source": "arithmetic", "weight": 2},
        {"source": "races", "weight": 1, **SMALL_RACES},
        {"source": "dataset", "weight": 1, "path": str(math_file)},
    ]
    mixture = Mixture.from_entries(entries, "data.train", seed=1)
    tasks = mixture.items("train", 400)
    counts = {
        name: sum(t.source == name for t in tasks) for name in ("arithmetic", "races", "dataset")
    }
    assert counts == {"arithmetic": 200, "races": 100, "dataset": 100}
    for window in range(0, 400, 40):  # every window of 4 holds 2:1:1 too
        names = sorted(t.source for t in tasks[window : window + 4])
        assert names == ["arithmetic", "arithmetic", "dataset", "races"]
    for k in (1, 157):
        again = Mixture.from_entries(entries, "data.train", seed=1)
        assert again.items("train", 400 - k, start=k) == tasks[k:]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_serialized_task_scores_as_the_original(case, files, verifier):
    from tirl.tasks.serialize import SCORINGS, task_from_dict, task_to_dict

    source = built(case, files, verifier)
    for split in splits_of(source):
        tasks = [source.item(split, i) for i in range(3)]
        for task, other in zip(tasks, tasks[1:] + tasks[:1]):
            if task.meta.get("scoring") not in SCORINGS:  # not for a process that did not build it
                with pytest.raises(ValueError, match="cannot be serialized"):
                    task_to_dict(task)
                continue
            copy = task_from_dict(json.loads(json.dumps(task_to_dict(task))))
            assert copy == task and copy.meta == json.loads(json.dumps(task.meta))
            for text in (reference_text(source, task), wrong_text(task, other)):
                assert copy.score(text) == task.score(text), (task.id, text)


def test_bad_serialized_tasks_say_what_is_wrong():
    from tirl.tasks.base import Task
    from tirl.tasks.serialize import task_from_dict, task_to_dict

    good = task_to_dict(make_source({"source": "arithmetic"}, "w").item("train", 0))
    cases = {
        "a serialized task is a dict, not list": [],
        "lacks meta": {k: v for k, v in good.items() if k != "meta"},
        "unknown scoring 'gpt-judge'": {**good, "meta": {"scoring": "gpt-judge"}},
        "unknown split 'dev'": {**good, "split": "dev"},
        "is not an integer": {**good, "answer": "3/4"},
        "bad races_task": {**good, "meta": {"scoring": "races", "races_task": {"x": 1}}},
    }
    for message, data in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            task_from_dict(data)
    judged = Task("t/1", "train", "p", "a", scorer=lambda text: None, meta={"scoring": "judge"})
    with pytest.raises(ValueError, match="t/1: scoring 'judge' cannot be serialized"):
        task_to_dict(judged)


def test_a_stored_races_task_scores_in_a_fresh_process_and_importing_loads_no_environment():
    """The task sources read the environments through `tirl.envs.registry` when they first
    score or generate, not on import: a process that only loads a stored task (verl's reward,
    reasoning-gym's `score_answer`) gets every environment the task names."""
    import subprocess

    from tirl.tasks.serialize import task_to_dict

    task = make_source({"source": "races"}, "races", 0).item("test", 3)
    code = (
        "import json, sys\n"
        "from tirl.tasks.serialize import task_from_dict\n"
        "task = task_from_dict(json.loads(sys.argv[1]))\n"
        "assert 'tirl.envs.library' not in sys.modules, 'imported the library'\n"
        "print(task.score(task.answer).reward, task.score('no answer').reward)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(task_to_dict(task))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1.0", "0.0"]
