"""How fast tirl makes verified RACES tasks, against reasoning-gym in the same run.

    python bench/envs.py [--tasks 2000] [--repeats 3] [--baseline-src DIR] [--json PATH]
    python bench/envs.py --quick          # a short run while developing

Rows (medians over --repeats; one process per measurement, so the rates are per core):
- tirl composite tasks: `build_tasks` (randomized BFS with every quality check, then a task of an
  operator drawn from the default mixture) plus scoring the task's reference answer with the
  operator's reward, which must give 1.0; sizes 2-5. Measured at --tasks and at 10x --tasks:
  before issue 30 the search for size 5 walked levels 1-4 of its first round (about 18,000
  states at level 4) before it yielded its first composite, a fixed cost that a larger build
  spread over more tasks; since, the searches run the states their yields descend from, and
  the two rates differ by what a long build holds (more rounds of the small sizes, a larger
  memo for the garbage collector to walk).
- tirl distinct composites: what one search yields (sizes 2-5, shortest first), every quality
  check included, without turning them into tasks.
- tirl atomic items: sample an input, run the mapper, render the gold and verify it, cycling
  over every library environment.
- reasoning-gym items (only if `reasoning_gym` imports): `create_dataset(name, size, seed)` and
  `score_answer(entry["answer"], entry)` over a fixed set of procedural tasks; reasoning-gym has
  no composition, so this is its single-task rate.

`--baseline-src DIR` measures the composite rows of another tirl source tree too, in the same
run and alternating with this one (for the tree before issue 30's search:
`mkdir -p /tmp/plain30 && git archive 370123e src | tar -x -C /tmp/plain30`, then
`--baseline-src /tmp/plain30/src`; 7f06b58 is the tree before issue 17). Each measurement runs
in a fresh interpreter (`--measure`), so neither tree warms the other's caches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
RG_HINT = (
    "reasoning-gym is not installed; for its row: pip install -e '.[reasoning-gym]' (the dev"
    " extra has it too), then run this script again"
)


def tirl_composites(n: int, seed: int) -> tuple[float, dict[str, int]]:
    import tirl.envs.library  # noqa: F401
    from tirl.envs.core import REGISTRY
    from tirl.envs.dataset import BuildConfig, build_tasks
    from tirl.envs.operators import score

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
    import tirl.envs.library  # noqa: F401
    from tirl.envs.core import REGISTRY
    from tirl.envs.search import SearchConfig, search, take

    start = time.perf_counter()
    found = take(search(REGISTRY, seed, SearchConfig(min_size=2, max_size=5)), n)
    assert len({t.names() for t in found}) == len(found) == n
    return n / (time.perf_counter() - start)


def tirl_atomic(n: int, seed: int) -> float:
    import tirl.envs.library  # noqa: F401
    from tirl.envs.core import REGISTRY
    from tirl.envs.seeding import item_rng

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


MEASURES = {
    "composite": lambda n, seed: tirl_composites(n, seed)[0],
    "search": tirl_search,
    "atomic": tirl_atomic,
    "reasoning_gym": reasoning_gym_items,
}


def measure(what: str, n: int, seed: int, src: str | None = None) -> float | None:
    """One measurement in a fresh interpreter, with `src` first on the path if given."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, "--measure", what, "--tasks", str(n), "--seed", str(seed)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench/envs.py: {what} (src {src or 'this tree'}) failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=2000, help="items per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="--tasks 500 --repeats 1")
    ap.add_argument("--baseline-src", help="another tirl source tree to measure beside this one")
    ap.add_argument("--json", help="write the raw rates here")
    ap.add_argument("--measure", choices=sorted(MEASURES), help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps({"rate": MEASURES[args.measure](args.tasks, args.seed)}))
        return
    if args.quick:
        args.tasks, args.repeats = 500, 1
    if args.baseline_src and not (Path(args.baseline_src) / "tirl" / "envs").is_dir():
        raise SystemExit(f"--baseline-src {args.baseline_src}: no tirl/envs there")
    n, big = args.tasks, 10 * args.tasks
    load = [os.getloadavg()]
    runs = [("composite", n), ("composite_big", big), ("search", 5 * n), ("atomic", n)]
    runs.append(("reasoning_gym", n))
    raw: dict[str, list[float]] = {key: [] for key, _ in runs}
    base: dict[str, list[float]] = {"composite": [], "composite_big": []}
    for r in range(args.repeats):
        for key, count in runs:
            what = "composite" if key.startswith("composite") else key
            pair = [(raw, None)]
            if args.baseline_src and key in base:
                pair.append((base, args.baseline_src))
                if r % 2:
                    pair.reverse()  # alternate which tree goes first
            for sink, src in pair:
                rate = measure(what, count, r, src)
                if rate is not None:
                    sink[key].append(rate)
        load.append(os.getloadavg())
    print(
        f"{args.tasks} items per measurement (composites also {big}), median of"
        f" {args.repeats}; load average before/after each repeat:"
        f" {', '.join(f'{a:.1f}' for a, _, _ in load)}\n"
    )
    labels = {
        "composite": f"tirl composite tasks, n={n}, sizes 2-5 (search + QC + operator + reward)",
        "composite_big": f"tirl composite tasks, n={big}, sizes 2-5 (same)",
        "search": "tirl distinct composites from one search (QC included, shortest first)",
        "atomic": "tirl atomic items (sample + map + verify)",
        "reasoning_gym": f"reasoning-gym items ({len(RG_TASKS)} procedural tasks, create + score)",
    }
    if args.baseline_src:
        print(f"| generator | items/s per core | baseline ({args.baseline_src}) | speed-up |")
        print("|---|---:|---:|---:|")
    else:
        print("| generator | items/s per core |\n|---|---:|")
    for key, label in labels.items():
        now = f"{statistics.median(raw[key]):,.0f}" if raw[key] else "not installed"
        if not args.baseline_src:
            print(f"| {label} | {now} |")
        elif key in base and base[key] and raw[key]:
            before = statistics.median(base[key])
            ratio = statistics.median(raw[key]) / before
            print(f"| {label} | {now} | {before:,.0f} | {ratio:.1f}x |")
        else:
            print(f"| {label} | {now} | | |")
    if not raw["reasoning_gym"]:
        print(f"\n{RG_HINT}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"raw": raw, "baseline": base, "load": load}, f, indent=2)


if __name__ == "__main__":
    main()
