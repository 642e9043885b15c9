"""How fast tirl makes verified RACES tasks, against reasoning-gym in the same run.

    python bench/envs.py [--tasks 2000] [--repeats 3] [--json /tmp/bench_envs.json]

Rows (medians over --repeats; one process, so the rates are per core):
- tirl composite tasks: `build_tasks` (randomized BFS with every quality check, then a task of an
  operator drawn from the default mixture) plus scoring the task's reference answer with the
  operator's reward, which must give 1.0; sizes 2-5.
- tirl distinct composites: what one search yields (sizes 2-5, shortest first), every quality
  check included, without turning them into tasks.
- tirl atomic items: sample an input, run the mapper, render the gold and verify it, cycling
  over every library environment.
- reasoning-gym items (only if `reasoning_gym` imports): `create_dataset(name, size, seed)` and
  `score_answer(entry["answer"], entry)` over a fixed set of procedural tasks; reasoning-gym has
  no composition, so this is its single-task rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import tirl.envs.library  # noqa: F401
from tirl.envs.core import REGISTRY
from tirl.envs.dataset import BuildConfig, build_tasks
from tirl.envs.operators import score
from tirl.envs.search import SearchConfig, search, take
from tirl.envs.seeding import item_rng

RG_TASKS = (
    "basic_arithmetic",
    "chain_sum",
    "base_conversion",
    "gcd",
    "lcm",
    "prime_factorization",
    "spell_backward",
    "letter_counting",
    "word_sorting",
    "number_sorting",
    "rotate_matrix",
    "spiral_matrix",
    "largest_island",
    "calendar_arithmetic",
    "count_bits",
    "isomorphic_strings",
)


def tirl_composites(n: int, seed: int) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    sizes: dict[str, int] = {}
    made = 0
    for task in build_tasks(REGISTRY, BuildConfig(n=n, seed=seed)):
        reward = score(task, task.answer, REGISTRY)
        assert reward.value == 1.0, (task.envs, reward)
        sizes[str(task.meta["size"])] = sizes.get(str(task.meta["size"]), 0) + 1
        made += 1
    return made / (time.perf_counter() - start), sizes


def tirl_search(n: int, seed: int) -> float:
    """Distinct quality-controlled composites of size 2-5 from one search, per second."""
    start = time.perf_counter()
    found = take(search(REGISTRY, seed, SearchConfig(min_size=2, max_size=5)), n)
    assert len({t.names() for t in found}) == len(found) == n
    return n / (time.perf_counter() - start)


def tirl_atomic(n: int, seed: int) -> float:
    envs = sorted(REGISTRY, key=lambda e: e.name)
    start = time.perf_counter()
    for i in range(n):
        env = envs[i % len(envs)]
        x = env.sample(item_rng(env.name, "bench", "train", seed, i), 1)
        gold = env.apply(x)
        assert env.verify(env.output.render(gold), gold)[0]
    return n / (time.perf_counter() - start)


def reasoning_gym_items(n: int, seed: int) -> float | None:
    try:
        import reasoning_gym
    except ImportError:
        return None
    per_task = max(1, n // len(RG_TASKS))
    start = time.perf_counter()
    made = 0
    for name in RG_TASKS:
        data = reasoning_gym.create_dataset(name, size=per_task, seed=seed)
        for entry in data:
            assert data.score_answer(entry["answer"], entry) == 1.0, name
            made += 1
    return made / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=2000, help="items per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the raw rates here")
    args = ap.parse_args()
    raw: dict[str, list[float]] = {"composite": [], "search": [], "atomic": [], "reasoning_gym": []}
    sizes = {}
    for r in range(args.repeats):
        rate, sizes = tirl_composites(args.tasks, seed=r)
        raw["composite"].append(rate)
        raw["search"].append(tirl_search(5 * args.tasks, seed=r))
        raw["atomic"].append(tirl_atomic(args.tasks, seed=r))
        rg = reasoning_gym_items(args.tasks, seed=r)
        if rg is not None:
            raw["reasoning_gym"].append(rg)
    print(
        f"{len(REGISTRY)} environments in {len(REGISTRY.domains())} domains;"
        f" {args.tasks} items per measurement, median of {args.repeats}\n"
    )
    print("| generator | items/s per core |\n|---|---:|")
    labels = {
        "composite": "tirl composite tasks, sizes 2-5 uniform (search + QC + operator + reward)",
        "search": "tirl distinct composites from one search (QC included, shortest first)",
        "atomic": "tirl atomic items (sample + map + verify)",
        "reasoning_gym": f"reasoning-gym items ({len(RG_TASKS)} procedural tasks, create + score)",
    }
    for key, label in labels.items():
        if raw[key]:
            print(f"| {label} | {statistics.median(raw[key]):,.0f} |")
        else:
            print(f"| {label} | not installed |")
    print(f"\ncomposite sizes in the last run: {sizes}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"raw": raw, "sizes": sizes}, f, indent=2)


if __name__ == "__main__":
    main()
