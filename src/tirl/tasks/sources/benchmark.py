"""`benchmark`: evaluation items from a benchmark (`tirl.tasks.benchmark_files`), test split only.

`benchmark` is what `tirl eval --benchmark` takes: a name (math500, aime24, aime25, amc23,
olymmath-easy, olymmath-hard, hmmt; its file looked up in `benchmark_dir`, default
$TIRL_BENCHMARK_DIR), a .jsonl/.parquet file, `hf:<dataset>`, `races` (`races_n` RACES test
tasks, default 200, built in-process, seed 0), `rg:<dataset>` (`races_n` test items of a
reasoning-gym dataset, e.g. `rg:gsm_symbolic`, scored as boxed math answers) or a RACES tasks
file written by `tirl envs build`. `tirl eval --benchmark` gets its problems from this source, and scores them with
`tirl.tasks.scoring.score_trajectory` as every evaluation does. Every item is a test item, in
file order, and the split cycles; asking for a train item is a ConfigError: a benchmark trains
nothing.

Math items are scored like the `dataset` source (the last `\\boxed{}` against the gold answer,
through the math verifier; `source.verifier` as there); RACES items like the `races` source (the
operator reward). No demonstrations: these are evaluation items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tirl.config import ConfigError, setting
from tirl.tasks.base import SPLITS, DemoPart, Task
from tirl.tasks.registration import register_source
from tirl.tasks.sources.dataset import score_math
from tirl.tasks.sources.races import operator_task

_SKIPPED_META = ("row", "task")  # the source row and the RACES task dict (kept elsewhere)


@register_source("benchmark")
@dataclass
class BenchmarkSource:
    """Evaluation items of one benchmark (math or RACES)."""

    benchmark: str = setting(
        doc="a benchmark name, a .jsonl/.parquet file, hf:<dataset>, races, rg:<reasoning-gym"
        " dataset> (e.g. rg:gsm_symbolic), or a RACES tasks file"
    )
    benchmark_dir: str | None = setting(
        None, doc="where benchmark names are looked up (default: $TIRL_BENCHMARK_DIR)"
    )
    races_n: int = setting(
        200, ">= 1", "for races and rg:<dataset>: how many test items to build (seed 0)"
    )
    name: str = field(default="benchmark", init=False, repr=False)

    def __post_init__(self) -> None:
        self.verifier: Any = None  # a MathVerifier for math items; None: the default
        self._tasks: list[Task] | None = None

    def __getstate__(self) -> dict:
        # a verifier holds threads and processes, and tasks hold scorers: a copy makes its own
        return {**self.__dict__, "verifier": None, "_tasks": None}

    def validate(self) -> None:
        """Loads the benchmark (ConfigError naming `benchmark` and the file and line)."""
        self._load()

    def _load(self) -> list[Task]:
        if self._tasks is None:
            try:
                self._tasks = self.load_tasks()
            except (ValueError, ImportError) as e:
                raise ConfigError(f"benchmark: {e}", "benchmark") from None
        return self._tasks

    def load_tasks(self) -> list[Task]:
        """Every task of the benchmark, in file order (ValueError or ImportError, as the
        loaders of `tirl.tasks.benchmark_files` raise them, when it cannot be read). Each task
        keeps the benchmark's own item id in `meta["item_id"]` and its category (the subject,
        or the RACES operator) in `meta["category"]`."""
        from tirl.tasks.benchmark_files import (
            REASONING_GYM_PREFIX,
            is_benchmark_name,
            load_benchmark,
            load_races,
            load_reasoning_gym,
            races_task,
        )

        if self.benchmark == "races":
            items = load_races(self.races_n)
        elif self.benchmark.startswith(REASONING_GYM_PREFIX):
            items = load_reasoning_gym(self.benchmark, self.races_n)
        elif is_benchmark_name(self.benchmark):
            items = load_benchmark(self.benchmark, self.benchmark_dir)
        else:
            if self.benchmark_dir is not None:
                raise ValueError("benchmark_dir is for benchmark names; this one is read as a file")
            items = load_benchmark(self.benchmark)
        label = items[0].meta.get("benchmark", self.benchmark) if items else self.benchmark
        tasks = []
        for item in items:
            task_id = f"benchmark/{label}/{item.id}"
            if "task" in item.meta:
                task = operator_task(races_task(item), task_id, "test", self.name)
                task.meta.update(item_id=item.id, category=item.category)
                tasks.append(task)
            else:
                tasks.append(self._math_task(item, task_id))
        return tasks

    def _math_task(self, item: Any, task_id: str) -> Task:
        gold = item.answer
        meta = {k: v for k, v in item.meta.items() if k not in _SKIPPED_META}
        return Task(
            id=task_id,
            split="test",
            problem=item.problem,
            answer=gold,
            scorer=lambda text: score_math(gold, text, self.verifier),
            source=self.name,
            meta={**meta, "scoring": "math", "category": item.category, "item_id": item.id},
        )

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if split != "test":
            raise ConfigError(
                f"benchmark {self.benchmark} is for evaluation only: it has a test split and no"
                f" {split} split (train on a `dataset` or `races` source)"
            )

    def item(self, split: str, index: int) -> Task:
        self._check_split(split)
        tasks = self._load()
        return tasks[index % len(tasks)]

    def size(self, split: str) -> int | None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return len(self._load()) if split == "test" else 0

    def demonstration(self, task: Task, use_tools: bool) -> list[DemoPart] | None:
        return None
