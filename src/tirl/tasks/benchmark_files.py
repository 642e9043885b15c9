"""Evaluation benchmarks as one record type, `BenchmarkItem`, whatever file they come from.

Covers the math benchmarks CIR and AgentMath report (MATH-500, AIME 2024/2025, AMC 2023,
OlymMATH-EN easy/hard, HMMT) read from local JSON Lines or Parquet files, or from a Hugging Face
dataset when the optional `datasets` package is installed, RACES test-split tasks built
in-process, and RACES tasks files written by `tirl envs build` (recognised by their rows:
`operator`, `prompt`, `envs`, `xs`). This module sits in `tirl.tasks` so that both the
`benchmark` task source and `tirl.eval` (which re-exports it as `tirl.eval.benchmarks`) read
benchmarks the same way. Loading only reads and normalises; it never scores. Math items are scored by answer
equivalence (a verifier such as `tirl.rewards.verify`); RACES items by their operator reward.

Quirks of the real files (`shared/data/benchmarks/README.md`) and what is done about them:

- AMC 2023 stores answers as JSON floats (`27.0`, `-1.0`). An integral float becomes its
  integer text (`"27"`); the original value stays in `meta["raw_answer"]`, with a line in
  `meta["answer_note"]`. For AMC only, a text answer such as `"27.0"` (a re-export of the same
  data) is treated the same way. Non-integral floats anywhere keep their repr (`2.5`).
- AIME answers are strings, some with leading zeros (`"025"`). The text is kept as it is and
  `meta["answer_note"]` says so; `meta["answer_int"]` holds the integer (25) for every AIME and
  AMC item: compare these answers as integers (or with the verifier), never as strings.
- AIME 2025 has no `answer` field; each `solution` is only `\\boxed{N}`. The gold answer is the
  content of the last `\\boxed{}` (`tirl.rewards.answer.extract_boxed`), and
  `meta["answer_from"]` says `"solution"` instead of `"answer"`.
- `category` is the MATH subject (its difficulty level, 1-5, is `meta["level"]`), the OlymMATH
  subject, or the HMMT problem type(s) when the source has them; None otherwise.

Nothing is dropped silently: a row without a problem or an answer, a line that is not JSON, a
duplicate id, or an AIME/AMC answer that is not an integer raises ValueError naming the file and
line (or Parquet row). Blank lines in JSONL carry no row and are skipped.

Not covered: downloading. Local files are read as given; `hf:` sources go through
`datasets.load_dataset`, which uses its own cache and network access, and tests never call it.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.rewards.answer import extract_boxed, normalize_integer_answer

BENCHMARK_DIR_ENV = "TIRL_BENCHMARK_DIR"  # default directory for benchmark names
HF_PREFIX = "hf:"
ROLES = ("id", "problem", "answer", "solution", "category")
SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class BenchmarkItem:
    """One evaluation problem.

    `answer` is the gold answer as text (LaTeX for MATH and OlymMATH, an integer for AIME and
    AMC, a reference response for RACES). `meta` keeps where the item came from
    (`benchmark`, `source` = "file:line"), how the answer was read (`answer_from`,
    `raw_answer`, and `answer_note` when the text differs from the source value or has leading
    zeros), `answer_int` for integer-answer benchmarks, `level` for MATH, the RACES task dict
    under `task`, and the source row's other fields under `row`.
    """

    id: str
    problem: str
    answer: str
    category: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchmarkSpec:
    """How one benchmark's rows map onto `BenchmarkItem`.

    Each role lists the source columns to try, first present wins; `fields=` in
    `load_benchmark` replaces a role's list by one column that must be present.
    """

    name: str
    filename: str  # file stem in a benchmark directory: <filename>.jsonl or .parquet
    rows: int | None = None  # row count of the public file (None: no reference copy)
    id: tuple[str, ...] = ("unique_id", "id", "problem_idx")
    problem: tuple[str, ...] = ("problem", "question")
    answer: tuple[str, ...] = ("answer",)
    solution: tuple[str, ...] = ("solution",)
    category: tuple[str, ...] = ("subject", "category", "problem_type")
    answer_from_solution: bool = False  # no answer column: take the last \boxed{} of solution
    integer_answers: bool = False  # answers must be integers; `meta["answer_int"]` is set
    float_text_answers: bool = False  # answer text "27.0" also means 27 (AMC re-exports)
    hf_split: str = "test"


BENCHMARKS: dict[str, BenchmarkSpec] = {
    s.name: s
    for s in (
        BenchmarkSpec("math500", "math500", 500),
        BenchmarkSpec("aime24", "aime24", 30, integer_answers=True),
        BenchmarkSpec("aime25", "aime25", 30, answer_from_solution=True, integer_answers=True),
        BenchmarkSpec("amc23", "amc23", 40, integer_answers=True, float_text_answers=True),
        BenchmarkSpec("olymmath-easy", "olymmath-en-easy", 100),
        BenchmarkSpec("olymmath-hard", "olymmath-en-hard", 100),
        # No local copy. MathArena/hmmt_feb_2025 on the Hub (split "train") has problem_idx,
        # problem, answer (str, not always an integer) and problem_type (a list of subjects).
        BenchmarkSpec("hmmt", "hmmt", answer_from_solution=True, hf_split="train"),
    )
}
ALIASES = {  # other spellings; case, "-", "_" and spaces never matter
    "aime2024": "aime24",
    "aime2025": "aime25",
    "amc2023": "amc23",
    "olymmath-en-easy": "olymmath-easy",
    "olymmath-en-hard": "olymmath-hard",
}
# Files named like a benchmark's default file get that benchmark's rules when read by path.
_BY_FILENAME = {s.filename: s for s in BENCHMARKS.values()}
_GENERIC = BenchmarkSpec("file", "", answer_from_solution=True)  # any other file or dataset


# ---------------------------------------------------------------------------------------------
# Public API


def load_benchmark(
    name_or_path: str | Path,
    source: str | Path | None = None,
    *,
    fields: Mapping[str, str] | None = None,
    split: str | None = None,
    hf_config: str | None = None,
) -> list[BenchmarkItem]:
    """Load a benchmark as a list of `BenchmarkItem`, in file order.

    `name_or_path` is one of
    - a benchmark name (`BENCHMARKS`: math500, aime24, aime25, amc23, olymmath-easy,
      olymmath-hard, hmmt; case and `_`/`-` do not matter, a few aliases such as `aime2024`
      work). `source` then says where its data is: a directory holding the default file
      (`<spec.filename>.jsonl` or `.parquet`, e.g. `shared/data/benchmarks/`), a file, or
      `"hf:<owner>/<dataset>"`. Without `source`, the directory in $TIRL_BENCHMARK_DIR.
    - a path to a .jsonl or .parquet file. A file named like a default file (`amc23.jsonl`)
      gets that benchmark's rules; a RACES tasks file (`tirl envs build`) gives RACES items
      (`races_items`); any other gets generic ones (`source` must be None).
    - `"hf:<owner>/<dataset>"`, read with generic rules.

    `fields` maps roles (id, problem, answer, solution, category) to column names, e.g.
    `{"id": "problem_idx", "category": "problem_type"}`. `split` (default: the spec's, "test"
    or "train" for hmmt) and `hf_config` apply to `hf:` sources only.

    Raises ValueError for an unknown name (with close matches), a missing file, an unknown
    role in `fields`, and any row that cannot become an item (naming file and line);
    ImportError for `hf:` without `datasets` installed.
    """
    text = str(name_or_path)
    spec = _spec_for(text) if not text.startswith(HF_PREFIX) else None
    if spec is not None:
        where = source if source is not None else os.environ.get(BENCHMARK_DIR_ENV)
        if where is None:
            raise ValueError(
                f"where is {spec.name}? Pass a directory, a file or 'hf:<dataset>' as `source`,"
                f" or set ${BENCHMARK_DIR_ENV} to the directory with {spec.filename}.jsonl"
            )
        where = str(where)
    else:
        if source is not None:
            raise ValueError(
                f"{text!r} is not a benchmark name, so it is read as a file or dataset and"
                f" `source` must be None; known names: {', '.join(BENCHMARKS)}"
            )
        where = text
        if not where.startswith(HF_PREFIX):
            path = Path(where)
            if path.is_dir():
                raise ValueError(
                    f"{path} is a directory: name the benchmark too,"
                    f" e.g. load_benchmark('math500', {str(path)!r})"
                )
            if path.suffix not in SUFFIXES and not path.exists():
                raise ValueError(_unknown_name_message(text))
            spec = _BY_FILENAME.get(path.stem.lower(), _GENERIC)
        else:
            spec = _GENERIC
    roles = _roles(spec, fields)
    if where.startswith(HF_PREFIX):
        dataset = where[len(HF_PREFIX) :]
        rows = _hf_rows(dataset, split or spec.hf_split, hf_config)
        label = spec.name if spec is not _GENERIC else dataset
    else:
        path = _resolve_file(spec, Path(where))
        if spec is _GENERIC and fields is None and _holds_races_tasks(path):
            return _races_file_items(path)
        rows = _file_rows(path)
        label = spec.name if spec is not _GENERIC else path.stem
    return _items(rows, spec, roles, label)


def load_races(
    n: int = 200,
    seed: int = 0,
    *,
    mixture: Mapping[str, float] | None = None,
    min_size: int = 2,
    max_size: int = 5,
    level: int = 1,
) -> list[BenchmarkItem]:
    """`n` RACES test-split tasks (fewer only if the search runs out), deterministic per seed.

    Built with `tirl.envs.dataset.build_tasks(REGISTRY, BuildConfig(split="test", ...))`, so no
    item can also be a training item (the split is decided by content hash). See `races_items`
    for what each item holds and how it must be scored.
    """
    from tirl.envs.dataset import DEFAULT_MIXTURE, BuildConfig, build_tasks
    from tirl.envs.registry import REGISTRY

    config = BuildConfig(
        n=n,
        seed=seed,
        split="test",
        mixture=dict(mixture if mixture is not None else DEFAULT_MIXTURE),
        min_size=min_size,
        max_size=max_size,
        level=level,
    )
    return races_items(build_tasks(REGISTRY, config), prefix=f"races-s{seed}")


def races_items(tasks: Iterable[Any], prefix: str = "races") -> list[BenchmarkItem]:
    """RACES `OperatorTask`s (e.g. from `tirl.envs.dataset.read_tasks`) as BenchmarkItems.

    `category` is the operator (sequential, parallel, sort, select) and `meta["task"]` the task
    dict (`OperatorTask.from_dict` rebuilds it). `answer` is one reference response that scores 1, not
    the only one (another order may reach the same target, a value may be written another way):
    score a response with the operator reward, `tirl.envs.operators.score(task, response,
    REGISTRY)`, which can also give partial credit, never by math equivalence with `answer`.
    """
    return [
        BenchmarkItem(
            id=f"{prefix}-{i}",
            problem=task.prompt,
            answer=task.answer,
            category=task.operator,
            meta={"benchmark": "races", "scoring": "races-operator", "task": task.to_dict()},
        )
        for i, task in enumerate(tasks)
    ]


REASONING_GYM_PREFIX = "rg:"


def load_reasoning_gym(spec: str, n: int = 200) -> list[BenchmarkItem]:
    """`rg:<dataset>`: the first `n` test items of a reasoning-gym dataset (through the
    `reasoning_gym` task source, so the split and seeding are that source's, seed 0) as math
    items: the question alone, its gold answer scored as a `\\boxed{}` answer like every other
    benchmark (not reasoning-gym's `<answer>` convention the source asks for in training), so a
    model trained on boxed answers is measured on its reasoning, not on the tag."""
    from tirl.tasks.sources.reasoning_gym import ReasoningGymSource, dataset_problem

    dataset = spec[len(REASONING_GYM_PREFIX) :]
    problem = dataset_problem(dataset)
    if problem:
        raise ValueError(f"dataset {problem}")
    source = ReasoningGymSource(dataset=dataset)
    items = []
    for i in range(n):
        entry = source.item("test", i).meta["entry"]
        items.append(
            BenchmarkItem(
                id=f"{dataset}-{i}",
                problem=str(entry["question"]).strip(),
                answer=str(entry["answer"]),
                category=dataset,
                meta={"benchmark": spec},
            )
        )
    return items


RACES_FIELDS = ("operator", "prompt", "envs", "xs")  # the row shape of a `tirl envs build` file


def read_races_tasks(path: str | Path) -> list[tuple[str, Any]]:
    """(location, `OperatorTask`) for each row of a tasks file written by `tirl envs build`
    (JSONL or Parquet), in file order. Every row must be a task the registry can score:
    ValueError naming file and line (or Parquet row) otherwise, and for a file with no rows."""
    from tirl.envs.operators import OperatorTask, task_problem
    from tirl.envs.registry import REGISTRY

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such tasks file")
    tasks = []
    for where, row in _file_rows(path):
        if isinstance(row, Mapping) and isinstance(row.get("meta"), str):  # Parquet stores JSON
            try:
                row = {**row, "meta": json.loads(row["meta"])}
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: field 'meta' is not valid JSON ({e.msg})") from None
        task = OperatorTask.from_dict(row)
        if (problem := task_problem(task, REGISTRY)) is not None:
            raise ValueError(f"{where}: not a RACES task: {problem}")
        tasks.append((where, task))
    if not tasks:
        raise ValueError(f"{path}: the tasks file holds no rows")
    return tasks


def _holds_races_tasks(path: Path) -> bool:
    """Whether the file's first row has the shape of a RACES task."""
    rows = _file_rows(path)
    try:
        first = next(rows, None)
    except ValueError:
        return False  # not JSON: the generic reader reports it with its line
    finally:
        rows.close()
    return (
        first is not None and isinstance(first[1], Mapping) and set(RACES_FIELDS) <= first[1].keys()
    )


def _races_file_items(path: Path) -> list[BenchmarkItem]:
    tasks = read_races_tasks(path)
    items = races_items([task for _, task in tasks], prefix=path.stem)
    for item, (where, _) in zip(items, tasks):
        item.meta["source"] = where
    return items


def races_task(item: BenchmarkItem) -> Any:
    """The `tirl.envs.operators.OperatorTask` behind a RACES item, for scoring."""
    from tirl.envs.operators import OperatorTask

    if "task" not in item.meta:
        raise ValueError(f"item {item.id!r} is not a RACES item (no meta['task'])")
    return OperatorTask.from_dict(item.meta["task"])


# ---------------------------------------------------------------------------------------------
# Names, files and rows


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


# compact spelling -> benchmark name
_LOOKUP = {_key(n): n for n in BENCHMARKS} | {_key(a): n for a, n in ALIASES.items()}


def _spec_for(name: str) -> BenchmarkSpec | None:
    found = _LOOKUP.get(_key(name))
    return BENCHMARKS[found] if found is not None else None


def is_benchmark_name(text: str) -> bool:
    """Whether `text` names a known benchmark (any spelling `load_benchmark` accepts)."""
    return _spec_for(text) is not None


def _unknown_name_message(name: str) -> str:
    close = difflib.get_close_matches(_key(name), list(_LOOKUP), n=4, cutoff=0.6)
    names = list(dict.fromkeys(_LOOKUP[c] for c in close))  # canonical names, deduplicated
    hint = f" Did you mean {' or '.join(repr(n) for n in names)}?" if names else ""
    return (
        f"unknown benchmark {name!r} (and no such .jsonl/.parquet file).{hint}"
        f" Known: {', '.join(BENCHMARKS)}; or pass a file path or 'hf:<owner>/<dataset>'."
    )


def _roles(spec: BenchmarkSpec, fields: Mapping[str, str] | None) -> dict[str, tuple[str, ...]]:
    roles = {r: getattr(spec, r) for r in ROLES}
    for role, column in (fields or {}).items():
        if role not in roles:
            raise ValueError(f"unknown field role {role!r}; roles are {', '.join(ROLES)}")
        roles[role] = (column,)
    return roles


def _resolve_file(spec: BenchmarkSpec, where: Path) -> Path:
    if where.is_dir():
        tried = [where / f"{spec.filename}{s}" for s in SUFFIXES]
        for path in tried:
            if path.is_file():
                return path
        raise ValueError(
            f"no {spec.name} file in {where}: looked for {' and '.join(str(p) for p in tried)}"
        )
    if not where.is_file():
        raise ValueError(f"{spec.name}: benchmark file {where} does not exist")
    if where.suffix not in SUFFIXES:
        raise ValueError(f"{where}: unsupported file type; expected .jsonl or .parquet")
    return where


def _file_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row) pairs; location is "path:line" (JSONL) or "path row i" (Parquet, 1-based)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"{path} row {i}", row
        return
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            yield f"{path}:{lineno}", row


def _hf_rows(dataset: str, split: str, config: str | None) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"loading 'hf:{dataset}' needs the Hugging Face `datasets` package:"
            " pip install datasets (it downloads from the Hub); or save the data as"
            " .jsonl/.parquet and pass the file path"
        ) from None
    ds = datasets.load_dataset(dataset, config, split=split)
    for i, row in enumerate(ds, start=1):
        yield f"hf:{dataset} ({split}) row {i}", row


def _pick(row: Mapping[str, Any], columns: tuple[str, ...]) -> tuple[str | None, Any]:
    for c in columns:
        if c in row and row[c] is not None:
            return c, row[c]
    return None, None


def _answer_text(value: Any, lenient_float_text: bool) -> str:
    """`27.0` -> "27"; other floats by repr; strings stripped (AMC: "27.0" -> "27")."""
    if isinstance(value, bool):
        raise TypeError(f"answer is a boolean ({value})")
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"answer has type {type(value).__name__}, not str or number")
    text = value.strip()
    if lenient_float_text:
        try:
            number = float(text)
        except ValueError:
            return text
        if number.is_integer() and "." in text:
            return str(int(number))
    return text


def _category(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):  # HMMT problem_type: one or several subjects
        return ", ".join(str(v) for v in value) or None
    return str(value).strip() or None


def _items(
    rows: Iterable[tuple[str, Any]],
    spec: BenchmarkSpec,
    roles: Mapping[str, tuple[str, ...]],
    benchmark: str,
) -> list[BenchmarkItem]:
    items: list[BenchmarkItem] = []
    seen: dict[str, str] = {}
    for index, (where, row) in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        item = _item(index, where, row, spec, roles, benchmark)
        if item.id in seen:
            raise ValueError(f"{where}: id {item.id!r} already used at {seen[item.id]}")
        seen[item.id] = where
        items.append(item)
    if not items:
        raise ValueError(f"{benchmark}: the source holds no rows")
    return items


def _item(
    index: int,
    where: str,
    row: Mapping[str, Any],
    spec: BenchmarkSpec,
    roles: Mapping[str, tuple[str, ...]],
    benchmark: str,
) -> BenchmarkItem:
    problem_col, problem = _pick(row, roles["problem"])
    if not isinstance(problem, str) or not problem.strip():
        raise ValueError(
            f"{where}: no problem text (looked for {' / '.join(roles['problem'])});"
            f" columns are {', '.join(row)}"
        )
    answer_col, raw = _pick(row, roles["answer"])
    answer_from = "answer"
    if answer_col is None:
        solution_col, solution = _pick(row, roles["solution"])
        if not spec.answer_from_solution or solution_col is None:
            raise ValueError(
                f"{where}: no answer (looked for {' / '.join(roles['answer'])}"
                + (
                    f", then a \\boxed{{}} in {' / '.join(roles['solution'])}"
                    if spec.answer_from_solution
                    else ""
                )
                + f"); columns are {', '.join(row)}"
            )
        raw = extract_boxed(str(solution))
        if raw is None:
            raise ValueError(f"{where}: no answer column and no \\boxed{{}} in {solution_col!r}")
        answer_col, answer_from = solution_col, "solution"
    try:
        answer = _answer_text(raw, lenient_float_text=spec.float_text_answers)
    except TypeError as e:
        raise ValueError(f"{where}: {answer_col!r}: {e}") from None
    if not answer:
        raise ValueError(f"{where}: empty answer in {answer_col!r}")

    meta: dict[str, Any] = {
        "benchmark": benchmark,
        "source": where,
        "answer_from": answer_from,
        "raw_answer": raw,
    }
    if spec.integer_answers:
        value = normalize_integer_answer(answer)
        if value is None:
            raise ValueError(f"{where}: {spec.name} answers are integers, got {answer!r}")
        meta["answer_int"] = value
        if answer != str(value):  # AIME's "025": keep the text, say how to compare it
            why = "leading zeros" if answer.lstrip("+-").startswith("0") else "formatting"
            meta["answer_note"] = f"{why}: {answer!r} is the integer {value}; compare as integers"
    if isinstance(raw, float):
        meta["answer_note"] = f"float {raw!r} in the source, read as {answer!r}"
    if "level" in row:  # MATH difficulty 1-5 (stored as int; some copies say "Level 3")
        level = str(row["level"]).removeprefix("Level").strip()
        meta["level"] = int(level) if level.isdigit() else row["level"]
    # The row minus the problem text (and AIME/AMC's `question`, a verbatim copy of it).
    meta["row"] = {
        k: v for k, v in row.items() if k != problem_col and not (k == "question" and v == problem)
    }

    id_col, id_value = _pick(row, roles["id"])
    item_id = str(id_value) if id_col is not None else f"{benchmark}-{index}"
    _, category = _pick(row, roles["category"])
    return BenchmarkItem(
        id=item_id,
        problem=problem,
        answer=answer,
        category=_category(category),
        meta=meta,
    )
