"""The verifier's fast path and cache: wherever the fast path answers, its verdict is the one the
sympy path ("slow" mode) gives, on every labelled case, every peer case and model-like answers;
it refuses what latex2sympy reads otherwise than LaTeX does; cached verdicts are served
without a worker; and a closed verifier answers nothing.

The slow verdicts come from a "slow" pool of two workers (the same pipeline with the fast path
off), so the comparison runs the two paths as the verifier runs them.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from tirl.rewards._exact import ExactValue, exact_value
from tirl.rewards._judge import _string_steps
from tirl.rewards.verify import MathVerifier, Verdict, quick_verdict

CASES_FILE = Path(__file__).parent / "data" / "verifier_cases.jsonl"
PEER_FILE = Path(__file__).resolve().parents[2] / "shared/data/peer-tests/math-verify-cases.jsonl"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _matrix(*rows: str) -> str:
    return "\\begin{pmatrix} " + " \\\\ ".join(rows) + " \\end{pmatrix}"


# Model-like answers, each a form the fast path decides (asserted), against the slow path.
MODEL_LIKE = [
    # integers: leading zeros, floats from the interpreter, `x =`, grouped digits, dollars
    ("025", "25"), ("27.0", "27"), ("5", "5.0"), ("42", "x = 42"), ("x=3", "3"), ("x=3", "x=4"),
    ("1000", "1,000"), ("1,000", "1000"), ("1000", "1{,}000"), ("11,\\! 111", "11111"),
    ("\\$32,\\!348", "32348"), ("5", "\\$5"), ("42", "43"), ("2107", "2108"), ("-0", "0"),
    ("100000000000000000001", "100000000000000000000"), ("7.0", "2^{2020}"),
    # fractions and decimals
    ("\\frac{1}{2}", "0.5"), ("\\frac12", "1/2"), ("\\dfrac{17}{50}", "0.34"), ("\\frac 34", "3/4"),
    ("-\\frac{3}{8}", "\\frac{-3}{8}"), ("\\frac{1}{-2}", "-0.5"), ("\\frac{2}{4}", "\\frac{1}{2}"),
    ("4.5", "\\frac{9}{2}"), ("\\frac{1}{3}", "0.3"), ("0.34", "0.35"),
    ("\\frac{9}{19}", "\\frac9{19}"),
    # degrees, spacing, \left, \dfrac
    ("120^\\circ", "120"), ("120", "120^{\\circ}"), ("120^\\circ", "121"), ("- 2", "-2"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    # expressions: terms reordered, roots simplified, \cdot, powers, variables
    ("11 \\sqrt{5} + 11", "11+11\\sqrt{5}"), ("6\\sqrt{3}-5", "-5 + 6\\sqrt{3}"),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"), ("\\frac{\\sqrt{3}}{3}", "\\sqrt{3}/3"),
    ("2\\sqrt{5}", "\\sqrt{20}"), ("16\\sqrt{3}", "16 \\cdot \\sqrt{3}"), ("18+2\\pi", "2\\pi+18"),
    ("\\frac{\\pi}{6}", "\\pi/6"), ("-13x+3", "3-13x"), ("8n^2 + 4n + 1", "1+4n+8n^2"),
    ("(a+5)\\cdot(b+2)", "(b+2)\\cdot (a+5)"), ("x^2+2x+1", "(x+1)^2"),
    ("4\\times 3^{2010}-5\\times 2^{2010}+1", "1-5\\times 2^{2010}+4\\times 3^{2010}"),
    ("2k+2", "2k+3"), ("2k", "2n"),
    ("3\\sqrt{13}", "3\\sqrt{14}"), ("\\frac{\\sqrt{3}}{3}", "0.5"), ("70 \\sqrt{2}", "98"),
    # tuples and intervals: against numbers, and element by element
    ("(1,-16,-4,43)", "2"), ("(2,\\infty)", "279"), ("[7, 47]", "11"), ("(3,4]", "\\sqrt{2}"),
    ("(6,31,-1)", "(6,31,-7)"), ("(15,-29)", "(15,-29.0)"), ("(5,\\infty)", "(6,\\infty)"),
    ("\\left[ -\\frac{1}{8}, \\frac{1}{8} \\right]", "[-0.125,0.125]"), ("(1,2,3)", "(3,2,1)"),
    # sets, lists and plus-minus
    ("1,-2", "-2, 1"), ("3, 5, 7", "7, 5, 3"), ("1,2", "2,1,1"), ("-2\\pm3", "1,-5"),
    ("1 \\pm \\sqrt{19}", "1 \\pm \\sqrt{39}"), ("9", "1 \\pm \\sqrt{19}"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\{-2, 1\\pm\\sqrt{5}\\}"),
    ("3 \\pm 2 \\sqrt{2}", "3 \\pm 2 \\cdot \\sqrt{2}"), ("\\{1,2\\}", "1,3"), ("1,2,3", "1,2"),
    # units math-verify drops, and matrices element by element
    ("5\\text{ cm}", "5"), ("5.4 \\text{ cents}", "5.4"),
    ("864 \\mbox{ inches}^2", "866 \\mbox{ inches}^2"),
    ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"), ("15\\mbox{ cm}^2", "7"),
    (_matrix("-2", "-14"), _matrix("-2", "-1")),
    (_matrix("-1 & 0", "0 & -1"), _matrix("-1 & 0", "0 & -1.0")),
    (_matrix("1/5", "-18/5"), _matrix("\\frac15", "-3.6")),
    # plain numbers further apart than math-verify's arithmetic can miss
    ("1625.0", "1626"), ("\\frac{1}{1112111}", "\\frac{1}{9112111}"), ("1.5708", "\\frac{\\pi}{2}"),
]  # fmt: skip

# Spellings a reader of LaTeX would take otherwise than latex2sympy does. The fast path must
# agree with the slow path on each, or leave it to sympy.
MISREAD = [
    ("2^{23}", "2^23"),  # latex2sympy: 2^23 (LaTeX: 2^2 * 3)
    ("\\frac{1}{23}", "\\frac123"),  # 1/23
    ("\\frac{9}{19}", "\\frac{9}19"),  # not 9/19
    ("5", "2(3)"), ("5", "2 3"), ("1.8", "1\\frac{4}{5}"), ("6", "(2)(3)"),  # mixed numbers
    ("\\pi q^2", "\\pi(q^2)"), ("2k", "k(2)"), ("(a+5)(b+2)", "(b+2)(a+5)"),  # functions?
    ("\\frac{1}{2x}", "1/2x"),  # implicit multiplication binds tighter than /
    ("3", "e=3"), ("e=267", "267"), ("i = 0.484375", "i=0.458333"),  # e and i
    ("2c", "c+c"), ("2s", "s+s"),  # unit letters: math-verify drops `2c`'s "c"
    ("32349", "32, 349"), ("0.111", "0,111"), ("1219", "+1,219"), ("1452", "x=1,452"),
    ("[2,2]", "2"), ("[2,1)", "[3,1)"), ("1,1", "1"), ("\\{1\\}", "1"),  # sets collapse
    ("\\frac{1}{0}", "\\dfrac{1}{0}"), ("\\frac{1}{10^{30}}", "\\frac{1}{10^{30}+1}"),
    ("1,\\!136", "\\left(1,\\!136.\\right)"), ("\\frac{14}{11}", "(\\frac{14}{11}\\,)"),
    ("10^{20}+1", "1.0\\times 10^{20}"), ("1", "1.0000000000000000000001"),
    ("\\{3\\}", "3"), ("\\frac12, 1", "0.5, 1"), ("0,111", "0.111"), ("(1,2)", "1,2"),
    ("1,000", "1"), ("2x", "2.x"), ("(y,0.5)", "(y,0.-2)"),
    ("5 \\text{ ways}", "5"), ("5\\text{ cm}", "5\\text{ m}"),  # not a known unit; two units
    ("1,\\!379", "1, 379\\text{ cm}"), ("+01728^\\circ", "1728.00\\text{ cm}"),
    (_matrix("1", "2"), _matrix("1 & 2")), (_matrix("1/5", "-18/5"), _matrix("0.2", "-3.6")),
    ("6.283185", "2\\pi"), ("0.0000001", "0.0000002"), ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}"),
    # a difference far below the numbers passed through vanishes in sympy's 15-digit evalf
    ("(-(-10^{23}+ \\sqrt{27}-n*3)- 3)", "(-(-n \\cdot 3+\\sqrt{27}-10^{23}) -4)"),
    ("12 \\times 2^{2022} - 24", "12 \\times 2^{2022} - 20"),
]  # fmt: skip


@pytest.fixture(scope="module")
def slow():
    with MathVerifier(workers=2, timeout_s=10.0, mode="slow") as pool:
        yield pool


def _disagreements(slow: MathVerifier, pairs: list[tuple[str, str]]) -> list[tuple]:
    """(gold, prediction, fast, slow) wherever the fast path answers otherwise than sympy.

    Pairs the shared string steps settle (identical answers, text answers, length and nesting
    guards) run the same code in both modes; only those the fast path itself decides are sent
    to the slow pool."""
    quick = {pair: quick_verdict(*pair) for pair in pairs}
    decided = [p for p, v in quick.items() if v is not None and _string_steps(*p)[2] is None]
    slow_verdicts = slow.verify_batch(decided)
    return [
        (*pair, quick[pair], verdict)
        for pair, verdict in zip(decided, slow_verdicts)
        if Verdict(*quick[pair]) != verdict  # type: ignore[misc]
    ]


def test_fast_path_gives_the_slow_paths_verdict_on_every_labelled_and_peer_case(slow):
    pairs = [(c["gold"], c["prediction"]) for c in _jsonl(CASES_FILE)]
    if PEER_FILE.is_file():  # ../shared beside the checkout; the labelled cases suffice without
        pairs += [(c["gold"], c["pred"]) for c in _jsonl(PEER_FILE)]
    decided = sum(quick_verdict(*pair) is not None for pair in pairs)
    assert decided >= len(pairs) // 4  # the comparison covers a real share of the cases
    assert _disagreements(slow, pairs) == []


def test_fast_path_decides_model_like_answers_as_the_slow_path_does(slow):
    undecided = [pair for pair in MODEL_LIKE if quick_verdict(*pair) is None]
    assert undecided == []
    assert _disagreements(slow, MODEL_LIKE) == []


def test_fast_path_agrees_or_abstains_where_latex2sympy_reads_latex_its_own_way(slow):
    assert _disagreements(slow, MISREAD) == []
    # the constructs themselves are refused by the exact reader
    for text in ("2^23", "\\frac123", "\\frac{9}19", "2(3)", "2 3", "1\\frac{4}{5}", "(2)(3)"):
        assert exact_value(text) is None, text
    for text in ("e", "2i", "k(2)", "\\pi(2)", "x(1+x)", "{2}(3)", "x\\frac12"):
        assert exact_value(text) is None, text
    for text in ("2c", "x y", "X", "\\sqrt[3]{8}", "\\frac{1}{1+\\sqrt{2}}", "\\frac{1}{0}", "0^0"):
        assert exact_value(text) is None, text


def _exact(text: str) -> ExactValue:
    value = exact_value(text)
    assert value is not None, text
    return value


def test_exact_forms_are_canonical():
    same = [
        ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", "\\sqrt{3}/3", "3^{-1}\\sqrt{3}"),
        ("\\sqrt{12}", "2\\sqrt{3}", "\\sqrt{3}\\cdot 2", "\\sqrt{2}\\sqrt{6}"),
        ("(x+1)^2", "x^2+2x+1", "1+x\\cdot(x+1)+x", "(1+x)\\cdot(x+1)"),
        ("\\frac{1}{2x}", "1/2x", "\\frac12 x^{-1}", "(2x)^{-1}"),
        ("2\\pi r", "r\\pi\\cdot 2", "\\pi r+\\pi r", "2r\\times\\pi"),
    ]
    for spellings in same:
        assert len({_exact(s).form for s in spellings}) == 1, spellings
    assert _exact("2^{10}").rational == 1024
    assert _exact("\\sqrt{\\frac{9}{4}}").rational == Fraction(3, 2)
    assert _exact("\\sqrt{2}").rational is None
    assert _exact("0.5x").inexact and not _exact("\\frac{x}{2}").inexact
    assert _exact("x-x").form == () and _exact("x-x").rational == 0


def test_exact_reader_bounds_its_work():
    # Refused, not computed: each would build a huge number or polynomial in the caller.
    for text in ("9^{9^{9^{9}}}", "2^{100000}", "(1+x)^{5}", "\\sqrt{123456789012}", "1+" * 150):
        assert exact_value(text) is None, text[:20]
    assert exact_value("(1+x+y+a+b+k+n+p+q+r+u+v+w+z+j+f)^{2}(1+x)^{2}") is None  # > 256 products


def test_cached_verdicts_are_served_without_a_worker_and_a_closed_verifier_refuses_all():
    pair = ("6+9i", "9i+6")  # only sympy decides it
    verifier = MathVerifier(workers=1, cache_size=1)
    try:
        first = verifier.verify(*pair)
        # The very object the worker's answer was wrapped in: a new round trip would build a
        # new one.
        assert verifier.verify(*pair) is first and verifier.verify_batch([pair])[0] is first
        verifier.verify("1+i", "i+1")  # evicts it (one entry)
        again = verifier.verify(*pair)
        assert again == first and again is not first
    finally:
        verifier.close()
    # Closed, it refuses even what the fast path or the cache could answer without a worker.
    for gold, pred in (("1", "1"), ("1+i", "i+1")):
        with pytest.raises(RuntimeError, match="closed"):
            verifier.verify(gold, pred)
        with pytest.raises(RuntimeError, match="closed"):
            verifier.verify_batch([(gold, pred)])
