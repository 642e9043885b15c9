"""Teacher-free solutions of RACES composites, written from the mappers' own source.

Every atomic environment's mapper is a self-contained Python function (`Environment.code`), so a
tool-use solution of a composite needs no teacher: bind the input as a Python literal, then run
each step's mapper on it in code. Two operators have such a solution:

- SEQUENTIAL: the first block binds x_0 (`y0 = …`); block i holds e_i's mapper renamed
  `step_i` and applies it to y_{i-1}, so each block continues from the one before it (the blocks
  run in one stateful interpreter session).
- PARALLEL: each branch has its own input, so block i binds y_{i-1} itself (`x_i = …`) and
  applies e_i's mapper, renamed `branch_i`, to it.

Each block prints the `repr` of its result; `literal` reads such a printed value back with only
the names `PRELUDE` defines (no builtins), which is how callers check that the code computed what
the mapper computed in-process. SORT and SELECT ask for an order of operations, not values:
there is no code that finds it other than a search, so they get no code steps here.

A solution is a list of (kind, text) pairs, kind "text" or "code"; the callers turn them into
their own types (`tirl.synth.records.Step`, `tirl.tasks.base.Think`/`Code`). A composite whose
solution cannot be written returns the reason instead: a value with no Python literal form, or a
mapper whose source cannot be read. This module only writes code; running it is the caller's
business (the synth pipeline runs it in the sandbox and rejects a composite whose printed
values differ from the mapper's).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from tirl.envs.core import Chain, Environment, Registry
from tirl.envs.operators import OperatorTask

PRELUDE = "import datetime\nfrom fractions import Fraction\n"
_LITERAL_NAMES = {"Fraction": Fraction, "datetime": datetime, "frozenset": frozenset, "set": set}

DemoStep = tuple[str, str]  # ("text" | "code", its text)


def literal(text: str) -> Any:
    """A printed value read back with only the names the prelude defines (no builtins)."""
    return eval(text, {"__builtins__": {}, **_LITERAL_NAMES})  # noqa: S307 - our own repr


def round_trips(value: Any) -> bool:
    """Whether `repr(value)` reads back as an equal value (so code can bind it)."""
    try:
        return literal(repr(value)) == value
    except Exception:
        return False


def _renamed(source: str, name: str) -> str:
    head, _, body = source.partition("\n")
    return f"{head.replace('def f(', f'def {name}(', 1)}\n{body.rstrip()}"


def step_code(source: str, i: int) -> str:
    """The mapper source (a function `f`) as step i, applied to the previous value."""
    return f"{_renamed(source, f'step_{i}')}\n\ny{i} = step_{i}(y{i - 1})\nprint(repr(y{i}))"


def branch_code(source: str, i: int, value: Any) -> str:
    """The mapper source (a function `f`) as branch i, applied to its own input `value`."""
    return (
        f"{_renamed(source, f'branch_{i}')}\n\n"
        f"x{i} = {value!r}\ny{i} = branch_{i}(x{i})\nprint(repr(y{i}))"
    )


def _source(env: Environment) -> str | None:
    try:
        return env.code
    except (OSError, TypeError, StopIteration):
        return None


def sequential_steps(traj: Chain, answer: str) -> list[DemoStep] | str:
    """The SEQUENTIAL solution of `traj` ending in `answer` (the task's reference answer block),
    or the reason it cannot be written."""
    if not round_trips(traj.x0):
        return "input has no Python literal form"
    steps = [("text", "I bind the input to a variable, then apply each step in code.")]
    steps.append(("code", f"{PRELUDE}y0 = {traj.x0!r}\nprint(repr(y0))"))
    for i, env in enumerate(traj.envs, 1):
        source = _source(env)
        if source is None:
            return "mapper source unavailable"
        steps.append(("text", f"Step {i}: {env.instruction}"))
        steps.append(("code", step_code(source, i)))
    steps.append(("text", "Every step ran; the results, in the requested form:\n" + answer))
    return steps


def parallel_steps(traj: Chain, answer: str) -> list[DemoStep] | str:
    """The PARALLEL solution of `traj` (branch i is e_i on y_{i-1}) ending in `answer`, or the
    reason it cannot be written."""
    inputs = [traj.x0, *traj.ys[:-1]]
    if not all(round_trips(x) for x in inputs):
        return "a branch input has no Python literal form"
    steps = [("text", "Each branch has its own input; I run each one's operation in code.")]
    for i, (env, x) in enumerate(zip(traj.envs, inputs), 1):
        source = _source(env)
        if source is None:
            return "mapper source unavailable"
        steps.append(("text", f"Branch {i}: {env.instruction}"))
        steps.append(("code", (PRELUDE if i == 1 else "") + branch_code(source, i, x)))
    steps.append(("text", "Every branch ran; the results, in the requested form:\n" + answer))
    return steps


def chain_of(task: OperatorTask, registry: Registry) -> Chain | str:
    """The composite behind a stored task: x_0 read back from its rendered form and each step's
    mapper run on it, or the reason it cannot be rebuilt (an unknown environment, a state that
    does not parse, or a recomputed state that differs from the stored one)."""
    try:
        envs = tuple(registry.get(name) for name in task.envs)
        x0 = envs[0].input.parse(task.xs[0])
        ys: list[Any] = []
        for env, stored in zip(envs, task.xs[1:]):
            ys.append(env.apply(ys[-1] if ys else x0))
            if not env.output.equal(ys[-1], env.output.parse(stored)):
                return f"{env.name} does not reproduce the stored state {stored!r}"
    except Exception as e:  # noqa: BLE001 - any failure to rebuild is a reason, not a crash
        return f"cannot rebuild the composite: {type(e).__name__}: {e}"
    return Chain(x0, envs, tuple(ys))


def operator_steps(task: OperatorTask, registry: Registry) -> list[DemoStep] | str:
    """The code solution of a stored SEQUENTIAL or PARALLEL task, or why there is none."""
    writers = {"sequential": sequential_steps, "parallel": parallel_steps}
    if task.operator not in writers:
        return f"{task.operator} has no code solution (it asks for an order, not values)"
    traj = chain_of(task, registry)
    if isinstance(traj, str):
        return traj
    return writers[task.operator](traj, task.answer)


def code_blocks(steps: Sequence[DemoStep]) -> list[str]:
    return [text for kind, text in steps if kind == "code"]
