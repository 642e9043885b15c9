"""`races`: composite RACES problems (`tirl.envs`) over a mixture of operators, sizes and levels.

Items are generated, or read from a tasks file:

- Generated (no `path`): the composites the search (`tirl.envs.search`) finds for the split,
  each turned into a task of an operator drawn from `mixture`, exactly as `tirl envs build` does
  (`tirl.envs.dataset.build_tasks`). Each item is kept only in the split its content hashes to,
  so train and test never share one. Each split's stream is an open generator, advanced only as
  far as the items asked for, and what it made is cached, so sequential access costs one
  generation per item. `size` is None; should the search run out of composites (a small `envs`
  subset), the split cycles over what it found. Known limits: while a split's generator is open
  in the main thread, the search's SIGALRM handler (its step timer) stays installed between
  calls; and the search drops a step whose mapper runs past its time limit (0.1 s), so on a badly
  overloaded machine two runs may see different streams.
- From a file (`path`, JSONL or Parquet written by `tirl envs build`): every row must be a task
  the registry can score (a bad row is a ConfigError naming file and line); each goes to the
  split its content hashes to (the same hash as generation), in file order, and a split cycles
  over its rows. The generation keys (`mixture`, sizes, `level`, `envs`) must keep their
  defaults then: they would have no effect.

Scored by the operator's reward (`tirl.envs.operators.score`; SEQUENTIAL and PARALLEL give
partial credit): correct only at reward 1, `predicted` the last `<answer>` block.

Teacher-free demonstrations (`tirl.envs.demos`): with tools, SEQUENTIAL and PARALLEL tasks are
solved in code built from each mapper's own source (one block binding the input, then one block
per step or branch), ending with the reference answer block; with `search_orders`, SORT and
SELECT by a search in code (one block defining each offered operation from its mapper and
trying the orders), ending with the order it found. A task whose code cannot be written (a
SORT/SELECT without `search_orders`, a value with no Python literal form, a SORT/SELECT whose
operations change the value's type, or whose first order found the task's input domains refuse)
gets the answer block alone (a Think part). Without tools: the answer block.
"""

from __future__ import annotations

import difflib
import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from tirl.config import ConfigError, setting
from tirl.envs.core import Environments
from tirl.envs.dataset import DEFAULT_MIXTURE, MAX_SIZE, BuildConfig, build_tasks
from tirl.envs.demos import operator_steps
from tirl.envs.operators import OPERATORS, OperatorTask, answer_block, score
from tirl.envs.seeding import split_of
from tirl.envs.types import AnswerError
from tirl.tasks.base import SPLITS, Code, DemoPart, Score, Task, Think
from tirl.tasks.registration import register_source


def environments() -> Environments:
    """Every environment: the library's and installed plugins' (`tirl.envs.registry`), read
    on first use so that importing the task sources does not load ~460 environments."""
    from tirl.envs.registry import REGISTRY

    return REGISTRY


def score_operator(
    task: OperatorTask, model_text: str, registry: Environments | None = None
) -> Score:
    """The operator reward of `model_text`; correct only at reward 1."""
    reward = score(task, model_text, registry or environments())
    try:
        predicted = answer_block(model_text)
    except AnswerError:
        predicted = None
    return Score(reward.value, reward.value == 1.0, reward.reason, predicted)


def operator_task(task: OperatorTask, task_id: str, split: str, source: str) -> Task:
    """A RACES operator task as a `Task` (meta: operator, size, environments, the stored task)."""
    return Task(
        id=task_id,
        split=split,
        problem=task.prompt,
        answer=task.answer,
        scorer=lambda text: score_operator(task, text),
        source=source,
        meta={
            "scoring": "races",
            "operator": task.operator,
            "size": len(task.envs),
            "envs": list(task.envs),
            "races_task": task.to_dict(),
        },
    )


def operator_demonstration(task: Task, use_tools: bool, search_orders: bool) -> list[DemoPart]:
    """See the module doc: code from the mappers with tools where it can be written (SORT and
    SELECT only with `search_orders`), else the reference answer block."""
    if use_tools:
        stored = OperatorTask.from_dict(task.meta["races_task"])
        steps = operator_steps(stored, environments(), search_orders)
        if not isinstance(steps, str):
            return [Think(text) if kind == "text" else Code(text) for kind, text in steps]
    return [Think(task.answer)]


def _content_split(task: OperatorTask) -> str:
    """The split a stored task belongs to: the hash `build_tasks` uses (path and x_0)."""
    return split_of("races", json.dumps([list(task.envs), task.xs[0]]))


def _check_mixture(mixture: dict[str, float]) -> str | None:
    unknown = sorted(set(mixture) - set(OPERATORS))
    if unknown:
        return f"names unknown operator {unknown[0]!r}; operators are {', '.join(OPERATORS)}"
    if any(w < 0 for w in mixture.values()) or sum(mixture.values()) <= 0:
        return "needs weights >= 0, not all 0"
    return None


@register_source("races")
@dataclass
class RacesSource:
    """Composite RACES problems: SEQUENTIAL, PARALLEL, SORT and SELECT over searched chains."""

    mixture: dict[str, float] = setting(
        factory=lambda: dict(DEFAULT_MIXTURE),
        doc="operator -> weight (sequential, parallel, sort, select)",
        check=_check_mixture,
    )
    min_size: int = setting(2, f"[1, {MAX_SIZE}]", "fewest environments in a chain")
    max_size: int = setting(5, f"[1, {MAX_SIZE}]", "most environments in a chain")
    level: int = setting(1, "[1, 3]", "difficulty level of the sampled inputs")
    envs: list[str] | None = setting(
        None, doc="only these environments (names like lists.reverse, or whole domains like lists)"
    )
    inputs_per_composite: int = setting(
        1,
        ">= 1",
        "tasks from one sequence of environments, each from another input (more than 1 lets a"
        " few environments give many tasks; train and test then share sequences, never inputs)",
    )
    path: str | None = setting(
        None, doc="a tasks file written by `tirl envs build` (JSONL/Parquet) instead of the search"
    )
    split_by: str = setting(
        "content",
        doc="with path: 'content' (each row's split is the hash of its content) or 'meta' (the"
        " row's meta.split)",
        check=lambda v: None if v in ("content", "meta") else "must be 'content' or 'meta'",
    )
    seed: int = setting(0, ">= 0", "seeds the search (default: the run's seed)")
    search_orders: bool = setting(
        False,
        doc="with tools, SORT and SELECT demonstrations find the order by a search in code (off:"
        " the answer alone; off by default, since at the tiny model's scale the longer code"
        " kept SFT from learning to copy numbers: BENCHMARKS.md)",
    )
    name: str = field(default="races", init=False, repr=False)

    def __post_init__(self) -> None:
        self._cache: dict[str, list[OperatorTask]] = {split: [] for split in SPLITS}
        self._exhausted: dict[str, bool] = {split: False for split in SPLITS}
        self._streams: dict[str, Iterator[OperatorTask]] = {}
        self._file: dict[str, list[OperatorTask]] | None = None
        self._registry: Environments | None = None
        self._checked = False

    # ------------------------------------------------------------------ checks

    def validate(self) -> None:
        """Checks the keys together and reads `path` (ConfigError naming the key, or the file
        and line); called by `make_source`, and on first use otherwise."""
        if self.min_size > self.max_size:
            raise ConfigError(
                f"min_size ({self.min_size}) must not exceed max_size ({self.max_size})",
                "max_size",
            )
        if self.split_by != "content" and self.path is None:
            raise ConfigError("split_by: applies to a tasks file (path) only", "split_by")
        if self.path is not None:
            defaults = RacesSource()
            keys = ("mixture", "min_size", "max_size", "level", "envs", "inputs_per_composite")
            changed = [k for k in keys if getattr(self, k) != getattr(defaults, k)]
            if changed:
                raise ConfigError(
                    f"{changed[0]}: applies to generated tasks only; with path the file's tasks"
                    " are used as they are",
                    changed[0],
                )
            self._read_file()
        else:
            self._generation_registry()
        self._checked = True

    def _ready(self) -> None:
        if not self._checked:
            self.validate()

    def _generation_registry(self) -> Environments:
        if self._registry is None:
            self._registry = environments() if self.envs is None else _subset(self.envs)
        return self._registry

    def _read_file(self) -> dict[str, list[OperatorTask]]:
        if self._file is None:
            from tirl.tasks.benchmark_files import read_races_tasks

            try:
                rows = read_races_tasks(self.path)
            except (ValueError, ImportError) as e:
                raise ConfigError(f"path: {e}", "path") from None
            self._file = {split: [] for split in SPLITS}
            for where, task in rows:
                self._file[self._row_split(where, task)].append(task)
        return self._file

    def _row_split(self, where: str, task: OperatorTask) -> str:
        if self.split_by == "content":
            return _content_split(task)
        split = (task.meta or {}).get("split")
        if split not in SPLITS:
            raise ConfigError(
                f"path: {where}: split_by is 'meta' but the row's meta.split is {split!r},"
                f" not one of {', '.join(SPLITS)}",
                "path",
            )
        return split

    # ------------------------------------------------------------------ items

    def _tasks(self, split: str, index: int) -> list[OperatorTask]:
        """The split's tasks, at least index + 1 of them unless the search ran out."""
        if self.path is not None:
            return self._read_file()[split]
        cache = self._cache[split]
        while index >= len(cache) and not self._exhausted[split]:
            task = next(self._stream(split), None)
            if task is None:
                self._exhausted[split] = True
            else:
                cache.append(task)
        return cache

    def _stream(self, split: str) -> Iterator[OperatorTask]:
        """The split's open generator, positioned after the cached tasks (a copy of the source,
        e.g. unpickled, opens a new one and skips what it already holds)."""
        if split not in self._streams:
            config = BuildConfig(
                n=sys.maxsize,
                seed=self.seed,
                split=split,
                mixture=dict(self.mixture),
                min_size=self.min_size,
                max_size=self.max_size,
                level=self.level,
                inputs_per_composite=self.inputs_per_composite,
            )
            stream = build_tasks(self._generation_registry(), config)
            for _ in itertools.islice(stream, len(self._cache[split])):
                pass
            self._streams[split] = stream
        return self._streams[split]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_streams"] = {}  # generators do not pickle; a copy reopens them
        state["_registry"] = None  # environments hold lambdas; a copy looks them up again
        return state

    def item(self, split: str, index: int) -> Task:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        self._ready()
        tasks = self._tasks(split, index)
        if not tasks:
            where = f"the tasks file {self.path}" if self.path else "the search"
            raise ConfigError(f"races: {where} gives no {split} task{self._why_empty(split)}")
        k = index % len(tasks)
        return operator_task(tasks[k], f"races/{split}/{k}", split, self.name)

    def _why_empty(self, split: str) -> str:
        if self.path is not None:
            held = sum(len(v) for v in self._read_file().values())
            return (
                f" (each task goes to the split its content hashes to; the file holds {held}"
                f" tasks, none of them {split} tasks)"
            )
        return f" with sizes {self.min_size}-{self.max_size} over these environments"

    def size(self, split: str) -> int | None:
        if self.path is None:
            return None
        self._ready()
        return len(self._read_file()[split])

    def demonstration(self, task: Task, use_tools: bool) -> list[DemoPart]:
        return operator_demonstration(task, use_tools, self.search_orders)


def _subset(names: list[str]) -> Environments:
    """The registry of the named environments; a name may also be a whole domain."""
    registry = environments()
    domains = registry.domains()
    chosen: dict[str, None] = {}
    for i, name in enumerate(names):
        if name in registry:
            chosen[name] = None
        elif name in domains:
            chosen.update(dict.fromkeys(e.name for e in registry if e.domain == name))
        else:
            close = difflib.get_close_matches(name, [*registry.names(), *domains], n=4)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"envs[{i}]: unknown environment or domain {name!r}{hint}"
                f" (`tirl envs list` shows them)",
                f"envs[{i}]",
            )
    if not chosen:
        raise ConfigError("envs: name at least one environment or domain", "envs")
    return registry.subset(sorted(chosen))
