"""The four RACES composition operators: turning a trajectory into a task and scoring answers.

From a trajectory pi_t = (x_0; e_1..e_t; y_1..y_t) (RACES §2.4, formulas quoted per operator):

- SEQUENTIAL: the model sees x_0 and the instructions D_{e_1}..D_{e_t} in order and gives every
  intermediate output. K = min({i : V_{e_i}(ŷ_i, y_i) = 0} ∪ {t+1}) − 1, R_Seq = K / t.
- PARALLEL: the steps become independent branches, branch i being e_i on its own input y_{i-1}.
  R_Par = (1/t) Σ_i V_{e_i}(ŷ_i, y_i).
- SORT: the model sees e_1..e_t shuffled, x_0 and y_t, and gives an order σ̂ of all of them.
  R_Sort = 1{(f_{e_σ̂(t)} ∘ … ∘ f_{e_σ̂(1)})(x_0) = y_t}.
- SELECT: as SORT, with executable distractors B_π added to the candidates A_π = {e_1..e_t} ∪ B_π;
  the model chooses k of them in order. R_Sel = 1{(f_σ̂_k ∘ … ∘ f_σ̂_1)(x_0) = y_t}.

Answers go inside the last <answer>…</answer> block of the response, one value per line for
SEQUENTIAL (`Step i: value`) and PARALLEL (`Branch i: value`), a comma-separated list of letters
for SORT and SELECT. Parsing fails closed: a missing block, a missing or repeated line, a letter
that is not offered, or a value of the wrong form scores 0 for what it covers, and the reward
comes with the reason.

A `OperatorTask` is plain data (rendered values and environment names), so it round-trips through JSONL;
scoring looks the environments up in a registry and parses the rendered values back. Stored tasks
fail closed too: `OperatorTask.from_dict` never raises, and `score` gives a task it cannot score (no steps,
a missing or ill-typed field, an unknown environment, a stored value that does not parse) 0 with
the reason (`task_problem`) instead of raising.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

from tirl.envs.core import Chain, Environment, Environments, run_chain
from tirl.envs.seeding import Drawing, shuffle
from tirl.envs.types import AnswerError

OPERATORS = ("sequential", "parallel", "sort", "select")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class OperatorReward:
    value: float
    reason: str = ""


@dataclass(frozen=True)
class OperatorTask:
    """One composite problem. `envs` is the true path e_1..e_t; `xs` are the rendered states
    x_0, y_1..y_t; `candidates` are the environment names shown to the model for SORT and
    SELECT, in the order of their letters (A, B, …)."""

    operator: str
    prompt: str
    envs: tuple[str, ...]
    xs: tuple[str, ...]
    answer: str  # a reference answer that scores 1
    candidates: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> OperatorTask:
        """The task a `to_dict` row holds. Never raises: for a row that is not a well-formed task
        (a field missing or of the wrong type), the fields that can be read are kept, the others
        left empty, and `meta[MALFORMED]` says what is wrong; `score` gives such a task 0."""
        if not isinstance(d, Mapping):
            problem = f"a stored task is a mapping, not {type(d).__name__}"
            return cls("", "", (), (), "", meta={MALFORMED: problem})
        problems: list[str] = []

        def text(key: str) -> str:
            value = d.get(key)
            if isinstance(value, str):
                return value
            problems.append(_field_problem(key, value, "a string"))
            return ""

        def texts(key: str, required: bool = True) -> tuple[str, ...]:
            value = d.get(key)
            if value is None and not required:
                return ()
            if not isinstance(value, (str, bytes, Mapping)):
                try:
                    items = tuple(value)
                except TypeError:
                    items = None
                if items is not None:
                    odd = next((x for x in items if not isinstance(x, str)), None)
                    if odd is None:
                        return tuple(str(x) for x in items)
                    problems.append(
                        f"field {key!r} holds {type(odd).__name__} values, not only strings"
                    )
                    return ()
            problems.append(_field_problem(key, value, "a list of strings"))
            return ()

        operator, prompt = text("operator"), text("prompt")
        envs, xs = texts("envs"), texts("xs")
        answer, candidates = text("answer"), texts("candidates", required=False)
        meta_value = d.get("meta")
        meta = dict(meta_value) if isinstance(meta_value, Mapping) else {}
        if meta_value is not None and not isinstance(meta_value, Mapping):
            problems.append(_field_problem("meta", meta_value, "a mapping"))
        if problems:
            meta[MALFORMED] = "; ".join(problems)
        return cls(operator, prompt, envs, xs, answer, candidates, meta)


MALFORMED = "malformed"  # the meta key where `OperatorTask.from_dict` says what is wrong with a row


def _field_problem(key: str, value: Any, wanted: str) -> str:
    if value is None:
        return f"field {key!r} is missing"
    return f"field {key!r} is {type(value).__name__}, not {wanted}"


# ---------------------------------------------------------------------------------------------
# Building tasks


def _letters(n: int) -> list[str]:
    if n > len(string.ascii_uppercase):
        raise ValueError(f"at most 26 candidates can be lettered, got {n}")
    return list(string.ascii_uppercase[:n])


def _labelled_block(label: str, values: Sequence[str]) -> str:
    """<answer> with one `label i: value` line per value."""
    lines = "\n".join(map(str.__add__, _line_heads(label, len(values)), values))
    return f"<answer>\n{lines}\n</answer>"


# What a task of t steps repeats from every other task of t steps, built once per label and t:
# the heads `label i: ` of the answer lines, and the prompt's closing form with its placeholders
# (a build makes one task per composite, and these cost ~4 us of the ~8 us of a task).
_HEADS: dict[tuple[str, int], tuple[str, ...]] = {}
_FORMS: dict[tuple[str, int], str] = {}


def _line_heads(label: str, t: int) -> tuple[str, ...]:
    heads = _HEADS.get((label, t))
    if heads is None:
        heads = _HEADS[label, t] = tuple(f"{label} {i}: " for i in range(1, t + 1))
    return heads


def _answer_form(label: str, t: int) -> str:
    form = _FORMS.get((label, t))
    if form is None:
        placeholders = [f"<result of {label.lower()} {i}>" for i in range(1, t + 1)]
        form = _FORMS[label, t] = (
            "\n\nGive every result, one per line, exactly in this form:\n"
            + _labelled_block(label, placeholders)
        )
    return form


def _per_line_task(operator: str, traj: Chain, label: str, intro: str, body: str) -> OperatorTask:
    xs = traj.rendered()
    prompt = f"{intro}\n\n{body}" + _answer_form(label, traj.size)
    return OperatorTask(operator, prompt, traj.names(), xs, _labelled_block(label, xs[1:]))


def sequential(traj: Chain) -> OperatorTask:
    steps = "\n".join(map(str.__add__, _line_heads("Step", traj.size), map(_step_text, traj.envs)))
    x0 = traj.rendered()[0]
    intro = (
        "Start from the input below and apply the steps in order; each step acts on the result"
        f" of the step before it.\n\nInput: {x0}"
    )
    return _per_line_task("sequential", traj, "Step", intro, steps)


_STEP_TEXTS: dict[Environment, str] = {}  # by environment (identity); cleared past 10,000


def _step_text(e: Environment) -> str:
    """`instruction (The result is <answer format>.)`, a SEQUENTIAL step, built once."""
    text = _STEP_TEXTS.get(e)
    if text is None:
        if len(_STEP_TEXTS) >= 10_000:
            _STEP_TEXTS.clear()
        text = _STEP_TEXTS[e] = f"{e.instruction} (The result is {e.output.answer_format}.)"
    return text


def parallel(traj: Chain) -> OperatorTask:
    inputs = traj.rendered()[:-1]
    branches = "\n\n".join(
        f"Branch {i}: {e.instruction}\nInput: {x}\n(The result is {e.output.answer_format}.)"
        for i, (e, x) in enumerate(zip(traj.envs, inputs), 1)
    )
    intro = "Solve each of the following independent problems; each branch has its own input."
    return _per_line_task("parallel", traj, "Branch", intro, branches)


_LETTER_HEADS = tuple(f"{letter}. " for letter in string.ascii_uppercase)
_INSTRUCTION = attrgetter("instruction")


def _order_prompt(intro: str, envs: list[Environment], xs: tuple[str, ...], rule: str) -> str:
    listing = "\n".join(map(str.__add__, _LETTER_HEADS, map(_INSTRUCTION, envs)))
    if len(envs) > len(_LETTER_HEADS):
        raise ValueError(f"at most 26 candidates can be lettered, got {len(envs)}")
    return (
        f"{intro}\n\n{listing}\n\nStart: {xs[0]}\nTarget: {xs[-1]}\n\n{rule}\n"
        "Write the letters in the order the operations are applied, separated by commas, exactly"
        " in this form:\n<answer>B, A, C</answer>"
    )


def sort(traj: Chain, rng: random.Random) -> OperatorTask:
    xs = traj.rendered()
    order = list(range(traj.size))
    while traj.size > 1 and order == sorted(order):
        shuffle(rng, order)  # never show the true order as it is
    shown = [traj.envs[i] for i in order]
    letters = _letters(len(shown))
    truth = [letters[order.index(i)] for i in range(traj.size)]
    prompt = _order_prompt(
        "These operations, applied one after another in some order, turn the start value into"
        " the target value:",
        shown,
        xs,
        "Use every letter exactly once.",
    )
    return OperatorTask(
        "sort",
        prompt,
        traj.names(),
        xs,
        f"<answer>{', '.join(truth)}</answer>",
        candidates=tuple(e.name for e in shown),
    )


def executable_distractors(
    traj: Chain, registry: Environments, n: int, rng: random.Random
) -> list[Environment]:
    """B_π: environments outside the path that run on one of the states x_0..y_{t-1}, so they
    look usable (RACES: distractors are executable, not random text). The candidates are taken
    in a random order drawn one at a time, as far as needed: the pool holds up to a few hundred
    environments, and a task needs two or three."""
    on_path = set(traj.envs)
    states = [traj.x0, *traj.ys[:-1]]
    kinds = frozenset((traj.envs[0].input.name, *(e.output.name for e in traj.envs[:-1])))
    chosen: list[Environment] = []
    for e in Drawing(rng, registry.accepting(kinds)):
        if len(chosen) >= n:
            break
        if e in on_path:
            continue
        for s in states:
            if e.input.check(s) is None:
                try:
                    e.mapper(s)
                except Exception:
                    continue
                chosen.append(e)
                break
    return chosen


def select(
    traj: Chain, registry: Environments, rng: random.Random, n_distractors: int | None = None
) -> OperatorTask:
    xs = traj.rendered()
    n = n_distractors if n_distractors is not None else max(2, traj.size // 2 + 1)
    # (position on the path or None, environment): a path may use one environment twice, and
    # then it is offered twice, under two letters
    items = [(i, e) for i, e in enumerate(traj.envs)]
    items += [(None, e) for e in executable_distractors(traj, registry, n, rng)]
    shuffle(rng, items)
    shown = [e for _, e in items]
    letters = _letters(len(shown))
    positions = [i for i, _ in items]
    truth = [letters[positions.index(i)] for i in range(traj.size)]
    prompt = _order_prompt(
        "Some of these operations, applied one after another, turn the start value into the"
        " target value; the others are not needed:",
        shown,
        xs,
        "Choose the letters you need, each at most once, and put them in order.",
    )
    return OperatorTask(
        "select",
        prompt,
        traj.names(),
        xs,
        f"<answer>{', '.join(truth)}</answer>",
        candidates=tuple(e.name for e in shown),
    )


def make_task(
    operator: str, traj: Chain, registry: Environments, rng: random.Random
) -> OperatorTask:
    if operator == "sequential":
        return sequential(traj)
    if operator == "parallel":
        return parallel(traj)
    if operator == "sort":
        return sort(traj, rng)
    if operator == "select":
        return select(traj, registry, rng)
    raise ValueError(f"unknown operator {operator!r}; expected one of {', '.join(OPERATORS)}")


# ---------------------------------------------------------------------------------------------
# Scoring


def answer_block(response: str) -> str:
    """The text of the last <answer>…</answer> block; AnswerError if there is none."""
    blocks = _ANSWER.findall(response)
    if not blocks:
        raise AnswerError("no <answer>…</answer> block in the response")
    return blocks[-1].strip()


_LINE_PATTERNS: dict[str, re.Pattern[str]] = {}  # label -> its answer line, compiled once


def _labelled_lines(block: str, label: str, t: int) -> dict[int, str]:
    """{i: text} from lines `label i: text`; a repeated or out-of-range index is an error."""
    found: dict[int, str] = {}
    pattern = _LINE_PATTERNS.get(label)
    if pattern is None:
        # `\s*label\s+(\d+)\s*:\s*(.*?)\s*` in full, the text stripped after the match: the same
        # text (a line holds no newline, and `\s` is what `str.strip` strips), where the lazy
        # group retried the trailing `\s*` at every character
        pattern = _LINE_PATTERNS[label] = re.compile(rf"\s*{label}\s+(\d+)\s*:(.*)")
    fullmatch = pattern.fullmatch
    for line in block.splitlines():
        m = fullmatch(line)
        if m is None:
            continue
        index, text = m.groups()
        i = int(index)
        if not 1 <= i <= t:
            raise AnswerError(f"{label} {i} does not exist (there are {t})")
        if i in found:
            raise AnswerError(f"{label} {i} is given more than once")
        found[i] = text.strip()
    return found


def _step_results(
    task: OperatorTask,
    response: str,
    registry: Environments,
    label: str,
    states: list[Any] | None = None,
) -> list[tuple[bool, str]]:
    """V_{e_i}(ŷ_i, y_i) for i = 1..t, with the reason for each failure. `states`: the stored
    states already parsed (`score` has them from its check of the task)."""
    envs = registry.find(task.envs) or [registry.get(n) for n in task.envs]  # (get: its error)
    t = len(envs)
    try:
        lines = _labelled_lines(answer_block(response), label, t)
    except AnswerError as e:
        return [(False, str(e))] * t
    results = []
    xs = task.xs
    for i, e in enumerate(envs, 1):
        line = lines.get(i)
        if line is None:
            results.append((False, f"{label} {i} is missing"))
            continue
        gold = states[i] if states is not None else e.output.parse(xs[i])
        if line == xs[i]:  # the stored text itself: it parses to gold (parse is pure)
            ok, why = e.verify_value(gold, gold)
        else:
            ok, why = e.verify(line, gold)
        results.append((ok, "" if ok else f"{label} {i}: {why}"))
    return results


def reward_sequential(
    task: OperatorTask, response: str, registry: Environments, states: list[Any] | None = None
) -> OperatorReward:
    """R_Seq = K / t with K the length of the longest correct prefix."""
    results = _step_results(task, response, registry, "Step", states)
    t = len(results)
    k = next((i for i, (ok, _) in enumerate(results) if not ok), t)
    reason = "" if k == t else results[k][1]
    return OperatorReward(k / t, reason)


def reward_parallel(
    task: OperatorTask, response: str, registry: Environments, states: list[Any] | None = None
) -> OperatorReward:
    """R_Par = (1/t) Σ V_{e_i}(ŷ_i, y_i)."""
    results = _step_results(task, response, registry, "Branch", states)
    reasons = "; ".join(why for ok, why in results if not ok)
    return OperatorReward(sum(ok for ok, _ in results) / len(results), reasons)


def _chosen(task: OperatorTask, response: str) -> list[str]:
    block = answer_block(response)
    letters = [p.strip() for p in block.split(",")]
    offered = _letters(len(task.candidates))
    for p in letters:
        if p not in offered:
            raise AnswerError(f"{p!r} is not one of the offered letters {', '.join(offered)}")
    if len(set(letters)) != len(letters):
        raise AnswerError("a letter is used more than once")
    return [task.candidates[offered.index(p)] for p in letters]


def _reaches_target(
    task: OperatorTask, names: list[str], registry: Environments, states: list[Any] | None
) -> OperatorReward:
    envs = registry.find(names) or [registry.get(n) for n in names]  # (get: its error)
    first, last = registry.get(task.envs[0]), registry.get(task.envs[-1])
    if states is not None:
        x0, target = states[0], states[-1]
    else:
        x0, target = first.input.parse(task.xs[0]), last.output.parse(task.xs[-1])
    try:
        value = run_chain(envs, x0)
    except Exception as e:  # an order that does not type-check or run scores 0
        return OperatorReward(0.0, f"the chosen order cannot be executed: {e}")
    if envs[-1].output.name != last.output.name or not last.output.equal(value, target):
        return OperatorReward(0.0, "the chosen operations do not reach the target")
    return OperatorReward(1.0)


def reward_sort(
    task: OperatorTask, response: str, registry: Environments, states: list[Any] | None = None
) -> OperatorReward:
    """R_Sort = 1 iff the predicted order of all t operations maps x_0 to y_t."""
    try:
        names = _chosen(task, response)
    except AnswerError as e:
        return OperatorReward(0.0, str(e))
    if len(names) != len(task.candidates):
        return OperatorReward(0.0, f"use all {len(task.candidates)} operations, got {len(names)}")
    return _reaches_target(task, names, registry, states)


def reward_select(
    task: OperatorTask, response: str, registry: Environments, states: list[Any] | None = None
) -> OperatorReward:
    """R_Sel = 1 iff the chosen operations, in the chosen order, map x_0 to y_t."""
    try:
        names = _chosen(task, response)
    except AnswerError as e:
        return OperatorReward(0.0, str(e))
    if not names:
        return OperatorReward(0.0, "no operation was chosen")
    return _reaches_target(task, names, registry, states)


REWARDS = {
    "sequential": reward_sequential,
    "parallel": reward_parallel,
    "sort": reward_sort,
    "select": reward_select,
}


def task_problem(task: OperatorTask, registry: Environments) -> str | None:
    """Why `task` cannot be scored against `registry`, or None if it can.

    Checks what scoring relies on: a known operator, at least one step, one stored state per step
    plus the start, environments the registry has, SORT/SELECT candidates that hold the path, and
    stored states that parse back with their environment's types.
    """
    problem = _check(task, registry)
    return problem if isinstance(problem, str) else None


_STR_TYPES = {str}


def _holds(candidates: tuple[str, ...], envs: tuple[str, ...]) -> bool:
    """Whether `candidates` hold every step of `envs`, a repeated step as often as it repeats
    (a path without repeats, the common case, needs only the sets)."""
    if len(set(envs)) == len(envs):
        return set(envs) <= set(candidates)
    return not Counter(envs) - Counter(candidates)


def _check(task: OperatorTask, registry: Environments) -> str | list[Any]:
    """`task_problem`'s reason, or the stored states parsed (what the rewards compare with)."""
    if not isinstance(task, OperatorTask):
        return f"a task is a OperatorTask, not {type(task).__name__} (read rows with OperatorTask.from_dict)"
    meta = task.meta if type(task.meta) is dict or isinstance(task.meta, Mapping) else {}
    if meta.get(MALFORMED):
        return str(meta[MALFORMED])
    if not isinstance(task.operator, str) or task.operator not in REWARDS:
        return f"unknown operator {task.operator!r}; expected one of {', '.join(OPERATORS)}"
    envs, xs, candidates = task.envs, task.xs, task.candidates
    # (the set of the items' types: one C-level pass over the three fields, where a generator
    # costs ~0.5 us a step; field by field only to name the one at fault)
    if not (
        type(envs) is type(xs) is type(candidates) is tuple
        and set(map(type, envs + xs + candidates)) <= _STR_TYPES
    ):
        for key, value in (("envs", envs), ("xs", xs), ("candidates", candidates)):
            if not isinstance(value, tuple) or not all(isinstance(x, str) for x in value):
                return _field_problem(key, value, "a tuple of strings")
    if not envs:
        return "the task has no steps"
    if len(xs) != len(envs) + 1:
        return f"the task has {len(xs)} stored states for {len(envs)} steps (needs {len(envs) + 1})"
    if task.operator in ("sort", "select"):
        if not candidates:
            return f"a {task.operator} task has no candidates"
        if len(candidates) > len(string.ascii_uppercase):
            return f"{len(candidates)} candidates cannot be lettered (at most 26)"
        if task.operator == "sort" and sorted(candidates) != sorted(envs):
            return "the sort candidates are not the steps of the path"
        if task.operator == "select" and not _holds(candidates, envs):
            return "the select candidates do not include every step of the path"
    steps = registry.find(envs)
    if steps is None or (candidates and registry.find(candidates) is None):
        for name in (*envs, *candidates):
            if name not in registry:
                return f"unknown environment {name!r}"
    return _stored_states(steps, xs)


# The stored states parsed, per environment and text (inputs of the first step apart from
# outputs). Scoring parses every stored state of every task (a reward compares with them, and a
# task whose states do not parse is refused), and the texts recur: in 20,000 built tasks ~85% of
# the states are a text some task already stored (small integers, booleans, short lists). Parsing
# is pure, so a text parses to an equal value each time; only values that hash (immutable, as
# values are: `tirl.envs.types`) are kept, so no task can change another's states. Bounded: past
# `_PARSE_LIMIT` texts the memo starts afresh. Environments are keys by identity (a type's
# dataclass hash costs a Python call per lookup). Threads may score at once: each operation is
# one dict operation, and a race at worst parses a text again.
_PARSE_LIMIT = 100_000
_NOT_PARSED = object()


class _ParseMemo:
    def __init__(self) -> None:
        # by environment, then text: (inputs of the first step, outputs); the environments whose
        # types are equal share one table (`texts`)
        self.tables: tuple[dict[Environment, dict[str, Any]], ...] = ({}, {})
        self.by_type: dict[Any, dict[str, Any]] = {}
        self.size = 0

    def texts(self, env: Environment, output: bool) -> dict[str, Any]:
        """The table of env's output (or input) type, which environments with an equal type
        share: a type's `parse` depends on its constraints alone (types are frozen dataclasses;
        equal ones parse alike), and ~460 environments use a few dozen types (an `int` text
        parsed for one of them is parsed for all)."""
        kind = env.output if output else env.input
        try:
            known = self.by_type.get(kind)
        except TypeError:  # a type that does not hash: a table of its own
            known = {}
        else:
            if known is None:
                known = self.by_type[kind] = {}
        self.tables[output][env] = known
        return known

    def parse(self, env: Environment, output: bool, text: str) -> Any:
        """`text` parsed with env's output type (or input type); raises as `parse` does."""
        known = self.tables[output].get(env)
        if known is None:
            known = self.texts(env, output)
        value = known.get(text, _NOT_PARSED)
        if value is _NOT_PARSED:
            value = (env.output if output else env.input).parse(text)
            try:
                hash(value)
            except TypeError:
                return value
            if self.size >= _PARSE_LIMIT:
                for table in (*self.tables, self.by_type):
                    table.clear()
                self.size = 0
                known = self.texts(env, output)
            known[text] = value
            self.size += 1
        return value


_PARSED = _ParseMemo()


def _stored_states(steps: list[Environment], xs: tuple[str, ...]) -> str | list[Any]:
    """The stored states x_0, y_1..y_t parsed with the types of the steps, or why one does not
    parse. (The memo's lookups inline: a call per state cost a third of a task's check.)"""
    states = []
    append = states.append
    inputs, outputs = _PARSED.tables
    for i, value in enumerate(xs):
        env, table = (steps[i - 1], outputs) if i else (steps[0], inputs)
        known = table.get(env)
        if known is not None:
            parsed = known.get(value, _NOT_PARSED)
            if parsed is not _NOT_PARSED:
                append(parsed)
                continue
        try:
            append(_PARSED.parse(env, i > 0, value))
        except Exception as e:  # noqa: BLE001 - any failure to read a stored value back
            kind = env.output if i else env.input
            return f"stored state {i} {value!r} does not parse as {kind.name}: {e}"
    return states


def score(task: OperatorTask, response: str, registry: Environments) -> OperatorReward:
    """The operator's reward for `response`. Never raises: a task `task_problem` finds fault with
    scores 0 with "malformed task: <why>", and a failure while scoring scores 0 with its error.
    The states the check parsed are the ones the reward compares with (each is parsed once)."""
    states = _check(task, registry)
    if isinstance(states, str):
        return OperatorReward(0.0, f"malformed task: {states}")
    if not isinstance(response, str):
        return OperatorReward(0.0, f"the response is {type(response).__name__}, not text")
    try:
        return REWARDS[task.operator](task, response, registry, states)
    except Exception as e:  # noqa: BLE001 - a reward fails closed, an environment's bug included
        return OperatorReward(0.0, f"scoring failed: {type(e).__name__}: {e}")
