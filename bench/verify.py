"""How many answer verifications per second tirl's math verifier does, against the sympy-only path
and bare math-verify, on model-like predictions for real benchmark golds and on the labelled set.

    python bench/verify.py [--repeats 3] [--quick] [--json /tmp/bench_verify.json]

The model-like mix (`model_like_pairs`): every gold answer in ../shared/data/benchmarks (MATH-500,
AIME 24/25, AMC 23, OlymMATH; the section is skipped, saying so, where that folder is absent),
each against up to five predictions as a policy writes them: an exact copy; the same answer
restyled (`\\dfrac`, `\\left(`, spaces); an equivalent form (`0.5` for `\\frac12`, `x = 3`,
`1,000`, terms in another order, units or degree signs dropped, a list reordered); a near miss
(another integer, one digit changed); and another gold of the benchmarks. Identical pairs are
dropped (verify_batch would run them once), so every pair costs a verification.

Rows, each the median of --repeats passes over the same pairs (alternating order, so load drift
hits all rows alike), each pool after one untimed pass (its verdicts are the ones checked):
- verify_batch, 2 workers, "guarded": tirl's verifier, the fast path in the caller then the
  pool, without a cache (with distinct pairs a first pass would not hit it anyway);
- the same with the default cache, every pair already in it (a second epoch, say);
- verify_batch, 2 workers, "slow": the same pipeline with every pair through sympy, i.e. the
  verifier before the fast path (the baseline);
- in-process bare math-verify (`verify(parse(g), parse(p))`, one core): what users would call;
- in-process fast path alone (`quick_verdict`, one core).
Columns: verifications per second of wall time; CPU seconds per 1000 verifications (this
process plus the pools' workers, read from /proc: far less sensitive than wall time to the
other jobs on a shared machine); and the rate that CPU time gives on two idle cores, the
caller's share running alone and the workers' share split over both cores (an estimate: it
assumes the workers' load is even and does not overlap the caller's).

Checks printed under each table: the share of pairs the fast path decides, that the guarded and
slow verdicts are identical on every pair, and each mode's agreement with the expected verdicts
(the mix's are by construction, so a disagreement may be the generator's: it is listed).

The labelled section does the same on tests/data/verifier_cases.jsonl (adversarial by design:
few plain numbers), without the "timeout" category (those pairs take their whole timeout by
design and would measure the timeout, not the verifier). --quick: every 5th pair, one pass.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from tirl.rewards.answer import extract_boxed
from tirl.rewards.verify import MathVerifier, Verdict, judge, quick_verdict

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "verifier_cases.jsonl"
BENCHMARKS = ROOT.parent / "shared" / "data" / "benchmarks"
WARM_UP = ("\\sqrt{2}", "2^{1/2}")  # a pair only sympy decides: the workers are up and warm
GUARDED = "verify_batch, 2 workers, guarded (fast path), no cache"

Pair = tuple[str, str]


# ---------------------------------------------------------------- inputs


def labelled_pairs() -> list[tuple[str, str, bool]]:
    rows = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    return [(r["gold"], r["prediction"], r["expected"]) for r in rows if r["category"] != "timeout"]


def benchmark_golds(folder: Path) -> list[str]:
    """Every gold answer of every benchmark file, read as tests/test_verify.py reads them."""
    golds = []
    for path in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if "answer" in rows[0]:  # amc23 answers are JSON floats (27.0)
            golds += [str(r["answer"]) for r in rows]
        else:  # aime25: the solution is only `\boxed{N}`
            golds += [extract_boxed(r["solution"]) or "" for r in rows]
    return [g for g in golds if g]


_INT = re.compile(r"(-?)(\d+)(\.0)?")
_FRAC = re.compile(r"(-?)\\[dt]?frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))")
_DECIMAL = re.compile(r"-?\d*\.\d+")
_DEGREES = re.compile(r"(\d+)\^(?:\\circ|\{\\circ\})")
_TEXT = re.compile(r"\\text\{([^{}]*)\}")
_UNIT = re.compile(r"\s*\\(?:text|mbox)\{\s*[A-Za-z ]+\}(?:\^2)?$")
_THOUSANDS = re.compile(r"(\\\$)?(\d{1,3}(?:,(?:\\!)?\s?\d{3})+)")
_COEF_SQRT = re.compile(r"(\d+)\s*(\\sqrt)")


def _top_level_split(s: str, seps: str) -> list[tuple[str, str]]:
    """(separator, part) pieces of `s` split at `seps` outside brackets; the first separator ''."""
    parts, depth, start, sep = [], 0, 0, ""
    for i, ch in enumerate(s):
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif depth == 0 and ch in seps and i > 0 and s[i - 1] not in "^_{(,=\\" and s[:i].strip():
            parts.append((sep, s[start:i].strip()))
            sep, start = ch, i + 1
    parts.append((sep, s[start:].strip()))
    return parts


def _sum_reordered(g: str) -> str | None:
    """`a + b - c` as `b - c + a`, or None if `g` is not a sum of terms."""
    if any(c in g for c in ",=<>") or any(w in g for w in ("\\pm", "\\cup", "\\begin", "\\\\")):
        return None
    terms = _top_level_split(g, "+-")
    if len(terms) < 2 or any(not t for _, t in terms):
        return None
    signed = [("-" if sep == "-" else "+", t) for sep, t in terms]
    if signed[0][1].startswith("-"):  # a leading minus belongs to the first term's sign
        signed[0] = ("-", signed[0][1][1:].strip())
    text = " ".join(f"{s} {t}" for s, t in signed[1:] + signed[:1])
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def restyled(g: str) -> str | None:
    """The same answer typeset otherwise (`\\dfrac`, `\\left(`, spaces), or None."""
    if "\\frac" in g and "\\dfrac" not in g:
        return g.replace("\\frac", "\\dfrac")
    if "\\left" in g:
        return re.sub(r"\\(?:left|right)(?![A-Za-z])\s*", "", g)
    if g[:1] in "([" and g[-1:] in ")]":
        return f"\\left{g[0]} {g[1:-1]} \\right{g[-1]}"
    if "^\\circ" in g:
        return g.replace("^\\circ", "^{\\circ}")
    if re.search(r"\S[+-]\S", g):
        return re.sub(r"(?<=\S)([+-])(?=\S)", r" \1 ", g)
    if re.search(r" [+-] ", g):
        return re.sub(r" ([+-]) ", r"\1", g)
    return None


def equivalent(g: str, rng: random.Random) -> str | None:
    """A different form with the same value, as models write it, or None if none applies."""
    if m := _INT.fullmatch(g):
        n = int(m[1] + m[2])
        if len(m[2]) > 1 and m[2].startswith("0") or m[3]:
            return str(n)  # AIME `025`, AMC `27.0`
        grouped = [f"{n:,}", f"{n:,}".replace(",", "{,}")] if n >= 1000 else []
        return rng.choice([f"{n}.0", f"x = {n}", *grouped])
    if m := _FRAC.fullmatch(g):
        sign, a, b = m[1], int(m[2] or m[3]), int(m[4] or m[5])
        forms = [f"{sign}{a}/{b}"]
        if (Fraction(a, b) * 10**6).denominator == 1:
            forms.append(sign + format(a / b, "g"))
        if sign:
            forms.append(f"\\frac{{-{a}}}{{{b}}}")
        return rng.choice(forms)
    if _DECIMAL.fullmatch(g):
        value = Fraction(g)
        return f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
    if m := _DEGREES.fullmatch(g):
        return m[1]
    if m := _TEXT.fullmatch(g):
        return m[1]
    if m := _THOUSANDS.fullmatch(g):
        return re.sub(r"\D", "", m[2])
    if _UNIT.search(g) and (bare := _UNIT.sub("", g)):
        return bare
    if g.startswith("\\{") and g.endswith("\\}"):
        items = _top_level_split(g[2:-2], ",")
        return "\\{" + ", ".join(t for _, t in reversed(items)) + "\\}" if len(items) > 1 else None
    if "," in g and g[:1] not in "([\\" and len(items := _top_level_split(g, ",")) > 1:
        return ", ".join(t for _, t in reversed(items))  # a list of solutions, in another order
    if (lhs := re.match(r"([a-z]) = ", g)) and (rhs := _sum_reordered(g[lhs.end() :])):
        return f"{lhs[1]} = {rhs}"
    if reordered := _sum_reordered(g):
        return reordered
    if m := re.fullmatch(r"\\frac\{([^{}]+|\\sqrt\{\d+\})\}\{(\d+)\}", g):
        top = f"({m[1]})" if re.search(r"[-+ ]", m[1]) else m[1]
        return f"{top}/{m[2]}"
    if _COEF_SQRT.search(g):
        return _COEF_SQRT.sub(r"\1 \\cdot \2", g, count=1)
    return None


def wrong_near(g: str, rng: random.Random) -> str:
    """A wrong answer close to the gold: another integer, or one digit changed."""
    if m := _INT.fullmatch(g):
        n = int(m[1] + m[2])
        return str(rng.choice([n + 1, n - 1, 2 * n + 1, n + 10]))
    if m := re.fullmatch(r"\\text\{\(([A-E])\)\}", g):
        return f"\\text{{({'ABCDE'[('ABCDE'.index(m[1]) + 1) % 5]})}}"
    if m := _TEXT.fullmatch(g):
        return f"\\text{{{m[1][::-1]}}}"
    digits = [i for i, c in enumerate(g) if c.isdigit()]
    if digits:
        i = rng.choice(digits)
        return g[:i] + str((int(g[i]) + rng.randint(1, 8)) % 10) + g[i + 1 :]
    return g[1:] if g.startswith("-") else f"-({g})"


def model_like_pairs(golds: list[str], seed: int = 0) -> list[tuple[str, str, str, bool]]:
    """(gold, prediction, kind, expected) for each gold: its exact copy, a restyled and an
    equivalent form where one applies, a near miss and another gold; distinct pairs only."""
    rng = random.Random(seed)
    pairs: dict[Pair, tuple[str, bool]] = {}
    squeezed = [re.sub(r"\s+", "", g) for g in golds]
    for i, g in enumerate(golds):
        other = rng.choice([o for o, s in zip(golds, squeezed) if s != squeezed[i]])
        candidates = [
            (g, "exact", True),
            (restyled(g), "restyled", True),
            (equivalent(g, rng), "equivalent", True),
            (wrong_near(g, rng), "wrong", False),
            (other, "wrong", False),
        ]
        for pred, kind, expected in candidates:
            if pred is not None and (g, pred) not in pairs:
                pairs[(g, pred)] = (kind, expected)
    return [(g, p, kind, ok) for (g, p), (kind, ok) in pairs.items()]


# ---------------------------------------------------------------- timing and checks


def _children_cpu() -> float:
    """CPU seconds used so far by this process's live children (the pools' workers)."""
    total, me = 0, os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # fields: state, ppid, ... utime (12), stime (13)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _timed(run: Callable[[], object]) -> tuple[float, float, float]:
    """(wall seconds, this process's CPU seconds, the workers' CPU seconds) of one run."""
    wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
    run()
    return (
        time.perf_counter() - wall,
        time.process_time() - cpu,
        _children_cpu() - children,
    )


def _pool(mode: str, cache_size: int = 0) -> MathVerifier:
    verifier = MathVerifier(workers=2, mode=mode, cache_size=cache_size)  # type: ignore[arg-type]
    verifier.verify(*WARM_UP)  # both workers started (the first answer waits for all)
    return verifier


def run_set(rows: list[tuple[str, str, bool]], repeats: int) -> tuple[list[dict], dict]:
    """Time every row on the same pairs, and check the verdicts.

    Each pool first does one untimed pass (the workers' parser caches warm, as in a long run;
    its verdicts are the ones checked); the timed passes then alternate their order. The cold
    pools have no cache (cache_size=0: with distinct pairs a first pass never hits it anyway,
    and later passes must not either); the warm row is a default pool's second pass.
    """
    pairs = [(g, p) for g, p, _ in rows]
    expected = [ok for _, _, ok in rows]
    with _pool("guarded") as guarded, _pool("slow") as slow, _pool("guarded", 100_000) as cached:
        verdicts = {"guarded": guarded.verify_batch(pairs), "slow": slow.verify_batch(pairs)}
        verdicts["bare"] = [Verdict(*judge(g, p, "bare")) for g, p in pairs]
        cached.verify_batch(pairs)
        runs: list[tuple[str, Callable[[], object]]] = [
            (GUARDED, lambda: guarded.verify_batch(pairs)),
            ("verify_batch, 2 workers, guarded, all cached", lambda: cached.verify_batch(pairs)),
            (
                "verify_batch, 2 workers, slow: every pair via sympy",
                lambda: slow.verify_batch(pairs),
            ),
            ("in-process bare math-verify, one core", lambda: [judge(*x, "bare") for x in pairs]),
            ("in-process fast path alone, one core", lambda: [quick_verdict(*x) for x in pairs]),
        ]
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in runs}
        for rep in range(repeats):
            for name, run in runs if rep % 2 == 0 else runs[::-1]:
                times[name].append(_timed(run))
    table = []
    for name, runs_times in times.items():
        wall, caller, workers = (statistics.median(t[i] for t in runs_times) for i in range(3))
        # On two idle cores: the caller's share runs alone, the workers' share on both cores.
        table.append({
            "how": name,
            "per_s": len(pairs) / wall,
            "cpu_ms_per_1000": 1000 * (caller + workers) / len(pairs) * 1000,
            "idle_2_core_per_s": len(pairs) / (caller + workers / 2),
        })  # fmt: skip
    quick = [quick_verdict(g, p) for g, p in pairs]
    report: dict = {
        "pairs": len(pairs),
        "fast_decided": sum(q is not None for q in quick),
        "guarded_differs_from_slow": [
            i for i, (a, b) in enumerate(zip(verdicts["guarded"], verdicts["slow"])) if a != b
        ],
    }
    for name, found in verdicts.items():
        wrong = [i for i, v in enumerate(found) if v.correct != expected[i]]
        report[name] = {
            "agree": 1 - len(wrong) / len(pairs),
            "accepts_wrong": [pairs[i] for i in wrong if not expected[i]],
            "rejects_right": [pairs[i] for i in wrong if expected[i]],
        }
    return table, report


def print_section(title: str, table: list[dict], report: dict, pairs: list[Pair]) -> None:
    print(f"\n## {title}")
    print(f"| {'how':<56} | {'per s':>6} | {'CPU s / 1000':>12} | {'idle 2-core est.':>16} |")
    print(f"|{'-' * 58}|{'-' * 7}:|{'-' * 13}:|{'-' * 17}:|")
    for row in table:
        print(f"| {row['how']:<56} | {row['per_s']:>6.0f} | {row['cpu_ms_per_1000'] / 1000:>12.2f} "
              f"| {row['idle_2_core_per_s']:>16.0f} |")  # fmt: skip
    n, differ = report["pairs"], report["guarded_differs_from_slow"]
    decided = report["fast_decided"]
    print(f"{n} pairs; the fast path decides {decided} ({decided / n:.0%}); "
          f"guarded and slow verdicts differ on {len(differ)}")  # fmt: skip
    for i in differ:
        print(f"  DIFFERS: {pairs[i]!r}")
    for name in ("guarded", "slow", "bare"):
        r = report[name]
        accepts, rejects = len(r["accepts_wrong"]), len(r["rejects_right"])
        print(f"{name:>8}: agrees with the expected verdict on {r['agree']:.1%}; "
              f"accepts {accepts} wrong, rejects {rejects} right")  # fmt: skip
        if name != "bare":
            for pair in r["accepts_wrong"] + r["rejects_right"]:
                print(f"          {pair!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat, every 5th pair")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" warnings
    judge(*WARM_UP, mode="bare")  # import sympy and load the parser outside the timings

    load_before = os.getloadavg()
    start = time.perf_counter()
    sets: list[tuple[str, list[tuple[str, str, bool]]]] = []
    if BENCHMARKS.is_dir():
        mix = model_like_pairs(benchmark_golds(BENCHMARKS))
        kinds = Counter(kind for _, _, kind, _ in mix)
        title = f"model-like mix ({', '.join(f'{k} {n}' for k, n in kinds.items())})"
        sets.append((title, [(g, p, ok) for g, p, _, ok in mix]))
    else:
        print(f"model-like mix skipped: {BENCHMARKS} is absent (the ../shared folder)")
    sets.append(("labelled set (tests/data/verifier_cases.jsonl, no timeouts)", labelled_pairs()))
    sections: dict[str, dict] = {}
    for title, rows in sets:
        if args.quick:
            rows = rows[::5]
            title += ", every 5th pair"
        table, report = run_set(rows, args.repeats)
        print_section(title, table, report, [(g, p) for g, p, _ in rows])
        sections[title] = {"rows": table, "check": report}
    load_after = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{', '.join(f'{x:.2f}' for x in load_after)}; median of {args.repeats}; "
          f"{time.perf_counter() - start:.0f} s in all")  # fmt: skip
    if args.json:
        data = {"load_before": load_before, "load_after": load_after, "sections": sections}
        args.json.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
