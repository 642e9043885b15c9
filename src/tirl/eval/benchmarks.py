"""Evaluation benchmarks as one record type, `BenchmarkItem`: the loaders of
`tirl.tasks.benchmark_files`, re-exported for evaluation's users.

The file reading moved down to `tirl.tasks`, where the `benchmark` task source turns these
items into `Task`s; `tirl eval --benchmark` gets its problems from that source
(`tirl.eval.benchmark_eval.benchmark_tasks`), not from these loaders directly. See
`tirl.tasks.benchmark_files` for the formats, the quirks of the real files and the errors.
"""

from __future__ import annotations

from tirl.tasks.benchmark_files import (
    ALIASES,
    BENCHMARK_DIR_ENV,
    BENCHMARKS,
    HF_PREFIX,
    RACES_FIELDS,
    ROLES,
    SUFFIXES,
    BenchmarkItem,
    BenchmarkSpec,
    is_benchmark_name,
    load_benchmark,
    load_races,
    races_items,
    races_task,
    read_races_tasks,
)

__all__ = [
    "ALIASES",
    "BENCHMARKS",
    "BENCHMARK_DIR_ENV",
    "HF_PREFIX",
    "RACES_FIELDS",
    "ROLES",
    "SUFFIXES",
    "BenchmarkItem",
    "BenchmarkSpec",
    "is_benchmark_name",
    "load_benchmark",
    "load_races",
    "races_items",
    "races_task",
    "read_races_tasks",
]
