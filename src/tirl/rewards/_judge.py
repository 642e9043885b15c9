"""The judge behind `tirl.rewards.verify`: math-verify plus the guards against its false
positives, and a fast path ahead of it. It runs inside the verifier's worker processes (sympy
and math-verify are imported there only); `quick_verdict`, the part that needs no sympy, also
runs in the caller's process; `judge` is callable directly, with no timeout, for debugging.

Each guard names the case that motivated it; guards only ever turn a "yes" into a "no" (or refuse
before calling math-verify), so they cannot add false positives of their own. Three narrow string
steps come before math-verify and can say "yes" where it would not, each checked against the
labelled cases (0 false positives): a text holding exactly one `\\boxed{}` is judged by that box;
answers identical up to whitespace LaTeX ignores and spellings latex2sympy reads alike
(`\\dfrac`, `\\left(`) are equal; and a decimal comma (`1000,99`) is read as a decimal point where
the gold is a plain decimal.

The fast path (`tirl.rewards._fast`, with `tirl.rewards._exact`) then decides most answers without
sympy: plain numbers and small expressions compared by exact value, numbers against tuples and
intervals, tuples element by element. It only answers where math-verify plus the guards ("slow"
mode) would give the same verdict and reason, and leaves the rest to them; tests/test_verify_fast.py
compares the two on every labelled case.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from tirl.rewards._fast import fast_verdict, same_meaning
from tirl.rewards._notation import from_code_notation

_MAX_PRED_CHARS = 1000  # longer predictions are refused: no real answer is this long
_MAX_DIGITS = 100_000  # an exact value needing more digits than this is refused (`_digits`)
_MAX_NESTING = 30  # deeper brackets are refused: latex2sympy took seconds on 300 nested `(`


_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# `\mathrm{e}` is Euler's number, but latex2sympy cannot parse it: the whole answer failed to
# parse and math-verify's fallback compared truncated strings, so `1-\frac{1}{\mathrm{e}}` was
# "equal" to `1+\frac{1}{\mathrm{e}}` (Math-Verify test_yujianll.py, fixed upstream after 0.9).
_ROMAN_E = re.compile(r"\\(?:mathrm|operatorname|mathit|rm|text)\s*(?:\{\s*e\s*\}|\s+e\b)")
# A whole answer in Python's float notation (`1e-10`, `2.5E+3`) is scientific notation; LaTeX
# parsing read `1e-10` as `1*e - 10` (Euler's e), so `1e-10` vs `2e-10` compared e-10 with 2e-10.
# Ambiguous only for answers like `2e-1` meant as 2e - 1; those are written with spaces or `\,`.
# (`\d+(?:\.\d*)?`, not `\d+\.?\d*`: the latter backtracks quadratically on a long digit run.)
_SCIENTIFIC = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))[eE]([+-]?\d+)")
_SPACED_THOUSANDS = re.compile(r"-?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_TEXT_ONLY = re.compile(
    r"\\(?:text|textbf|textrm|mbox|mathrm)\s*\{([^{}\\\d]*[A-Za-z][^{}\\\d]*)\}"
)
_PERCENT_SIGN = re.compile(r"\s*\\?%\s*$")
_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textrm|textit|mbox|mathrm|operatorname)\s*\{([^{}]*)\}")

# Units whose mismatch makes an answer wrong (`5\text{ cm}` vs `5\text{ m}`). math-verify drops
# units before comparing, which is right for `5\text{ cm}` vs `5` but made cm equal to m.
_UNITS = {
    "mm": "millimeter", "cm": "centimeter", "m": "meter", "km": "kilometer",
    "in": "inch", "inch": "inch", "inche": "inch", "ft": "foot", "foot": "foot", "feet": "foot",
    "yd": "yard", "yard": "yard", "mi": "mile", "mile": "mile",
    "millimeter": "millimeter", "centimeter": "centimeter", "meter": "meter",
    "kilometer": "kilometer", "millimetre": "millimeter", "centimetre": "centimeter",
    "metre": "meter", "kilometre": "kilometer",
    "s": "second", "sec": "second", "second": "second", "min": "minute", "minute": "minute",
    "h": "hour", "hr": "hour", "hour": "hour", "day": "day", "week": "week", "year": "year",
    "mg": "milligram", "g": "gram", "kg": "kilogram", "gram": "gram", "kilogram": "kilogram",
    "lb": "pound", "pound": "pound", "ounce": "ounce", "oz": "ounce",
    "cent": "cent", "dollar": "dollar", "degree": "degree", "radian": "radian",
    "liter": "liter", "litre": "liter", "ml": "milliliter", "gallon": "gallon",
    "mph": "mph", "kph": "kph",
}  # fmt: skip
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]+")
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A decimal comma (`1000,99` for 1000.99), read as one only where the gold is a plain decimal and
# the digits after the comma are not a thousands group (`1,000` is a thousand).
_PLAIN_DECIMAL = re.compile(r"-?\d+\.\d+")
_DECIMAL_COMMA = re.compile(r"(-?\d+),(\d{1,2}|\d{4,})")


def _box_spans(s: str) -> list[tuple[int, int] | None]:
    """(start, end) of each `\\boxed{}`'s content in `s`, in order; None for one left open."""
    spans: list[tuple[int, int] | None] = []
    pos = 0
    while (m := _BOX_OPEN.search(s, pos)) is not None:
        depth, i = 1, m.end()
        while i < len(s) and depth:
            if s[i] == "\\":
                i += 1
            elif s[i] == "{":
                depth += 1
            elif s[i] == "}":
                depth -= 1
            i += 1
        spans.append(None if depth else (m.end(), i - 1))
        pos = i
    return spans


def _sole_box(s: str) -> str | None:
    """The content of the one `\\boxed{}` in `s`, or None if `s` has none, several, or an open one.

    A whole solution passed as the answer is judged by its box, and tirl's own guards (length,
    units) look at the box, not at the prose: Math-Verify's cases had `\\boxed{90^\\circ}` at
    the end of a text mentioning "the second line", which the units guard read as seconds.
    Several boxes are left to math-verify (it reads them as one set of answers).
    """
    spans = _box_spans(s)
    if len(spans) != 1 or spans[0] is None:
        return None
    start, end = spans[0]
    return s[start:end]


def _prepare(s: str) -> str:
    """String clean-ups math-verify lacks; each one fixes a case in the labelled test set."""
    s = s.strip()
    changed = True
    while changed:
        changed = False
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s, changed = s[len(left) : -len(right)].strip(), True
    s = s.replace("\u2212", "-")  # Unicode minus
    s = _ROMAN_E.sub("e", s)
    if s.endswith(".") and not s.endswith(".."):  # `\boxed{5.}`: the sentence's full stop
        s = s[:-1].rstrip()
    if _SPACED_THOUSANDS.fullmatch(s):  # `1 234`: LaTeX would multiply 1 by 234
        s = s.replace(" ", "")
    if m := _SCIENTIFIC.fullmatch(s):
        s = f"{m[1]}\\times 10^{{{int(m[2])}}}"
    return from_code_notation(s)  # `x**2`, `Rational(1, 3)`, `0.(3)`: what code prints


def _canon_text(s: str) -> str:
    s = _TEXT_GROUP.sub(lambda m: f" {m[1]} ", s).replace("$", " ").lower()
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", s).split())


def _is_text_answer(gold: str) -> bool:
    """A gold like `\\text{Evelyn}` or `\\text{(C)}`: a word, not a formula.

    math-verify turned an unboxed prediction `Monday` into the product of symbols d*a*m*n*o*y and
    matched it to gold `\\text{Monday}` by sorting the letters, so anagrams could match.
    """
    m = _TEXT_ONLY.fullmatch(gold)
    return m is not None


def _units(s: str) -> set[str]:
    found = set()
    for m in _TEXT_GROUP.finditer(s):
        for word in _WORD.findall(m[1]):
            w = word.lower()
            unit = _UNITS.get(w) or (_UNITS.get(w[:-1]) if w.endswith("s") else None)
            if unit:
                found.add(unit)
    rest = _TEXT_GROUP.sub(" ", s)
    for word in _WORD.findall(rest):  # bare words: only long ones, `m` may be a variable
        w = word.lower()
        if len(w) >= 2:
            unit = _UNITS.get(w) or (_UNITS.get(w[:-1]) if w.endswith("s") else None)
            if unit and w not in {"in", "mi"}:
                found.add(unit)
    if "\\circ" in s:
        found.add("degree")
    return found


def _bracket(s: str) -> str:
    t = s.replace("\\left", "").replace("\\right", "").replace(" ", "")
    if t.startswith(("\\{", "\\lbrace")):
        return "set"
    if t.startswith("(") and t.endswith(")"):
        return "tuple"
    return "other"


def _digits(e: Any, depth: int = 0) -> float:
    """Rough upper bound on log10 of the largest integer an exact evaluation of `e` builds.

    A power b^x needs |x| * log10|b| digits, a factorial n! about n * log10(n). math-verify ran
    `(10^7)!` and `9^{9^{9^9}}` for as long as its timeout allowed (and without a timeout,
    Qwen's grader hung for over a minute on `(10^7)!`); such values are refused up front.
    """
    from sympy import Float, Mul, Pow, Rational, factorial, factorial2, subfactorial

    if depth > 100:
        return math.inf
    if isinstance(e, Rational):
        return math.log10(max(abs(e.p), e.q, 1))
    if isinstance(e, Float):
        return 0.0
    args = getattr(e, "args", ())
    if isinstance(e, (Pow, factorial, factorial2, subfactorial)):
        n = args[1] if isinstance(e, Pow) else args[0]
        n_digits = _digits(n, depth + 1)
        if n_digits > 15:
            return math.inf
        value = abs(float(n)) if isinstance(n, Rational) else 10**n_digits
        if isinstance(e, Pow):
            return value * max(_digits(args[0], depth + 1), math.log10(2))
        return value * max(math.log10(max(value, 1.0)), 1.0)
    if not args:
        return 0.0
    parts = [_digits(a, depth + 1) for a in args]
    return sum(parts) if isinstance(e, Mul) else max(parts)


def _evaluate_if_large(e: Any) -> Any:
    """Evaluate a number with more than 1000 digits before math-verify sees it.

    math-verify's `simplify(a - b)` ran for minutes on `2^{2^{16}}` vs `2^{65536}` (unevaluated
    powers); as exact integers they compare at once. `_digits` has already bounded the size.
    """
    if getattr(e, "is_number", False) and not _pct_values(e)[1:] and _digits(e) > 1000:
        try:
            return e.doit()
        except Exception:  # noqa: BLE001 - leave it to math-verify
            return e
    return e


def _nesting(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth -= 1
    return deepest


def _pct_values(e: Any) -> list[Any]:
    """`50\\%` is both 1/2 and, read as a unit, 50 (math-verify 0.9 accepts 50 for gold 50%)."""
    from sympy import Mul, Rational, UnevaluatedExpr

    if isinstance(e, Mul) and len(e.args) == 2 and e.args[1] == UnevaluatedExpr(Rational(1, 100)):
        return [e.doit(), e.args[0]]
    return [e]


def _scalar_mismatch(g: Any, p: Any) -> str | None:
    best: str | None = "guard: numbers differ"
    for gv in _pct_values(g):
        for pv in _pct_values(p):
            reason = _scalar_pair_mismatch(gv, pv)
            if reason is None:
                return None
            best = reason
    return best


def _scalar_pair_mismatch(g: Any, p: Any) -> str | None:
    from sympy import Abs, Float, Integer

    # doit() first: `\sin(10^{100}\pi)` is exactly 0, but evalf at 30 digits got it wrong.
    a, b = g.doit().evalf(30), p.doit().evalf(30)
    if not (a.is_number and b.is_number and a.is_finite and b.is_finite):
        return None  # no opinion: math-verify decides
    try:
        # In sympy precision: as Python floats, 1/2004! and 1/2006! both underflow to 0.0.
        diff, size = Abs(a - b).evalf(30), max(Abs(a).evalf(30), Abs(b).evalf(30))
        if diff == 0 or size == 0:
            return None
        relative, absolute = float(diff / size), float(diff)
    except (TypeError, ValueError):
        return None
    inexact = g.has(Float) or p.has(Float)
    # An exact integer is not matched by a decimal that rounds to it: `10^{20}+1` vs `1.0\times
    # 10^{20}` has relative error 1e-20, but the +1 is the answer.
    exact_int = isinstance(g.doit(), Integer) or isinstance(p.doit(), Integer)
    if inexact and exact_int and absolute > 1e-6:
        return "guard: an exact integer is not matched by a rounded decimal"
    # math-verify compares floats rounded to 6 decimals and exact values with `evalf(chop=True)`,
    # so `.0000672` = `.0000671`, `1/2^99` = `1/2^98` (Math-Verify #14) and `1/2004!` =
    # `1/2006!`. Numbers must also agree relatively: to 1e-4 when one side is a written
    # decimal (so 0.333333 still matches 1/3), to 1e-12 when both are exact.
    if relative > (1e-4 if inexact else 1e-12):
        return f"guard: numbers differ (relative difference {relative:.2g})"
    return None


def _numeric_mismatch(g: Any, p: Any, depth: int = 0) -> str | None:
    """Walk matching containers of both sides and apply `_scalar_mismatch` to numbers."""
    from sympy import Eq, FiniteSet, Interval, MatrixBase, Tuple

    if depth > 20:
        return None
    pairs: list[tuple[Any, Any]] = []
    if isinstance(g, MatrixBase) and isinstance(p, MatrixBase):
        if g.shape == p.shape:
            pairs = list(zip(g, p))
    elif isinstance(g, Tuple) and isinstance(p, Tuple) and len(g) == len(p):
        pairs = list(zip(g.args, p.args))
    elif isinstance(g, Interval) and isinstance(p, Interval):
        pairs = [(g.start, p.start), (g.end, p.end)]
    elif isinstance(g, FiniteSet) and isinstance(p, FiniteSet) and len(g) == len(p):
        # Unordered: pair the elements by value (`x=1` counts as 1, as math-verify does).
        def key(x: Any) -> tuple[float, float]:
            re_part, im_part = (x.rhs if isinstance(x, Eq) else x).evalf().as_real_imag()
            return float(re_part), float(im_part)

        try:
            pairs = list(zip(sorted(g.args, key=key), sorted(p.args, key=key)))
        except (TypeError, ValueError, AttributeError):
            return None
    elif isinstance(g, Eq) and isinstance(p, Eq):
        pairs = [(g.rhs, p.rhs)] if g.lhs == p.lhs else []
    elif isinstance(g, Eq) or isinstance(p, Eq):  # `x=5` vs `5`: the assigned value
        g, p = (x.rhs if isinstance(x, Eq) and x.lhs.is_Symbol else x for x in (g, p))
        pairs = [] if isinstance(g, Eq) or isinstance(p, Eq) else [(g, p)]
    elif getattr(g, "is_number", False) and getattr(p, "is_number", False):
        return _scalar_mismatch(g, p)
    for a, b in pairs:
        if reason := _numeric_mismatch(a, b, depth + 1):
            return reason
    return None


def _guards(gold: str, pred: str, g: Any, p: Any) -> str | None:
    """Reasons to overrule math-verify's "equal" for this pair, or None."""
    if (gb := _bracket(gold)) != (pb := _bracket(pred)) and {gb, pb} == {"set", "tuple"}:
        # `(1,2)` (a point or an interval) matched `\{1,2\}` (a set) in math-verify.
        return "guard: a set is not an ordered tuple or interval"
    gu, pu = _units(gold), _units(pred)
    if gu and pu and gu != pu:
        return f"guard: units differ ({', '.join(sorted(gu))} vs {', '.join(sorted(pu))})"
    if (gv := _in_base(gold)) is not None and (pv := _in_base(pred)) is not None and gv != pv:
        # math-verify drops the subscript: `204_5` matched `204_7` (found by bench/verify.py).
        return "guard: numbers in a base differ"
    return _numeric_mismatch(g, p)


_IN_BASE = re.compile(r"([0-9A-Za-z]+)_\{?(\d+)\}?")


def _in_base(s: str) -> int | None:
    """The value of a number written in a base (`204_5`, `4210_{5}`), or None."""
    if (m := _IN_BASE.fullmatch(s.replace(" ", ""))) is None or not 2 <= int(m[2]) <= 36:
        return None
    try:
        return int(m[1], int(m[2]))
    except ValueError:  # a digit the base does not have
        return None


_PARSE_CONFIG: list[Any] = []


def _parse(s: str) -> list[Any]:
    from math_verify import parse

    if not _PARSE_CONFIG:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig

        # Boxed first (the prediction is wrapped in a box). The default normalization stays on,
        # "malformed operators" included: without it `\frac34` and `3+2\sqrt2` did not parse.
        _PARSE_CONFIG.extend(
            [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
        )
    # no_fallback: an unparsable answer is not replaced by a truncated string of itself.
    return parse(
        "\\boxed{" + s + "}",
        extraction_config=_PARSE_CONFIG,
        fallback_mode="no_fallback",
        parsing_timeout=None,  # type: ignore[arg-type]  # the pool enforces the timeout
    )


Mode = Literal["guarded", "slow", "bare", "boxed"]
MODES: tuple[str, ...] = ("guarded", "slow", "bare", "boxed")


def judge(gold: str, prediction: str, mode: Mode = "guarded") -> tuple[bool, str]:
    """Decide one pair in this process, with no timeout. Runs in workers; public for debugging.

    Modes: "guarded" is tirl's pipeline: the string steps, the fast path (`quick_verdict`), then
    math-verify with the guards. "slow" is the same without the fast path, every pair not
    settled by the string steps going through sympy: the reference the fast path is tested
    against. The two baselines the tests and the benchmark compare it with are "bare",
    `verify(parse(gold), parse(prediction))`, and "boxed", the same with each answer wrapped in
    `\\boxed{}` first (as verl does with golds); both use math-verify's defaults with its SIGALRM
    timeouts off (the pool's timeout applies).
    """
    if mode in ("bare", "boxed"):
        from math_verify import parse, verify

        wrap = "\\boxed{{{}}}" if mode == "boxed" else "{}"
        g_mv = parse(wrap.format(gold), parsing_timeout=None)  # type: ignore[arg-type]
        p_mv = parse(wrap.format(prediction), parsing_timeout=None)  # type: ignore[arg-type]
        ok = verify(g_mv, p_mv, timeout_seconds=None)
        return ok, "equivalent" if ok else "not equivalent"
    gold, pred, verdict = _string_steps(gold, prediction)
    if verdict is None and mode == "guarded":
        verdict = fast_verdict(gold, pred)
    return verdict if verdict is not None else _sympy_verdict(gold, pred)


def quick_verdict(gold: str, prediction: str) -> tuple[bool, str] | None:
    """The "guarded" verdict of `judge` where it needs no sympy, else None.

    String work and integer arithmetic only, on answers of at most `QUICK_MAX_CHARS` characters
    (longer ones give None), so the verifier runs it in the caller's process, ahead of the
    worker pool, without a timeout. Where it answers, its answer is the one the "slow" mode
    gives (tests/test_verify_fast.py checks every labelled case both ways).
    """
    if len(gold) > QUICK_MAX_CHARS or len(prediction) > QUICK_MAX_CHARS:
        return None
    gold, pred, verdict = _string_steps(gold, prediction)
    return verdict if verdict is not None else fast_verdict(gold, pred)


# The string steps are linear but for a few regular expressions that may backtrack
# quadratically on adversarial input; at this size they take well under a millisecond.
QUICK_MAX_CHARS = 1000


def _string_steps(gold: str, prediction: str) -> tuple[str, str, tuple[bool, str] | None]:
    """The steps before math-verify: both answers cleaned up, and a verdict where one is certain.

    All string work, shared by the "guarded" and "slow" modes (they are older than the fast
    path and define the reference it is tested against).
    """
    if None in _box_spans(prediction):  # `\\boxed{2`: math-verify took the 2
        return gold, prediction, (False, "guard: an unclosed \\boxed{} is not an answer")
    gold, pred = (
        _prepare(box if (box := _sole_box(s)) is not None else s) for s in (gold, prediction)
    )
    if not pred:
        return gold, pred, (False, "no answer")
    # Identical answers are equal, whatever sympy makes of them: `12:00` and `\\frac{1}{0}` both
    # parse to complex infinity, which math-verify does not count as equal to itself. Identical
    # means up to whitespace and spellings latex2sympy reads alike (`\\dfrac`, `\\left(`).
    if same_meaning(gold) == same_meaning(pred):
        return gold, pred, (True, "equivalent")
    if _PLAIN_DECIMAL.fullmatch(gold) and (m := _DECIMAL_COMMA.fullmatch(pred)):
        pred = f"{m[1]}.{m[2]}"
    if len(pred) > _MAX_PRED_CHARS:
        return gold, pred, (False, f"guard: prediction longer than {_MAX_PRED_CHARS} characters")
    if _nesting(pred) > _MAX_NESTING:
        return gold, pred, (False, f"guard: prediction nested more than {_MAX_NESTING} levels deep")
    if _is_text_answer(gold):
        ok = _canon_text(gold) == _canon_text(pred)
        return gold, pred, (ok, "equivalent" if ok else "not equivalent")
    return gold, pred, None


def _sympy_verdict(gold: str, pred: str) -> tuple[bool, str]:
    """math-verify on the prepared answers, with tirl's guards on every "equal" it says."""
    from math_verify import verify

    golds = list(_parse(gold))
    if (bare := _PERCENT_SIGN.sub("", gold)) != gold:
        # A gold `12.5\%` also accepts `12.5`: the percent sign read as a unit, as math-verify
        # 0.9 already does for integers (`50\%` vs `50`). Only on the gold side: gold 0.5
        # does not accept `0.5\%`.
        golds += _parse(bare)
    if not golds:
        same = _canon_text(gold) == _canon_text(pred) and _canon_text(gold) != ""
        return (True, "identical text") if same else (False, "could not parse gold answer")
    preds = _parse(pred)
    if not preds:
        return False, "could not parse prediction"
    reason = "not equivalent"
    for g in golds:
        for p in preds:
            try:
                too_large = max(_digits(g), _digits(p)) > _MAX_DIGITS
            except RecursionError:
                too_large = True
            if too_large:
                if g == p:  # the same unevaluated tree: equal without evaluating it
                    return True, "equivalent"
                reason = "guard: number too large to evaluate exactly"
                continue
            g_eval, p_eval = _evaluate_if_large(g), _evaluate_if_large(p)
            # allow_set_relation_comp: an interval gold also accepts the same set written as an
            # inequality (`[1,2]` vs `1\le x\le 2`); math-verify allows only the reverse.
            if not verify(g_eval, p_eval, timeout_seconds=None, allow_set_relation_comp=True):
                continue
            rejection = _guards(gold, pred, g_eval, p_eval)
            if rejection is None:
                return True, "equivalent"
            reason = rejection
    return False, reason
