"""Quick latency/throughput check of tirl.sandbox against a fresh `python -c` per call.

    python bench/sandbox_quick.py [--preload sympy] [--seconds 2]

Prints one table: median session creation, trivial-cell p50/p99 and cells/s at concurrency 8,
for the sandbox (sessions forked from the zygote) and for the baseline that most RL stacks use
(a new interpreter per call, here started with the same executable). Runs in well under 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from tirl.sandbox import Sandbox, SandboxLimits

CELL = "1 + 1"
CONCURRENCY = 8


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


async def bench_sandbox(preload: tuple[str, ...], seconds: float) -> dict[str, float]:
    async with Sandbox(SandboxLimits(timeout_s=10), preload=preload) as sb:
        create = []
        for _ in range(30):
            t = time.perf_counter()
            s = await sb.session()
            create.append((time.perf_counter() - t) * 1000)
            await s.close()
        async with await sb.session() as s:
            for _ in range(20):  # warm up
                await s.run(CELL)
            cell = []
            for _ in range(500):
                t = time.perf_counter()
                await s.run(CELL)
                cell.append((time.perf_counter() - t) * 1000)
        sessions = [await sb.session() for _ in range(CONCURRENCY)]
        done = 0
        deadline = time.perf_counter() + seconds

        async def worker(s) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await s.run(CELL)
                done += 1

        t = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in sessions))
        rate = done / (time.perf_counter() - t)
    return {
        "create": statistics.median(create),
        "p50": pct(cell, 50),
        "p99": pct(cell, 99),
        "rate": rate,
    }


async def fresh_call(code: str) -> float:
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
    )
    await proc.communicate()
    return (time.perf_counter() - t) * 1000


async def bench_fresh(preload: tuple[str, ...], seconds: float) -> dict[str, float]:
    imports = f"import {', '.join(preload)}; " if preload else ""
    create = [await fresh_call(imports + "pass") for _ in range(10)]
    cell = [await fresh_call(imports + f"print({CELL})") for _ in range(20)]
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await fresh_call(imports + f"print({CELL})")
            done += 1

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    rate = done / (time.perf_counter() - t)
    return {
        "create": statistics.median(create),
        "p50": pct(cell, 50),
        "p99": pct(cell, 99),
        "rate": rate,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preload", default="math,fractions,itertools,functools,collections")
    ap.add_argument("--seconds", type=float, default=2.0, help="per throughput measurement")
    args = ap.parse_args()
    preload = tuple(m for m in args.preload.split(",") if m)
    sb = asyncio.run(bench_sandbox(preload, args.seconds))
    fresh = asyncio.run(bench_fresh(preload, args.seconds))
    rows = [
        ("session creation, median (ms)", "create", "{:.2f}"),
        (f"trivial cell `{CELL}` p50 (ms)", "p50", "{:.2f}"),
        (f"trivial cell `{CELL}` p99 (ms)", "p99", "{:.2f}"),
        (f"cells/s at concurrency {CONCURRENCY}", "rate", "{:.0f}"),
    ]
    print(f"preload: {', '.join(preload) or '-'}")
    print(f"| {'metric':<32} | {'sandbox':>9} | {'fresh python -c':>15} |")
    print(f"|{'-' * 34}|{'-' * 11}|{'-' * 17}|")
    for label, key, fmt in rows:
        print(f"| {label:<32} | {fmt.format(sb[key]):>9} | {fmt.format(fresh[key]):>15} |")


if __name__ == "__main__":
    main()
