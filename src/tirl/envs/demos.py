"""Teacher-free solutions of RACES composites, written from the mappers' own source.

Every atomic environment's mapper is a self-contained Python function (`Environment.code`), so a
tool-use solution of a composite needs no teacher: bind the input as a Python literal, then run
each step's mapper on it in code. Each operator has such a solution:

- SEQUENTIAL: the first block binds x_0 (`y0 = …`, written as the prompt writes it where Python
  reads that text as the same input, e.g. a JSON list of integers; `binding`); block i holds
  e_i's mapper renamed `step_i` and applies it to y_{i-1}, so each block continues from the one
  before it (the blocks run in one stateful interpreter session).
- PARALLEL: each branch has its own input, so block i binds y_{i-1} itself (`x_i = …`) and
  applies e_i's mapper, renamed `branch_i`, to it.
- SORT and SELECT ask for an order of operations, not values, and code finds one by search: one
  block defines each lettered operation from its mapper (`op_A`, `op_B`, …), then tries the
  orders (SORT: every order of all of them; SELECT: orders of 1, 2, … of them) on the start and
  prints the first whose result renders as the target; the answer copies that line. The order
  found may differ from the task's reference (R_Sort and R_Sel pay any order that reaches the
  target), so it is computed here in-process as the code computes it, and kept only if it
  scores 1 (the scorer also refuses a value outside an environment's input domain, which a bare
  mapper takes). The search is written only when every candidate maps the start's type to
  itself, so every order runs on values of the type its mappers take: a mapper handed a value
  of another type could run for any time or memory, in the demonstration's sandbox and here.
  The `races` source writes it only with its `search_orders` setting (off by default).

Each SEQUENTIAL/PARALLEL block prints its result exactly as the answer must write it (the type's
`render_expr`, `tirl.envs.types`), so the final answer copies the interpreter's lines instead
of converting `(7, 7)` to `[7, 7]` or `True` to `true`; callers check that the code computed
what the mapper computed in-process by parsing each printed line with its type
(`printed_types`).

A solution is a list of (kind, text) pairs, kind "text" or "code"; the callers turn them into
their own types (`tirl.synth.records.Step`, `tirl.tasks.base.Think`/`Code`). A composite whose
solution cannot be written returns the reason instead: a value with no Python literal form, a
mapper whose source cannot be read, or a SORT/SELECT task outside the search's reach (above).
Apart from the search's in-process run, this module only writes code; running it is the
caller's business (the synth pipeline runs it in the sandbox and rejects a composite whose
printed values differ from the mapper's).
"""

from __future__ import annotations

import datetime
import itertools
import re
import string
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from tirl.envs.core import Chain, Environment, Environments
from tirl.envs.operators import REWARDS, OperatorTask
from tirl.envs.types import Type

PRELUDE = "import datetime\nimport json\nfrom fractions import Fraction\n"  # every name used
_IMPORTS = {
    "datetime.": "import datetime",
    "json.": "import json",
    "Fraction(": "from fractions import Fraction",
}
_LITERAL_NAMES = {"Fraction": Fraction, "datetime": datetime, "frozenset": frozenset, "set": set}

_VALUE = re.compile(r"\bv\b")  # the value's name in a `render_expr`
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


def binding(value: Any, kind: Type, envs: Sequence[Environment]) -> str:
    """Python text for `value`: the prompt's own rendering of it when Python reads that text as
    a value the steps map exactly as they map `value` (a JSON list of integers is a Python
    list), so a model copies the input instead of converting it; else its `repr`."""
    text = kind.render(value)
    try:
        if _results(envs, literal(text)) == _results(envs, value):
            return text
    except Exception:  # noqa: BLE001 - not a Python literal, or a mapper that needs the repr
        pass
    return repr(value)


def _results(envs: Sequence[Environment], x: Any) -> list[str]:
    out = []
    for env in envs:
        x = env.mapper(x)
        out.append(env.output.render(x))
    return out


def with_imports(code: str, imported: set[str]) -> str:
    """`code` preceded by the imports it uses that `imported` (updated) lacks."""
    needed = [line for use, line in _IMPORTS.items() if use in code and line not in imported]
    imported.update(needed)
    return "".join(line + "\n" for line in needed) + code


def show(kind: Type, name: str) -> str:
    """The statement printing variable `name` as `kind.render` writes it."""
    return f"print({_VALUE.sub(name, kind.render_expr)})"


def step_code(env: Environment, source: str, i: int) -> str:
    """The mapper source (a function `f`) as step i, applied to the previous value."""
    call = f"y{i} = step_{i}(y{i - 1})"
    return f"{_renamed(source, f'step_{i}')}\n\n{call}\n{show(env.output, f'y{i}')}"


def branch_code(env: Environment, source: str, i: int, value: str) -> str:
    """The mapper source (a function `f`) as branch i, applied to its own input (`value`: its
    Python text)."""
    call = f"x{i} = {value}\ny{i} = branch_{i}(x{i})"
    return f"{_renamed(source, f'branch_{i}')}\n\n{call}\n{show(env.output, f'y{i}')}"


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
    imported: set[str] = set()
    x0 = binding(traj.x0, traj.envs[0].input, traj.envs)
    steps = [("text", "I bind the input to a variable, then apply each step in code.")]
    steps.append(("code", with_imports(f"y0 = {x0}\n{show(traj.envs[0].input, 'y0')}", imported)))
    for i, env in enumerate(traj.envs, 1):
        source = _source(env)
        if source is None:
            return "mapper source unavailable"
        steps.append(("text", f"Step {i}: {env.instruction}"))
        steps.append(("code", with_imports(step_code(env, source, i), imported)))
    steps.append(("text", "Every step ran; the results, in the requested form:\n" + answer))
    return steps


def parallel_steps(traj: Chain, answer: str) -> list[DemoStep] | str:
    """The PARALLEL solution of `traj` (branch i is e_i on y_{i-1}) ending in `answer`, or the
    reason it cannot be written."""
    inputs = [traj.x0, *traj.ys[:-1]]
    if not all(round_trips(x) for x in inputs):
        return "a branch input has no Python literal form"
    imported: set[str] = set()
    steps = [("text", "Each branch has its own input; I run each one's operation in code.")]
    for i, (env, x) in enumerate(zip(traj.envs, inputs), 1):
        source = _source(env)
        if source is None:
            return "mapper source unavailable"
        code = branch_code(env, source, i, binding(x, env.input, [env]))
        steps.append(("text", f"Branch {i}: {env.instruction}"))
        steps.append(("code", with_imports(code, imported)))
    steps.append(("text", "Every branch ran; the results, in the requested form:\n" + answer))
    return steps


def _first_order(
    ops: Sequence[Environment], x0: Any, target: str, kind: Type, sizes: range
) -> list[int] | None:
    """The first order of `ops` (by index; orders of each size in `sizes`, in
    `itertools.permutations` order) whose result renders as `target`: what the search code of
    `order_search_steps` prints, computed in-process. An order whose mapper raises is skipped."""
    for n in sizes:
        for order in itertools.permutations(range(len(ops)), n):
            try:
                y = x0
                for i in order:
                    y = ops[i].mapper(y)
                if kind.render(y) == target:
                    return list(order)
            except Exception:  # noqa: BLE001 - the code skips such an order too
                continue
    return None


def search_code(sources: Sequence[str], x0: str, target: str, kind: Type, sizes: range) -> str:
    """One block: each candidate's mapper as `op_<letter>`, then the search over `sizes` orders
    from `x0` (Python text) printing the first that reaches `target` (its rendered text)."""
    letters = string.ascii_uppercase[: len(sources)]
    defs = "\n\n\n".join(_renamed(src, f"op_{k}") for k, src in zip(letters, sources))
    table = ", ".join(f'"{k}": op_{k}' for k in letters)
    reached = _VALUE.sub("y", kind.render_expr)
    return (
        f"from itertools import permutations\n\n\n{defs}\n\n\nops = {{{table}}}\n\n\n"
        "def first_order(y0, sizes):\n"
        "    for n in sizes:\n"
        "        for order in permutations(ops, n):\n"
        "            y = y0\n"
        "            try:\n"
        "                for k in order:\n"
        "                    y = ops[k](y)\n"
        "            except Exception:\n"
        "                continue\n"
        f"            if {reached} == {target!r}:\n"
        '                return ", ".join(order)\n\n\n'
        f"print(first_order({x0}, {list(sizes)!r}))"
    )


def order_search_steps(
    task: OperatorTask, traj: Chain, registry: Environments
) -> list[DemoStep] | str:
    """The SORT or SELECT solution of `task` by search (see the module doc), ending in the
    order found, or the reason it cannot be written."""
    ops = [registry.get(name) for name in task.candidates]
    kind = traj.envs[0].input
    if any(e.input.name != kind.name or e.output.name != kind.name for e in ops):
        return f"an order search needs operations from {kind.name} to {kind.name}"
    if not round_trips(traj.x0):
        return "input has no Python literal form"
    sources = [src for src in map(_source, ops) if src is not None]
    if len(sources) < len(ops):
        return "mapper source unavailable"
    sizes = range(len(ops), len(ops) + 1) if task.operator == "sort" else range(1, len(ops) + 1)
    found = _first_order(ops, traj.x0, task.xs[-1], kind, sizes)
    if found is None:
        return "the search finds no order that reaches the target"
    letters = ", ".join(string.ascii_uppercase[i] for i in found)
    answer = f"<answer>{letters}</answer>"
    if REWARDS[task.operator](task, answer, registry).value != 1.0:
        return "the order the search finds does not score"  # e.g. equal renderings, unequal values
    imported: set[str] = set()
    x0 = binding(traj.x0, kind, traj.envs)
    code = with_imports(search_code(sources, x0, task.xs[-1], kind, sizes), imported)
    return [
        ("text", "I write each operation as a function, then try the orders in code."),
        ("code", code),
        ("text", "The search found this order; in the requested form:\n" + answer),
    ]


def chain_of(task: OperatorTask, registry: Environments) -> Chain | str:
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


def operator_steps(
    task: OperatorTask, registry: Environments, search_orders: bool = True
) -> list[DemoStep] | str:
    """The code solution of a stored task, or why there is none (SORT and SELECT: a search,
    unless `search_orders` is False)."""
    if task.operator in ("sort", "select") and not search_orders:
        return f"{task.operator} asks for an order, and searching for it in code is off"
    traj = chain_of(task, registry)
    if isinstance(traj, str):
        return traj
    if task.operator in ("sort", "select"):
        return order_search_steps(task, traj, registry)
    writers = {"sequential": sequential_steps, "parallel": parallel_steps}
    return writers[task.operator](traj, task.answer)


def code_blocks(steps: Sequence[DemoStep]) -> list[str]:
    return [text for kind, text in steps if kind == "code"]


def printed_types(task_operator: str, traj: Chain) -> list[Type]:
    """The type of each code block's printed line: SEQUENTIAL prints x_0 then every step's
    result; PARALLEL prints each branch's result."""
    outputs = [env.output for env in traj.envs]
    return [traj.envs[0].input, *outputs] if task_operator == "sequential" else outputs
