"""Source records in, work items through the stages.

`read_records` reads (problem, chain of thought, answer) records from JSONL, Parquet or a
Hugging Face dataset (`hf:<owner>/<name>`, needs `datasets`). A record that cannot be read
(bad JSON, a missing or non-text field, a repeated id) raises `RecordError` naming the file and
line, or, with `skip_bad=True`, comes back as a rejection with its reason: never dropped
silently (architecture.md invariant 6).

An `Item` is one trajectory in the making: the source fields, the teacher's raw text and the
parsed `steps` (text, or code with its simulated and real output). It round-trips through JSON,
which is how the stage files store it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tirl.config import ConfigError
from tirl.synth.config import InputConfig


class RecordError(ConfigError):
    """A source record that cannot be used; the message names file and line."""


@dataclass
class Step:
    """A piece of a solution: free text, or a code block.

    For code, `simulated` is the output the teacher wrote (None if it wrote none), `real` what
    the sandbox printed (through `tirl.sandbox.format_result`), `output` the text the model is
    shown once the replace stage ran (rendering falls back to `simulated` before), `status` the
    sandbox status, and `expected_error` marks a failing block kept on purpose (self-correction).
    `tool` is the registered tool a code block is for (`tirl.tools`; stage files written before
    there were other tools have none and read as Python).
    """

    kind: str  # "text" or "code"
    text: str
    simulated: str | None = None
    real: str | None = None
    output: str | None = None
    status: str | None = None
    expected_error: bool = False
    tool: str = "python"


@dataclass
class Item:
    id: str
    problem: str
    answer: str
    cot: str = ""
    raw: str | None = None  # the teacher's text, before format correction
    steps: list[Step] = field(default_factory=list)
    source: str = ""  # "file:line"
    failed_block: int | None = None  # index in steps of a failed block awaiting self-correction

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Item:
        return cls(**{**d, "steps": [Step(**s) for s in d.get("steps", [])]})

    @property
    def code_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "code"]


@dataclass(frozen=True)
class Rejected:
    """A record that could not be read (kept only with skip_bad)."""

    id: str
    reason: str
    source: str


class _BadRecord(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}{detail}")
        self.reason = reason


def _rows(path: str, split: str) -> Iterator[tuple[str, Any]]:
    """(where, row) pairs; a row that is not valid JSON is yielded as an exception."""
    if path.startswith("hf:"):
        try:
            import datasets
        except ImportError:
            raise RecordError(
                f"{path}: reading a Hugging Face dataset needs `datasets` (pip install datasets)"
            ) from None
        for i, row in enumerate(datasets.load_dataset(path[3:], split=split)):
            yield f"{path}:{i}", row
        return
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"{p}: no such input file")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise RecordError(f"{p}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        for i, row in enumerate(pq.read_table(p).to_pylist(), 1):
            yield f"{p}:row {i}", row
        return
    with p.open(encoding="utf-8") as f:
        for i, line in _lines(f, p):
            if not line.strip():
                continue
            try:
                yield f"{p}:{i}", json.loads(line)
            except json.JSONDecodeError as e:
                yield f"{p}:{i}", _BadRecord("bad JSON", f" ({e.msg} at column {e.colno})")


def _lines(f, path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a text file; RecordError naming the line that is not UTF-8."""
    i = 0
    try:
        for i, line in enumerate(f, 1):
            yield i, line
    except UnicodeDecodeError as e:
        raise RecordError(
            f"{path}:{i + 1}: not UTF-8 text (byte {e.start} of a read block)"
        ) from None


def check_input_file(path: str | Path) -> None:
    """RecordError unless a JSONL input is UTF-8 text holding at least one record (a Parquet
    file is read by pyarrow): checked before a run writes anything."""
    p = Path(path)
    if p.suffix == ".parquet":
        return
    with p.open(encoding="utf-8") as f:
        if not any(line.strip() for _, line in _lines(f, p)):
            raise RecordError(f"{p}: holds no records (the file is empty)")


def _text(row: dict, name: str) -> str:
    if name not in row or row[name] is None:
        fields = ", ".join(map(str, row)) or "none"
        raise _BadRecord(f"missing field {name!r}", f" (the record has: {fields})")
    value = row[name]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise _BadRecord(f"field {name!r} is not text", f": got {str(value)[:60]!r}")
    return value


def record_id(problem: str) -> str:
    return hashlib.sha256(problem.encode()).hexdigest()[:16]


def read_records(path: str, cfg: InputConfig) -> Iterator[Item | Rejected]:
    """Items in input order; bad records raise RecordError, or are Rejected with skip_bad."""
    seen: set[str] = set()
    for where, row in _rows(str(path), cfg.split):
        try:
            if isinstance(row, Exception):
                raise row
            if not isinstance(row, dict):
                raise _BadRecord("not a JSON object", f": got {type(row).__name__}")
            problem = _text(row, cfg.problem_field)
            item = Item(
                id="",
                problem=problem,
                answer=_text(row, cfg.answer_field),
                cot=_text(row, cfg.cot_field),
                source=where,
            )
            has_id = cfg.id_field and row.get(cfg.id_field) is not None
            item.id = str(row[cfg.id_field]) if has_id else record_id(problem)
            if item.id in seen:
                raise _BadRecord("duplicate id", f" {item.id!r}")
        except _BadRecord as e:
            if not cfg.skip_bad_records:
                raise RecordError(
                    f"{where}: {e} (set input.skip_bad_records=true to count and skip such records)"
                ) from None
            yield Rejected(f"bad:{where}", e.reason, where)
            continue
        seen.add(item.id)
        yield item
