"""The RACES task generator's distribution: what the faster search (issue 30) builds must look like
what the search before it built, on 20,000 tasks.

Issue 30 changed which tasks a seed gives (probe inputs from a fixed pool per first environment,
candidate orders drawn per state, one lazy walk shared by every size), so the golden file can no
longer hold the old output; this test holds the old generator's *shape* instead:
`tests/data/races_old_distribution.json`, the statistics of `build_tasks(n=20000)` at commit
370123e (the code before the change) for seeds 0, 1 and 2, over the library of then (the frozen
environments of `tests/data/races_frozen_envs.txt`, which this test builds over now, so a new
environment in the library leaves it unchanged), recorded once with

    mkdir -p /tmp/plain30 && git archive 370123e src | tar -x -C /tmp/plain30
    PYTHONPATH=/tmp/plain30/src python tests/test_envs_races_distribution.py --record \\
        tests/data/races_old_distribution.json

(the old search did not count its rejections: `--record` counts them there by wrapping its step
check, its constant check and its path loop, see `_instrument_old_search`).

What is compared, per table of shares (operator, size, environment of each step, domain of each
step, type of the final answer) the total-variation distance, and per quality-control rate (the
share of attempted steps that fail a step check, of checked paths that repeat a composite, of
fresh paths whose output is constant, of composites hashed to the other split) the absolute
difference. The tolerances are set from how much the OLD generator moves between its own seeds
(`seed_spread` in the JSON): the new generator on seed 0 must be within those spreads plus a
margin of the old generator's seed-0 statistics.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

N_TASKS = 20_000
OLD = Path(__file__).parent / "data" / "races_old_distribution.json"
TABLES = ("operator", "size", "environment", "domain", "answer_type")
RATES = ("step_rejected", "path_duplicate", "path_constant", "other_split")


def shares(counts: Counter) -> dict[str, float]:
    total = sum(counts.values())
    return {str(k): v / total for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))}


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """TV(p, q) = 1/2 sum_k |p_k - q_k|: 0 for the same shares, 1 for disjoint supports."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def rates(counts: Counter) -> dict[str, float]:
    """The quality-control rejection rates from the search's counts (`search(counts=...)`)."""
    return {
        "step_rejected": counts["steps_rejected"] / max(1, counts["steps"]),
        "path_duplicate": counts["paths_duplicate"] / max(1, counts["paths"]),
        "path_constant": counts["paths_constant"]
        / max(1, counts["paths"] - counts["paths_duplicate"]),
        "other_split": counts["other_split"] / max(1, counts["yielded"]),
    }


def task_statistics(tasks: list, counts: Counter, registry: Any) -> dict[str, Any]:
    tables: dict[str, Counter] = {name: Counter() for name in TABLES}
    for task in tasks:
        envs = [registry.get(n) for n in task.envs]
        tables["operator"][task.operator] += 1
        tables["size"][len(envs)] += 1
        tables["environment"].update(e.name for e in envs)
        tables["domain"].update(e.domain for e in envs)
        tables["answer_type"][envs[-1].output.name] += 1
    return {
        "tasks": len(tasks),
        "shares": {name: shares(t) for name, t in tables.items()},
        "rates": rates(counts),
        "counts": dict(sorted(counts.items())),
    }


def build_statistics(seed: int, n: int = N_TASKS) -> dict[str, Any]:
    """Statistics of `build_tasks(n, seed)` with the default configuration, over the frozen
    environments (`tests/races_frozen.py`: the library the JSON was recorded on, which an
    environment added since does not change)."""
    from races_frozen import frozen_registry

    from tirl.envs import dataset

    library = frozen_registry()
    counts: Counter = Counter()
    config = dataset.BuildConfig(n=n, seed=seed)
    if "counts" in inspect.signature(dataset.build_tasks).parameters:
        tasks = list(dataset.build_tasks(library, config, counts=counts))
    else:  # the search before issue 30
        with _instrument_old_search(counts):
            tasks = list(dataset.build_tasks(library, config))
    return task_statistics(tasks, counts, library)


class _instrument_old_search:
    """Count the old search's rejections by wrapping it (it kept no counts): every call of its
    step check (`_Steps.step`, None = rejected), every path its main loop checks (the levels'
    `get` when called from `search` itself), every constant check (`_constant`, True =
    constant), every composite it yields, and every one `build_tasks` drops for the other split
    (yielded but not made into a task: counted as yields minus tasks at the end)."""

    def __init__(self, counts: Counter) -> None:
        self.counts = counts

    def __enter__(self) -> None:
        from tirl.envs import dataset
        from tirl.envs import search as mod

        counts = self.counts
        self.saved = [
            (mod._Steps, "step", mod._Steps.step),
            (mod._Level, "get", mod._Level.get),
            (mod._Roots, "get", mod._Roots.get),
            (mod, "_constant", mod._constant),
            (dataset, "search", dataset.search),
            (dataset, "make_task", dataset.make_task),
        ]
        step, level_get, roots_get = mod._Steps.step, mod._Level.get, mod._Roots.get
        constant, search, make_task = mod._constant, dataset.search, dataset.make_task

        def counted_step(self, *args):
            out = step(self, *args)
            counts["steps"] += 1
            counts["steps_rejected"] += out is None
            return out

        def counted(get):
            def wrapped(self, i):
                out = get(self, i)
                if out is not None and sys._getframe(1).f_code.co_name == "search":
                    counts["paths"] += 1
                return out

            return wrapped

        def counted_constant(*args):
            out = constant(*args)
            counts["paths_fresh"] += 1
            counts["paths_constant"] += out
            return out

        def counted_search(*args, **kwargs):
            for traj in search(*args, **kwargs):
                counts["yielded"] += 1
                yield traj

        def counted_task(*args):
            counts["tasks"] += 1
            return make_task(*args)

        mod._Steps.step = counted_step
        mod._Level.get, mod._Roots.get = counted(level_get), counted(roots_get)
        mod._constant = counted_constant
        dataset.search, dataset.make_task = counted_search, counted_task

    def __exit__(self, *exc: object) -> None:
        for owner, name, value in self.saved:
            setattr(owner, name, value)
        counts = self.counts
        counts["paths_duplicate"] = counts["paths"] - counts.pop("paths_fresh")
        counts["other_split"] = counts["yielded"] - counts.pop("tasks")


# Tolerances, set against the old generator's own spread over seeds 0-2 (`seed_spread` in the
# JSON) and what the new one measured on seed 0 when it was written (issue 30), as
# (tolerance, old spread, measured):
TV_TOLERANCE = {
    "operator": 0.03,  # spread 0.011, measured 0.005
    "size": 0.02,  # spread 0.006, measured 0.008
    "environment": 0.25,  # spread 0.160, measured 0.163: a seed's size-5 tasks come from few roots
    "domain": 0.10,  # spread 0.062, measured 0.041
    "answer_type": 0.06,  # spread 0.026, measured 0.021
}
RATE_TOLERANCE = {
    # spread 0.005, measured 0.028 (0.495 against 0.522): the old search ran whole levels below
    # a size (and cut level 5 by the length of level 4), the new one runs the states that its
    # yields descend from, a slightly different mix of states
    "step_rejected": 0.05,
    "path_duplicate": 0.01,  # spread 0.002, measured 0.002
    # spread 0.016, measured 0.021 (0.295 against 0.274): chains that share a first environment
    # share their probe inputs now, so their verdicts are correlated
    "path_constant": 0.04,
    "other_split": 0.01,  # spread 0.003, measured 0.002
}


def test_the_generator_keeps_the_old_distribution_on_20000_tasks():
    old = json.loads(OLD.read_text())["runs"]["0"]
    new = build_statistics(seed=0)
    assert new["tasks"] == old["tasks"] == N_TASKS
    far = {}
    for name, tolerance in TV_TOLERANCE.items():
        distance = total_variation(new["shares"][name], old["shares"][name])
        if distance > tolerance:
            far[name] = f"total variation {distance:.3f} > {tolerance}"
    for name, tolerance in RATE_TOLERANCE.items():
        difference = abs(new["rates"][name] - old["rates"][name])
        if difference > tolerance:
            far[name] = (
                f"rate {new['rates'][name]:.3f} against {old['rates'][name]:.3f} (> {tolerance})"
            )
    assert not far, far


def record(path: str) -> None:
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    import tirl.envs.search

    runs = {str(seed): build_statistics(seed) for seed in (0, 1, 2)}
    spread: dict[str, dict[str, float]] = {"tv": {}, "rate": {}}
    pairs = [("0", "1"), ("0", "2"), ("1", "2")]
    for name in TABLES:
        spread["tv"][name] = max(
            total_variation(runs[a]["shares"][name], runs[b]["shares"][name]) for a, b in pairs
        )
    for name in RATES:
        spread["rate"][name] = max(
            abs(runs[a]["rates"][name] - runs[b]["rates"][name]) for a, b in pairs
        )
    out = {
        "produced_by": (
            f"PYTHONPATH=<tree> python tests/test_envs_races_distribution.py --record {path}"
            f" (search module {tirl.envs.search.__file__}, checkout at {commit})"
        ),
        "n": N_TASKS,
        "seed_spread": spread,
        "runs": runs,
    }
    Path(path).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":  # record the old generator's statistics (see the docstring)
    if sys.argv[1:2] != ["--record"] or len(sys.argv) != 3:
        sys.exit("usage: python tests/test_envs_races_distribution.py --record PATH")
    record(sys.argv[2])
