"""Oracle checks for environments: what `tirl envs check` runs, on the library or on your own.

For each environment, on inputs from its own sampler at every difficulty level:
- the sampler's inputs are valid and the same seed gives the same input;
- the mapper runs and returns a valid value of the output type;
- the verifier accepts the rendered gold output;
- it rejects wrong answers: near misses of the gold value (off by one, reordered, an element
  dropped or added; skipped for environments with their own equality, where a near miss may be
  right), and the rendering truncated, stuffed with a second candidate, wrapped in prose, of
  another type, or empty;
- the code rendering, run on its own, gives the mapper's output.

Every fault is a line naming the environment and what is wrong with it, so a malformed
definition (a mapper that raises, a verifier that rejects its own gold) is refused with a reason.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tirl.envs.core import Environment, Environments
from tirl.envs.seeding import item_rng

SCALAR_KINDS = {"int", "bool", "rational", "str", "date"}


def _wrong_type_text(kind: str) -> str:
    return "[7]" if kind in SCALAR_KINDS else "7"


def sample_inputs(env: Environment, n: int, salt: str = "check") -> list[Any]:
    """n inputs from the environment's sampler, cycling through its difficulty levels."""
    return [
        env.sample(item_rng(env.name, salt, "train", 0, i), 1 + i % env.levels) for i in range(n)
    ]


def _answer_faults(env: Environment, x: Any, gold: Any, rng: random.Random) -> list[str]:
    faults = []
    text = env.output.render(gold)
    ok, why = env.verify(text, gold)
    if not ok:
        return [f"{env.name}: the verifier rejects its own gold answer {text} ({why})"]
    wrong = [env.output.render(v) for v in env.output.near_misses(gold, rng)]
    if env.equal is None:
        for w in wrong:
            if env.verify(w, gold)[0]:
                faults.append(
                    f"{env.name}: the verifier accepts the wrong answer {w} (gold {text})"
                )
    probes = {
        "stuffed with a second candidate": text + " or " + (wrong[0] if wrong else "0"),
        "wrapped in prose": "The answer is " + text,
        "of another type": _wrong_type_text(env.output.name),
        "empty": "",
    }
    if len(text) > 1:
        probes["truncated"] = text[:-1]
    for what, probe in probes.items():
        if env.verify(probe, gold)[0]:
            faults.append(f"{env.name}: the verifier accepts an answer {what}: {probe!r}")
    return faults


def _code_runner(source: str) -> Callable[[Any], Any]:
    """`core.run_source(source, x)` with the source compiled once: each call still executes it
    in a fresh namespace (compiling was most of the check's time). A source that does not
    compile raises its error on every call, as `run_source` would."""
    try:
        code = compile(source, "<environment code>", "exec")
    except Exception as e:  # noqa: BLE001 - reported per input, as run_source would
        error = e

        def fail(x: Any) -> Any:
            raise error

        return fail

    def run(x: Any) -> Any:
        namespace: dict[str, Any] = {}
        exec(code, namespace)  # noqa: S102 - the environment's own code, as run_source
        return namespace["f"](x)

    return run


def check_environment(env: Environment, n: int = 30) -> list[str]:
    """All faults found in `env` (an empty list means it passed)."""
    try:
        inputs = sample_inputs(env, n)
        again = sample_inputs(env, n)
    except Exception as e:
        return [f"{env.name}: the sampler raised {type(e).__name__}: {e}"]
    if inputs != again:
        return [f"{env.name}: the sampler gives different inputs for the same seed"]
    try:
        source = env.code
    except (OSError, TypeError, StopIteration) as e:
        return [f"{env.name}: its mapper has no readable source ({e})"]
    run_code = _code_runner(source)
    rng = random.Random(0)
    faults: list[str] = []
    for x in inputs:
        reason = env.input.check(x)
        if reason is not None:
            faults.append(f"{env.name}: the sampler produced an invalid input {x!r} ({reason})")
            continue
        try:
            gold = env.mapper(x)
        except Exception as e:
            faults.append(f"{env.name}: the mapper raised {type(e).__name__}: {e} on {x!r}")
            continue
        reason = env.output.check(gold)
        if reason is not None:
            faults.append(
                f"{env.name}: the mapper returned an invalid {env.output.name} {gold!r} ({reason})"
            )
            continue
        faults += _answer_faults(env, x, gold, rng)
        try:
            reproduced = run_code(x)
        except Exception as e:
            faults.append(f"{env.name}: its code rendering raised {type(e).__name__}: {e}")
        else:
            if reproduced != gold:
                faults.append(f"{env.name}: its code rendering gives {reproduced!r}, not {gold!r}")
        if len(faults) >= 5:
            break
    return faults


def check_registry(registry: Environments, n: int = 30) -> dict[str, list[str]]:
    """Faults by environment name, for the environments that have any."""
    found = {}
    for env in sorted(registry, key=lambda e: e.name):
        faults = check_environment(env, n)
        if faults:
            found[env.name] = faults
    return found
