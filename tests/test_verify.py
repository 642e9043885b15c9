"""The math verifier: agreement with hand labels, no false positives, hard timeouts from threads,
asyncio and worker processes, self-verification of real benchmark golds, and answer extraction.

One verifier (2 worker processes) is shared by the module. Time bounds here are "does not hang"
bounds (timeout plus a generous margin for a loaded 2-core machine), not speed thresholds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from pathlib import Path

import pytest

from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.rewards.answer import answer_from_trajectory, extract_answer, extract_boxed
from tirl.rewards.verify import MathVerifier, Verdict, default_verifier, verify_answer

CASES_FILE = Path(__file__).parent / "data" / "verifier_cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line.strip()]
BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"

TIMEOUT_S = 3.0  # the per-comparison budget used by the shared verifier
MARGIN_S = 3.0  # a call may return this much after its timeout and still count as "no hang"

# Inputs that hang or crawl in sympy if evaluated; each must be refused or timed out.
ADVERSARIAL = [
    "(10^{7})!",
    "9^{9^{9^{9}}}",
    "10^{10^{10^{10}}}-10^{10^{10^{10}}}",
    "x^{" * 50 + "2" + "}" * 50,  # deeply nested
    "(" * 300 + "2" + ")" * 300,
    "\\frac{1}{" * 100 + "2" + "}" * 100,
    "1+" * 3000 + "1",
    "\\prod_{k=1}^{10^{7}} k",  # passes every guard: only the hard timeout stops it
]
STUCK = "\\prod_{k=1}^{10^{7}} k"


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(workers=2, timeout_s=TIMEOUT_S) as v:
        yield v


@pytest.fixture(scope="module")
def labelled(verifier):
    """Verdicts of tirl and of bare math-verify on every labelled case (computed once), and the
    bare verifier, closed after its batch (test_closed_verifier_refuses_work uses it).

    The `timeout` cases are all labelled wrong (test_labelled_file_covers_every_category), and
    their verdict is "not correct" whether a guard refuses them or the clock does, so ours gets
    them with the 1 s budget the never-hangs tests use: the three that only the clock stops
    then cost 1 s each instead of TIMEOUT_S."""
    pairs = [(c["gold"], c["prediction"]) for c in CASES]
    slow = [i for i, c in enumerate(CASES) if c["category"] == "timeout"]
    rest = [i for i in range(len(CASES)) if i not in set(slow)]
    ours: list[Verdict | None] = [None] * len(CASES)
    for indices, timeout in ((rest, TIMEOUT_S), (slow, 1.0)):
        verdicts = verifier.verify_batch([pairs[i] for i in indices], timeout_s=timeout)
        for i, verdict in zip(indices, verdicts, strict=True):
            ours[i] = verdict
    with MathVerifier(workers=2, timeout_s=TIMEOUT_S, mode="bare") as bare:
        theirs = bare.verify_batch(pairs)
    return ours, theirs, bare


def _score(verdicts: list[Verdict]) -> tuple[float, list[dict], list[dict]]:
    wrong = [c for c, v in zip(CASES, verdicts) if v.correct != c["expected"]]
    false_pos = [c for c in wrong if not c["expected"]]
    return 1 - len(wrong) / len(CASES), wrong, false_pos


# ---------------------------------------------------------------- labelled cases


def test_labelled_file_covers_every_category():
    assert len(CASES) >= 150
    assert all(set(c) == {"gold", "prediction", "expected", "category", "note"} for c in CASES)
    assert all(isinstance(c["expected"], bool) for c in CASES)
    assert len({(c["gold"], c["prediction"]) for c in CASES}) == len(CASES)
    needed = {"number", "fraction", "percent", "units", "text", "interval", "set", "tuple", "pm"}
    needed |= {"matrix", "expression", "equation", "huge", "tiny", "timeout"}
    assert needed <= {c["category"] for c in CASES}
    assert sum(c["note"].startswith("ambiguous") for c in CASES) >= 5
    assert not any(c["expected"] for c in CASES if c["category"] == "timeout")


def test_agrees_with_labels_and_never_accepts_a_wrong_answer(labelled):
    ours, theirs, _ = labelled
    agreement, wrong, false_pos = _score(ours)
    bare_agreement, _, bare_false_pos = _score(theirs)
    print(f"\ntirl verifier: {agreement:.1%} agreement, {len(false_pos)} false positives")
    print(
        f"bare math-verify: {bare_agreement:.1%} agreement, {len(bare_false_pos)} false positives"
    )
    for c in wrong:
        print(f"  disagrees: {c['category']}: {c['gold']!r} vs {c['prediction']!r}")
    assert false_pos == []
    assert agreement >= 0.98
    assert agreement >= bare_agreement


# ---------------------------------------------------------------- verdicts and reasons


def test_reasons_say_why_not(verifier):
    pairs = [
        ("5", None),
        ("5", "  "),
        ("5", "\\frac{"),
        ("5", "6"),
        ("1", "(10^{7})!"),
        ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}"),
        ("5\\text{ cm}", "5\\text{ m}"),
        ("5", "x" * 2000),
        ("5", "5"),
    ]
    reasons = [v.reason for v in verifier.verify_batch(pairs)]
    assert reasons[:4] == ["no answer", "no answer", "could not parse prediction", "not equivalent"]
    assert reasons[4] == "guard: number too large to evaluate exactly"
    assert reasons[5].startswith("guard: numbers differ")
    assert reasons[6].startswith("guard: units differ")
    assert reasons[7].startswith("guard: prediction longer than")
    assert reasons[8] == "equivalent"


def test_numbers_in_different_bases_differ(verifier):
    # math-verify drops the subscript: `204_5` matched `204_7` until a guard compared values.
    pairs = [("204_5", "204_7"), ("204_5", "204_{5}"), ("5_8", "5_7"), ("52_8", "42")]
    verdicts = verifier.verify_batch(pairs)
    assert [v.correct for v in verdicts] == [False, True, True, False]
    assert verdicts[0].reason == "guard: numbers in a base differ"


def test_identical_answers_are_equal_even_where_sympy_reads_complex_infinity(verifier):
    # `12:00`, `5:00` and `\frac{1}{0}` parse to zoo, which math-verify does not equate to itself.
    same = ["12:00", "5:00", "\\frac{1}{0}", "\\text{(C)}", "(10^{7})!"]
    same += [c["gold"] for c in CASES]  # every labelled gold against itself
    verdicts = verifier.verify_batch([(s, s) for s in same])
    assert [s for s, v in zip(same, verdicts) if not v.correct] == []
    respaced = [("12:00", "$12:00$"), ("\\frac{1}{0}", "\\frac {1}{0}"), ("5:00", " 5:00 ")]
    respaced += [
        ("\\frac{1}{0}", "\\dfrac{1}{0}"),
        ("\\left(\\frac{1}{0}\\right)", "(\\frac{1}{0})"),
    ]
    assert all(v.correct for v in verifier.verify_batch(respaced))
    different = [("12:00", "12:30"), ("5:00", "6:00"), ("\\text{New York}", "\\text{NewYork}")]
    assert not any(v.correct for v in verifier.verify_batch(different))


def test_a_whole_solution_is_judged_by_its_one_box(verifier):
    text = "For the second line, the angle is $\\boxed{{{}}}$. " + "We check it again. " * 60
    pairs = [("90^\\circ", text.format("90^\\circ")), ("90^\\circ", text.format("45^\\circ"))]
    assert [v.correct for v in verifier.verify_batch(pairs)] == [True, False]
    # several boxes are left to math-verify, which reads them as one set of answers
    assert verifier.verify("1,2", "\\boxed{1}, \\boxed{2}").correct


# Pairs only sympy decides (the fast path refuses `i` and `\sin`): they reach the workers.
SYMPY_PAIRS = [(f"{k}+{k + 1}i", f"{k + 1}i+{k}") for k in range(8)]


def test_verify_batch_keeps_order_and_runs_duplicates_once(verifier):
    pairs = [("1", "1"), ("2", "3"), ("1", "1"), ("4", None), ("\\frac12", "0.5")] * 20
    pairs += [("1+2i", "2i+1"), ("1+2i", "2i+3"), ("\\sin^2 x+\\cos^2 x", "1")] * 5
    expected = [True, False, True, False, True] * 20 + [True, False, True] * 5
    assert [v.correct for v in verifier.verify_batch(pairs)] == expected
    assert verifier.verify_batch([]) == []


def test_timeout_kills_the_stuck_worker_and_replaces_it(verifier):
    start = time.monotonic()
    verdict = verifier.verify("1", STUCK, timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert verdict == Verdict(False, "timed out after 1 s") and verdict.timed_out
    assert elapsed < 1.0 + MARGIN_S
    # Both workers answer again: the killed one was replaced.
    assert all(v.correct for v in verifier.verify_batch(SYMPY_PAIRS))


def test_batch_timeouts_are_per_pair(verifier):
    pairs = [("1", STUCK), ("2+i", "i+2"), ("1", STUCK), ("3+i", "i+3")]
    verdicts = verifier.verify_batch(pairs, timeout_s=0.5)
    assert [v.timed_out for v in verdicts] == [True, False, True, False]
    assert [v.correct for v in verdicts] == [False, True, False, True]


def test_closed_verifier_refuses_work(labelled):
    # The bare verifier of `labelled` did its batch and was then closed by its `with` block
    # (reusing it saves starting one more pool of workers).
    _, theirs, closed = labelled
    assert any(v.correct for v in theirs)  # it worked before it was closed
    with pytest.raises(RuntimeError, match="closed"):
        closed.verify("2", "2")


# ---------------------------------------------------------------- never hangs: thread, asyncio, process


def test_no_call_blocks_past_its_timeout_from_a_thread():
    results: list[tuple[Verdict, float]] = []

    def run() -> None:
        verify_answer("1", "1", timeout_s=1.0)  # start the default verifier's workers first
        for pred in ADVERSARIAL:
            start = time.monotonic()
            results.append((verify_answer("1", pred, timeout_s=1.0), time.monotonic() - start))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=len(ADVERSARIAL) * (1.0 + MARGIN_S) + 60)
    assert not thread.is_alive()
    assert len(results) == len(ADVERSARIAL)
    assert not any(verdict.correct for verdict, _ in results)
    assert max(elapsed for _, elapsed in results) < 1.0 + MARGIN_S
    assert results[-1][0].timed_out  # the one input no guard refuses


def test_no_call_blocks_past_its_timeout_from_asyncio(verifier):
    async def one(pred: str) -> tuple[Verdict, float]:
        start = time.monotonic()
        verdict = await verifier.averify("1", pred, timeout_s=1.0)
        return verdict, time.monotonic() - start

    async def main() -> list[tuple[Verdict, float]]:
        ticks = 0

        async def heartbeat() -> None:  # the event loop must keep running meanwhile
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        results = await asyncio.gather(*(one(p) for p in ADVERSARIAL), one("1"))
        beat.cancel()
        assert ticks >= 5
        return results

    results = asyncio.run(main())
    assert not any(verdict.correct for verdict, _ in results[:-1])
    assert results[-1][0].correct
    assert max(elapsed for _, elapsed in results) < 1.0 + MARGIN_S


def _verify_in_worker_process(pred: str) -> tuple[bool, str, float]:
    verify_answer("1", "1")  # start this process's own verifier first
    start = time.monotonic()
    verdict = verify_answer("1", pred, timeout_s=1.0)
    return verdict.correct, verdict.reason, time.monotonic() - start


def test_no_call_blocks_past_its_timeout_from_a_worker_process():
    default_verifier()  # the parent has a verifier too; a forked child must not reuse it
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        futures = [pool.submit(_verify_in_worker_process, p) for p in ("(10^{7})!", STUCK)]
        results = [f.result(timeout=60) for f in futures]
    assert [correct for correct, _, _ in results] == [False, False]
    assert results[1][1] == "timed out after 1 s"
    assert max(elapsed for _, _, elapsed in results) < 1.0 + MARGIN_S


def test_many_threads_share_one_verifier(verifier):
    errors: list[str] = []

    def run(k: int) -> None:
        for i in range(5):  # half the pairs need sympy, half the fast path decides
            gold, pred = (
                (f"{k}+{i}i", f"{i}i+{k}")
                if i % 2
                else (f"\\frac{{{k}}}{{{i + 1}}}", f"{k}/{i + 1}")
            )
            if not verifier.verify(gold, pred).correct:
                errors.append(f"{gold} vs {pred}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []


# ---------------------------------------------------------------- real benchmark golds


def _benchmark_golds(path: Path) -> list[str]:
    """Each file's gold answers, per ../shared/data/benchmarks/README.md."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if "answer" in rows[0]:  # amc23 answers are JSON floats (27.0); the rest are strings
        return [str(r["answer"]) for r in rows]
    return [extract_boxed(r["solution"]) or "" for r in rows]  # aime25: only `\boxed{N}`


@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="../shared/data/benchmarks is not present")
def test_every_benchmark_gold_verifies_against_itself(verifier):
    files = sorted(BENCHMARKS.glob("*.jsonl"))
    assert files
    for path in files:
        golds = _benchmark_golds(path)
        assert all(golds), path.name
        verdicts = verifier.verify_batch([(g, g) for g in golds])
        failed = [(g, v.reason) for g, v in zip(golds, verdicts) if v.reason != "equivalent"]
        assert failed == [], path.name


@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="../shared/data/benchmarks is not present")
def test_benchmark_answer_quirks(verifier):
    amc = _benchmark_golds(BENCHMARKS / "amc23.jsonl")  # floats: 27.0 accepts 27
    aime = _benchmark_golds(BENCHMARKS / "aime24.jsonl")  # leading zeros: 025 accepts 25
    pairs = [(g, str(int(float(g)))) for g in amc] + [(g, str(int(g))) for g in aime]
    assert all(v.correct for v in verifier.verify_batch(pairs))
    assert any(g.startswith("0") for g in aime) and any(g.endswith(".0") for g in amc)


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{\left\{ 1, \sqrt{2} \right\}}", r"\left\{ 1, \sqrt{2} \right\}"),
        ("<answer>42</answer>", "42"),
        ("<answer>\n  \\frac{1}{2}\n</answer>", r"\frac{1}{2}"),
        (r"<answer>so the answer is \boxed{7}</answer>", "7"),  # a box inside the tag
        ("<ANSWER>3</ANSWER>", "3"),
        (r"<answer>1</answer> then \boxed{2}", "2"),  # the later answer wins ...
        (r"\boxed{2} then <answer>1</answer>", "1"),  # ... whichever format it is in
        ("<answer>1</answer> then <answer>2", None),  # the last one is cut off: no answer
        (r"<answer>1</answer> then \boxed{2", None),
        ("<answer> </answer>", None),
        ("no answer here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_formats():
    text = r"<answer>1</answer> \boxed{2}"
    assert extract_answer(text, formats=("answer_tag",)) == "1"
    assert extract_answer(text, formats=("boxed",)) == "2"
    with pytest.raises(ValueError, match="answer_tag"):
        extract_answer(text, formats=("xml",))


def _traj(*segs: tuple[SegmentKind, str]) -> Trajectory:
    return Trajectory(segments=[Segment(kind, [i], text) for i, (kind, text) in enumerate(segs)])


def test_interpreter_output_is_never_an_answer():
    M, T, P = SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.PROMPT
    both = ("boxed", "answer_tag")
    traj = _traj(
        (P, "Q"),
        (M, "```python\nprint('<answer>42</answer>')\n```\n"),
        (T, "```output\n<answer>42</answer>\n\\boxed{42}\n```\n"),
        (M, "The tool printed it."),
    )
    assert answer_from_trajectory(traj, formats=both) is None
    traj.segments.append(Segment(M, [9], "So <answer>41</answer>."))
    assert answer_from_trajectory(traj, formats=both) == "41"
    assert answer_from_trajectory(traj) is None  # boxed only by default, as before
