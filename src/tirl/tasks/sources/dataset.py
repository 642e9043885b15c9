"""`dataset`: problems with reference answers from a file (JSONL, Parquet) or a `datasets` folder.

`path` is one of
- a `.jsonl` file (one JSON object per line; blank lines carry no row) or a `.parquet` file;
- `hf:FOLDER` or `hf:FOLDER:SPLIT`: a folder written by `datasets.Dataset.save_to_disk` (or
  `DatasetDict.save_to_disk`, whose SPLIT defaults to "train"), read with
  `datasets.load_from_disk`. This is the local form, and the one tests use;
- `hf:NAME` or `hf:NAME:SPLIT` otherwise: `datasets.load_dataset(NAME, split=SPLIT)` with the Hub
  switched to offline mode for the process (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE), so only a copy
  already in the local `datasets` cache is read; this module never downloads. Both `hf:` forms
  need the optional `datasets` package.

Each row gives a problem (`problem_key`), a reference answer (`answer_key`: a string, or an
integer taken as its digits) and optionally a category (`category_key`, copied into
`task.meta["category"]`). A row goes to train or test by a hash of its problem text, so a
problem is never in both splits and the same problem always lands in the same split:
`test_share` of the hash space is test (0: every row trains, 1: every row tests). Within a
split, `seed` shuffles the order, and the split cycles with a new shuffle each pass.

`decontaminate` lists benchmarks (names looked up in `benchmark_dir`, or files; anything
`tirl.tasks.benchmark_files.load_benchmark` reads): a row whose problem shares an `ngram`-word
n-gram with one of their problems is dropped (`tirl.tasks.contamination`), and the count is
printed to stderr once and kept in `source.dropped`.

Scored by the content of the model's last `\\boxed{}` against the reference answer through the
math verifier (`tirl.rewards.verify`, math-verify in worker processes with timeouts);
`Score.reason` is the verifier's. `source.verifier` is the `MathVerifier` used (None: the
process-wide `default_verifier()`). No demonstrations: a file of answers holds no solutions.

Bad input is a one-line ConfigError naming file and line (Parquet/`hf:`: row) and key: a missing
file, a line that is not JSON or not an object, a row whose problem or answer is missing, empty
or not text, an empty dataset, every row dropped as contaminated, and a split asked for that
holds no row. The file is read once, on first use (or by `make_source`), and kept.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.config import ConfigError, setting
from tirl.rewards.answer import extract_boxed
from tirl.tasks.base import SPLITS, DemoPart, Score, Task
from tirl.tasks.registration import register_source

HF_PREFIX = "hf:"
_HASH_SPACE = 2**64


def score_math(gold: str, model_text: str, verifier: Any = None) -> Score:
    """Reward 1 iff the last `\\boxed{}` of `model_text` equals `gold` for the math verifier."""
    from tirl.rewards.verify import default_verifier

    predicted = extract_boxed(model_text)
    verdict = (verifier or default_verifier()).verify(gold, predicted)
    return Score(float(verdict.correct), verdict.correct, verdict.reason, predicted)


def split_by_share(text: str, test_share: float) -> str:
    """The split of a problem: test iff the hash of its text falls in the first `test_share`
    of the hash space (like `tirl.envs.seeding.split_of`, with a share of our choosing)."""
    digest = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return "test" if digest < test_share * _HASH_SPACE else "train"


@dataclass(frozen=True)
class Row:
    where: str  # "file:line", or "file row i" for Parquet and hf:
    number: int  # 0-based position in the source
    problem: str
    answer: str
    category: Any = None


@register_source("dataset")
@dataclass
class DatasetSource:
    """Problems with reference answers from a JSONL/Parquet file or a saved `datasets` folder."""

    path: str = setting(doc="a .jsonl or .parquet file, or hf:FOLDER[:SPLIT] (see the module doc)")
    problem_key: str = setting("problem", doc="the field holding the problem text")
    answer_key: str = setting("answer", doc="the field holding the reference answer")
    category_key: str | None = setting(None, doc="a field copied into task.meta['category']")
    test_share: float = setting(0.1, "[0, 1]", "share of the problems (by hash) that are test")
    seed: int = setting(0, ">= 0", "shuffles the order of each pass (default: the run's seed)")
    decontaminate: list[str] = setting(
        factory=list, doc="benchmarks (names or files) whose problems' n-grams rule a row out"
    )
    ngram: int = setting(13, ">= 1", "words per n-gram for decontaminate")
    benchmark_dir: str | None = setting(
        None, doc="where decontaminate's benchmark names are (default: $TIRL_BENCHMARK_DIR)"
    )
    name: str = field(default="dataset", init=False, repr=False)

    def __post_init__(self) -> None:
        self.verifier: Any = None  # a MathVerifier; None: the process-wide default
        self.dropped = 0  # rows dropped as contaminated
        self._rows: dict[str, list[Row]] | None = None
        self._order: dict[tuple[str, int], list[int]] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "verifier": None}  # a verifier holds threads and processes

    def validate(self) -> None:
        """Reads the file (ConfigError naming file and line, or the key); `make_source` calls
        this, and so does the first use otherwise."""
        self._split_rows()

    # ------------------------------------------------------------------ reading

    def _split_rows(self) -> dict[str, list[Row]]:
        if self._rows is None:
            rows = list(self._read())
            if not rows:
                raise ConfigError(f"{self.path}: the dataset holds no rows", "path")
            if self.decontaminate:
                rows = self._decontaminated(rows)
            split = {s: [] for s in SPLITS}
            for row in rows:
                split[split_by_share(row.problem, self.test_share)].append(row)
            self._rows = split
        return self._rows

    def _read(self) -> Iterator[Row]:
        for number, (where, row) in enumerate(self._records()):
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
            problem = self._text(where, row, self.problem_key, "problem_key")
            answer = self._text(where, row, self.answer_key, "answer_key")
            category = row.get(self.category_key) if self.category_key else None
            yield Row(where, number, problem, answer, category)

    @staticmethod
    def _text(where: str, row: dict, key: str, setting_name: str) -> str:
        if key not in row or row[key] is None:
            raise ConfigError(
                f"{where}: no {key!r} field (set {setting_name} to one of: {', '.join(row)})",
                setting_name,
            )
        value = row[key]
        if isinstance(value, int) and not isinstance(value, bool) and setting_name == "answer_key":
            return str(value)  # an integer answer is its digits
        if not isinstance(value, str):
            raise ConfigError(
                f"{where}: {key!r} is {type(value).__name__} ({value!r:.40}), not text",
                setting_name,
            )
        if not value.strip():
            raise ConfigError(f"{where}: {key!r} is empty", setting_name)
        return value.strip() if setting_name == "answer_key" else value

    def _records(self) -> Iterator[tuple[str, Any]]:
        if self.path.startswith(HF_PREFIX):
            yield from _hf_records(self.path)
            return
        path = Path(self.path)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "no such file"
            raise ConfigError(f"path: {path}: {what}", "path")
        if path.suffix == ".parquet":
            yield from _parquet_records(path)
        elif path.suffix == ".jsonl":
            yield from _jsonl_records(path)
        else:
            raise ConfigError(
                f"path: {path}: unsupported file type; expected .jsonl, .parquet or hf:FOLDER",
                "path",
            )

    def _decontaminated(self, rows: list[Row]) -> list[Row]:
        from tirl.tasks.contamination import ContaminationIndex

        index = ContaminationIndex(self._benchmark_problems(), self.ngram)
        kept = [row for row in rows if not index.contaminated(row.problem)]
        self.dropped = len(rows) - len(kept)
        print(
            f"dataset {self.path}: dropped {self.dropped} of {len(rows)} rows sharing a"
            f" {self.ngram}-word n-gram with {', '.join(self.decontaminate)}",
            file=sys.stderr,
        )
        if not kept:
            raise ConfigError(
                f"{self.path}: every row was dropped as contaminated by"
                f" {', '.join(self.decontaminate)}",
                "decontaminate",
            )
        return kept

    def _benchmark_problems(self) -> list[str]:
        from tirl.tasks.benchmark_files import is_benchmark_name, load_benchmark

        problems = []
        for i, entry in enumerate(self.decontaminate):
            try:
                items = (
                    load_benchmark(entry, self.benchmark_dir)
                    if is_benchmark_name(entry)
                    else load_benchmark(entry)
                )
            except (ValueError, ImportError) as e:
                raise ConfigError(f"decontaminate[{i}]: {e}", f"decontaminate[{i}]") from None
            problems += [item.problem for item in items]
        return problems

    # ------------------------------------------------------------------ items

    def _rows_of(self, split: str) -> list[Row]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        rows = self._split_rows()[split]
        if not rows:
            held = sum(len(r) for r in self._split_rows().values())
            raise ConfigError(
                f"{self.path}: the {split} split is empty: test_share={self.test_share:g} puts"
                f" all {held} rows in the other split",
                "test_share",
            )
        return rows

    def _pass_order(self, split: str, n: int, pass_number: int) -> list[int]:
        key = (split, pass_number)
        if key not in self._order:
            if len(self._order) > 8:  # sequential reading needs one or two passes at a time
                self._order.clear()
            order = list(range(n))
            random.Random(f"dataset/{self.seed}/{split}/{pass_number}").shuffle(order)
            self._order[key] = order
        return self._order[key]

    def item(self, split: str, index: int) -> Task:
        rows = self._rows_of(split)
        pass_number, position = divmod(index, len(rows))
        row = rows[self._pass_order(split, len(rows), pass_number)[position]]
        gold = row.answer
        meta: dict[str, Any] = {"scoring": "math", "where": row.where}
        if self.category_key:
            meta["category"] = row.category
        return Task(
            id=f"dataset/{split}/{row.number}",
            split=split,
            problem=row.problem,
            answer=gold,
            scorer=lambda text: score_math(gold, text, self.verifier),
            source=self.name,
            meta=meta,
        )

    def size(self, split: str) -> int | None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return len(self._split_rows()[split])

    def demonstration(self, task: Task, use_tools: bool) -> list[DemoPart] | None:
        return None


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    import json

    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{lineno}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})", "path") from None


def _parquet_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"path: reading {path} needs pyarrow: pip install pyarrow") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise ConfigError(f"path: {path}: not a readable Parquet file ({e})", "path") from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield f"{path} row {i}", row


def _hf_records(spec: str) -> Iterator[tuple[str, Any]]:
    """Rows of hf:FOLDER[:SPLIT] (a save_to_disk folder) or hf:NAME[:SPLIT] (the local cache)."""
    target, _, split = spec[len(HF_PREFIX) :].partition(":")
    if "datasets" not in sys.modules:  # read at import: the Hub is never asked, only the cache
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"path: {spec} needs the Hugging Face `datasets` package (pip install datasets),"
            " or save the rows as .jsonl/.parquet and give that file",
            "path",
        ) from None
    try:
        if Path(target).is_dir():
            loaded = datasets.load_from_disk(target)
            if isinstance(loaded, datasets.DatasetDict):
                loaded = loaded[split or "train"]
        else:
            datasets.config.HF_HUB_OFFLINE = True  # imported earlier: switch it off here too
            datasets.config.HF_DATASETS_OFFLINE = True
            loaded = datasets.load_dataset(target, split=split or "train")
    except Exception as e:  # noqa: BLE001 - datasets raises many types; all are the user's
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"path: {spec}: cannot load it offline: {first}", "path") from None
    for i, row in enumerate(loaded, start=1):
        yield f"{spec} row {i}", row
