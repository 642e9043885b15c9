"""How many answer verifications per second tirl's math verifier does, and what the pool costs.

    python bench/verify.py [--repeats 5] [--json /tmp/bench_verify.json]

Input: the labelled pairs in tests/data/verifier_cases.jsonl, without the "timeout" category
(those pairs take their whole timeout by design and would measure the timeout, not the
verifier). Every pair is distinct, so verify_batch's de-duplication does not help here.

Rows (median of --repeats passes over all pairs, each after one untimed warm-up pass):
- in-process judge: `judge()` called directly in this process, no pool and no timeout; the
  cost of math-verify plus tirl's guards on one core, the ceiling for one worker.
- in-process bare math-verify: `verify(parse(gold), parse(pred))`, for comparison.
- verify, sequential: one `MathVerifier.verify` call at a time (one round trip per pair).
- verify, 4 threads: four threads calling `verify` on one shared verifier.
- verify_batch: all pairs in one call (chunks of up to 16 pairs per worker round trip).
Pool rows run with 1 and with 2 worker processes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tirl.rewards.verify import MathVerifier, judge

CASES = Path(__file__).resolve().parents[1] / "tests" / "data" / "verifier_cases.jsonl"


def load_pairs() -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    return [(r["gold"], r["prediction"]) for r in rows if r["category"] != "timeout"]


def rate(run: Callable[[], object], n: int, repeats: int) -> float:
    """Median verifications per second over `repeats` timed passes (after one warm-up)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def threaded(verifier: MathVerifier, pairs: list[tuple[str, str]], threads: int) -> None:
    def work(part: list[tuple[str, str]]) -> None:
        for gold, pred in part:
            verifier.verify(gold, pred)

    pool = [threading.Thread(target=work, args=(pairs[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=5.0, help="per-pair timeout (s)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    pairs = load_pairs()
    n = len(pairs)
    rows: list[tuple[str, int | str, float]] = []
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" warnings
    ours = lambda: [judge(g, p) for g, p in pairs]  # noqa: E731
    rows.append(("in-process judge (no pool)", "-", rate(ours, n, args.repeats)))
    bare = lambda: [judge(g, p, mode="bare") for g, p in pairs]  # noqa: E731
    rows.append(("in-process bare math-verify", "-", rate(bare, n, args.repeats)))
    for workers in (1, 2):
        with MathVerifier(workers=workers, timeout_s=args.timeout) as v:
            v.verify_batch(pairs[:8])  # workers started
            seq = lambda: [v.verify(g, p) for g, p in pairs]  # noqa: E731, B023
            rows.append(("verify, sequential", workers, rate(seq, n, args.repeats)))
            thr = lambda: threaded(v, pairs, 4)  # noqa: E731, B023
            rows.append(("verify, 4 threads", workers, rate(thr, n, args.repeats)))
            bat = lambda: v.verify_batch(pairs)  # noqa: E731, B023
            rows.append(("verify_batch", workers, rate(bat, n, args.repeats)))

    load = os.getloadavg()[0]
    print(f"{n} labelled pairs (timeout category left out), {os.cpu_count()} CPUs, load {load:.2f}")
    print(f"median of {args.repeats} passes after one warm-up pass")
    print(f"| {'how':<30} | {'workers':>7} | {'verifications/s':>15} |")
    print(f"|{'-' * 32}|{'-' * 8}:|{'-' * 16}:|")
    for how, workers, per_s in rows:
        print(f"| {how:<30} | {workers!s:>7} | {per_s:>15.1f} |")
    if args.json:
        data = [{"how": h, "workers": w, "per_s": r} for h, w, r in rows]
        args.json.write_text(json.dumps({"pairs": n, "load": load, "rows": data}, indent=2))


if __name__ == "__main__":
    main()
