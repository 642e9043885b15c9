"""Randomized breadth-first search for composite environments, with quality control (RACES §2.3).

From a root x_0 ~ G_{e_1}, the search extends trajectories level by level: for the frontier state
y_t it takes the domain-compatible candidates C(y_t) = {e : X_e = type(y_t)} in random order and
keeps up to `frontier_cap` of them that pass the step checks, so short compositions are explored
first and no high-degree type swamps the pool. Every kept step really ran: each trajectory
records x_0, e_1..e_t and y_1..y_t.

Step checks (a step is dropped when it fails one): the state is a valid input of the candidate
(its constraints); the mapper returns within `step_timeout_s` without raising (wall-clock time,
so a step that times out is run once more before it is dropped: on a busy machine a fast mapper
can be descheduled past the limit, and which composites exist must not depend on the load); the
output is a valid value of its type; the step changes the state; it does not undo the previous
step (y_{t+1} != y_{t-1}); the new state renders in at most `max_render_chars` characters.
Path checks, before a trajectory is yielded: its size is within [min_size, max_size]; its
sequence of environments was yielded fewer than `inputs_per_composite` times before, never from
the same x_0 (by default each composite once; more instances of one composite, each from a fresh
root, are what a small set of environments needs to give more than a handful of tasks); and its
output is not constant: the same chain run on `constant_probes` other inputs must not give the
same y_t every time.

What it costs, and how that was cut without changing what it yields (tests/data/
races_golden.jsonl holds the output of the plain implementation this replaced, commit 7f06b58;
tests/test_envs_races.py compares). A search for size s must walk levels 1..s-1 of its first
round before it yields anything; with 459 start environments and the default caps, level 4
holds ~18,000 states, and one generator's draws order every state's candidates.
- Children are run when the search reaches them, not when their parent is expanded. The
  frontier's length when the plain search expanded a parent (what `max_frontier` cuts on) is
  recomputed exactly then, and a parent's order of candidates is drawn one candidate at a time
  (`seeding.Drawing`), its remaining draws made at once. A level the search never reaches the end
  of costs its draws (made ahead with `seeding.advance`, then redrawn from a copy of the
  generator as parents are expanded) but not its mapper calls: the search for size 5 used to run
  ~57,000 steps of its last level to yield its first composite, and now runs those it yields.
- Searches that differ only in their sizes (`build_tasks` runs one per size) share their first
  round up to the level where each starts checking paths: those levels draw the same numbers and
  run the same steps in every such search, so they are walked once (`_FirstRound`).
- What one environment does to one state is memoized (`_Steps`): mappers are deterministic, and
  states recur (small integers, booleans, short lists): about half the steps of a deep level and
  40% of the constant probes' steps.
- Orders and shuffles make the draws of `random.Random.sample` / `shuffle` inline
  (`tirl.envs.seeding`), three times faster.
What is left (profile in BENCHMARKS.md): the draws for the ~18,000 states of level 4 (about
1.1 million), the steps of levels 1-3, and the constant probes, which sample fresh inputs.
"""

from __future__ import annotations

import _signal
import random
import signal
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from tirl.envs.core import Chain, Environment, Registry
from tirl.envs.seeding import Drawing, advance, item_rng, permutation


@dataclass(frozen=True)
class SearchConfig:
    min_size: int = 2
    max_size: int = 5
    frontier_cap: int = 4  # children kept per frontier state
    max_frontier: int = 20_000  # states waiting at once; beyond it, new ones are dropped
    step_timeout_s: float = 0.1
    max_render_chars: int = 300
    constant_probes: int = 3
    level: int = 1  # difficulty level of the root inputs
    inputs_per_composite: int = 1  # instances of one sequence of environments, distinct x_0

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size:
            raise ValueError(
                f"need 1 <= min_size <= max_size, got {self.min_size}, {self.max_size}"
            )
        for name in ("frontier_cap", "max_frontier", "max_render_chars", "inputs_per_composite"):
            if getattr(self, name) < 1:
                raise ValueError(f"SearchConfig.{name} must be at least 1")


class StepTimeout(Exception):
    pass


def _expire(signum, frame):
    raise StepTimeout


@contextmanager
def step_timer():
    """Arm SIGALRM for `try_step` while a search runs (main thread only; elsewhere steps run
    unbounded: mappers promise to be fast, the timer only guards against pathological inputs).
    One handler per search, not per step: a step then costs two setitimer calls."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _expire)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _timed() -> bool:
    """Whether steps run under the timer: a search's `step_timer` holds SIGALRM. (The raw
    handler, as `signal.getsignal` has it before wrapping it in an enum, costly per step.)"""
    return _signal.getsignal(signal.SIGALRM) is _expire


# ---------------------------------------------------------------------------------------------
# One step, memoized


_BAD_INPUT, _RAISED, _RAN = range(3)  # what running e on y gave
_MEMO_LIMIT = 100_000  # states; past it the memo starts afresh (bounded memory)


class _Steps:
    """What each environment does to each state, run once per distinct pair.

    Mappers are deterministic functions of their input, so a repeated (environment, state) pair
    gives the same output; the key holds the state's type too, so True and 1 (equal in Python)
    stay apart. A run that timed out is not kept, nor one that ran longer than the timeout
    outside the timer (a later, timed step must be able to time out). An entry is
    [outcome, f_e(y), output valid, renders short enough]; the last two are filled the first
    time a step needs them, in the plain step's order (the checks that depend on the chain,
    unchanged and undo, come before the rendering).

    The timer measures wall-clock time, so on a busy machine a fast mapper can be descheduled
    past it; a step that times out is run once more before it is dropped, so that which
    composites exist does not depend on the machine's load (a mapper that is really slow times
    out twice)."""

    def __init__(self, config: SearchConfig) -> None:
        self.config = config
        self.memo: dict[tuple[type, Any], dict[Environment, list[Any]]] = {}

    def _run(self, env: Environment, state: Any, timed: bool) -> tuple[list[Any] | None, bool]:
        """(a fresh entry or None if the mapper timed out twice, whether to keep it)."""
        if env.input.check(state) is not None:
            return [_BAD_INPUT, None, False, False], True
        timeout = self.config.step_timeout_s
        for _ in range(2 if timed else 1):
            start = time.perf_counter()
            try:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, timeout)
                out = env.mapper(state)
            except StepTimeout:
                continue
            except Exception:  # a mapper that raises failed its step
                return [_RAISED, None, False, False], True
            finally:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            return [_RAN, out, None, None], timed or time.perf_counter() - start <= timeout
        return None, False

    def of_state(self, state: Any) -> dict[Environment, list[Any]] | None:
        """The entries of one state, by environment (None for an unhashable state: not kept).
        Looked up once per state, then once per environment by identity: hashing a state (a
        long tuple, say) once per frontier state instead of once per candidate."""
        key = (type(state), state)
        try:
            found = self.memo.get(key)
        except TypeError:
            return None
        if found is None:
            if len(self.memo) >= _MEMO_LIMIT:
                self.memo.clear()
            found = self.memo[key] = {}
        return found

    def entry(
        self, env: Environment, state: Any, timed: bool, known: dict[Environment, list[Any]] | None
    ) -> list[Any] | None:
        """The entry of `env` on `state`; `known` is `of_state(state)`."""
        found = known.get(env) if known is not None else None
        if found is None:
            found, keep = self._run(env, state, timed)
            if keep and known is not None:
                known[env] = found
        return found

    def step(
        self,
        traj: Chain,
        env: Environment,
        timed: bool,
        known: dict[Environment, list[Any]] | None,
    ) -> Chain | None:
        """`traj` extended by `env`, or None if the step fails a step check (as `try_step`);
        `known` is `of_state(traj.final)`."""
        state = traj.final
        found = known.get(env) if known is not None else None
        if found is None:
            found = self.entry(env, state, timed, known)
            if found is None:
                return None
        if found[0] != _RAN:
            return None
        out = found[1]
        if found[2] is None:
            found[2] = env.output.check(out) is None
        if not found[2]:
            return None
        if env.output.name == env.input.name and out == state:
            return None  # the step left the state unchanged
        ys = traj.ys
        if ys:
            previous = ys[-2] if len(ys) >= 2 else traj.x0
            if out == previous and type(out) is type(previous):
                return None  # undoes the step before
        if found[3] is None:
            found[3] = len(env.output.render(out)) <= self.config.max_render_chars
        if not found[3]:
            return None
        return Chain(traj.x0, traj.envs + (env,), ys + (out,))

    def run_chain(self, envs: Sequence[Environment], x: Any) -> tuple[bool, Any]:
        """(True, f_{e_k}(…f_{e_1}(x))) as `core.run_chain` computes it, or (False, None) where
        it would raise (an invalid input, a mapper that raises); memoized."""
        memo = self.memo
        value = x
        for e in envs:
            key = (type(value), value)
            try:
                known = memo.get(key)
            except TypeError:  # an unhashable value: not kept
                known = None
                found = None
            else:
                if known is None:
                    if len(memo) >= _MEMO_LIMIT:
                        memo.clear()
                    known = memo[key] = {}
                found = known.get(e)
            if found is None:
                try:
                    found, keep = self._run(e, value, False)
                except Exception:  # a check that raises: run_chain would raise too
                    return False, None
                if keep and known is not None:
                    known[e] = found
            if found[0] != _RAN:
                return False, None
            value = found[1]
        return True, value


def try_step(traj: Chain, env: Environment, config: SearchConfig) -> Chain | None:
    """`traj` extended by `env`, or None if the step fails a step check."""
    steps = _Steps(config)
    return steps.step(traj, env, _timed(), steps.of_state(traj.final))


def _constant(traj: Chain, config: SearchConfig, rng: random.Random, steps: _Steps) -> bool:
    """True if the chain maps other inputs to the same final value too (a degenerate path).
    Other roots may not survive every step's constraints; if none does, the last step alone is
    probed on inputs of its own. (Each probe runs the chain as `core.run_chain` does, a step
    whose input is invalid or whose mapper raises ending it, through the memo.)"""
    probes, level = config.constant_probes, config.level
    run = steps.run_chain
    for envs in (traj.envs, traj.envs[-1:]):
        outputs = []
        first = envs[0]
        for _ in range(4 * probes):
            if len(outputs) >= probes:
                break
            try:
                x = first.sample(rng, level)
            except Exception:
                continue
            ok, value = run(envs, x)
            if ok:
                outputs.append(value)
        if outputs:
            final = traj.final
            return all(o == final for o in outputs)
    return False


# ---------------------------------------------------------------------------------------------
# Levels of a round


class _Level:
    """One level of a round's breadth-first walk: the children of the level above, in the order
    the plain search appended them to its frontier. Children are run when asked for, parent by
    parent; the frontier the plain search had when it expanded parent j (the parents after j
    plus the children so far) is known then, so `max_frontier` cuts at the same child.

    A parent's order of candidates is either given (drawn when the parent was popped, as in the
    plain search) or drawn from `drawer` when the parent is expanded: one item at a time, the
    rest of the draws made at once when the parent is done (`seeding.Drawing`). `drawer` is the
    search's generator itself when nothing else draws before the level is over (a level below
    min_size, run to its end at once), or a copy taken before the level's draws, which the
    search made already with `seeding.advance` (a level whose paths are checked, which may be
    left unfinished)."""

    def __init__(
        self,
        steps: _Steps,
        config: SearchConfig,
        drawer: random.Random | None = None,
        consumers: dict[str, list[Environment]] | None = None,
    ) -> None:
        self.steps = steps
        self.config = config
        self.drawer = drawer
        self.consumers = consumers or {}
        self.parents: list[tuple[Chain, list[Environment] | None]] = []
        self.items: list[Chain] = []
        self.run_parents = 0
        self.closed = False  # every parent is in: the frontier's length can be computed

    def add(self, parent: Chain, order: list[Environment] | None = None) -> None:
        """`order` None: drawn from `drawer` when the parent is expanded."""
        self.parents.append((parent, order))

    def get(self, i: int) -> Chain | None:
        """The i-th child, or None past the last one."""
        items = self.items
        while len(items) <= i and self.run_parents < len(self.parents):
            self._expand_next()
        return items[i] if i < len(items) else None

    def materialize(self) -> None:
        while self.run_parents < len(self.parents):
            self._expand_next()

    def _expand_next(self) -> None:
        assert self.closed, "children are run once every parent of the level is in"
        j = self.run_parents
        parent, order = self.parents[j]
        drawing = None
        if order is None:
            assert self.drawer is not None
            candidates = self.consumers.get(parent.envs[-1].output.name, ())
            drawing = Drawing(self.drawer, candidates)
        waiting = len(self.parents) - j - 1  # the parents after j, still in the frontier
        cap, limit = self.config.frontier_cap, self.config.max_frontier
        items, step, timed = self.items, self.steps.step, _timed()
        known = self.steps.of_state(parent.final)
        kept = 0
        for env in drawing if drawing is not None else order:
            if kept >= cap or waiting + len(items) >= limit:
                break
            child = step(parent, env, timed, known)
            if child is not None:
                items.append(child)
                kept += 1
        if drawing is not None:
            drawing.finish()
        self.parents[j] = (parent, [])  # done: let the order go
        self.run_parents += 1


class _Roots:
    """The first level of a round: its roots, already run."""

    def __init__(self, items: list[Chain]) -> None:
        self.items = items

    def get(self, i: int) -> Chain | None:
        return self.items[i] if i < len(self.items) else None


def _draw_roots(
    rng: random.Random,
    starts: Sequence[Environment],
    steps: _Steps,
    config: SearchConfig,
    seed: int,
    index: int,
    split: str,
) -> _Roots:
    roots = []
    timed = _timed()
    for env in permutation(rng, starts):
        x0 = env.sample(item_rng("races-root", env.name, split, seed, index), config.level)
        index += 1
        root = steps.step(Chain(x0, (), ()), env, timed, steps.of_state(x0))
        if root is not None:
            roots.append(root)
    return _Roots(roots)


def _next_level(
    level: _Level | _Roots,
    rng: random.Random,
    consumers: dict[str, list[Environment]],
    steps: _Steps,
    config: SearchConfig,
    checked: bool,
) -> _Level:
    """The level after `level`, whose paths are not checked (below min_size): every state of it
    expanded in order. If the new level's paths are `checked`, its parents' draws are made now
    (the checks draw too, after them) and it is left to run lazily; else it is run to its end
    here, drawing as it goes, as the plain search did."""
    if checked:
        drawer = random.Random()
        drawer.setstate(rng.getstate())
    else:
        drawer = rng
    nxt = _Level(steps, config, drawer, consumers)
    i = 0
    while (traj := level.get(i)) is not None:
        i += 1
        if checked:
            advance(rng, len(consumers.get(traj.envs[-1].output.name, ())))
        nxt.add(traj)
    nxt.closed = True
    if not checked:
        nxt.materialize()
    return nxt


class _FirstRound:
    """The first round of searches that differ only in min_size and max_size: the levels below a
    search's min_size are only expanded (no path is checked there), so every such search draws
    the same numbers and runs the same steps on them. Walked once, level by level as the
    searches ask; each search then carries on from the generator's state after the level above
    its own."""

    def __init__(
        self,
        registry: Registry,
        seed: int,
        config: SearchConfig,
        split: str,
        starts: list[Environment],
    ) -> None:
        self.held = (registry, starts)  # so that the ids in the key stay theirs
        self.rng = random.Random(f"races-search/{seed}/{split}")
        self.consumers = registry.consumers()
        self.steps = _Steps(config)
        self.config = config
        self.levels: list[_Level | _Roots] = [
            _draw_roots(self.rng, starts, self.steps, config, seed, 0, split)
        ]
        self.checked: list[bool] = [False]
        # the generator's state after the draws of level k's parents, k = 0 (the roots' order),
        # 1, 2, ...: what a search whose paths start at level k + 1 carries on from
        self.states = [self.rng.getstate()]

    def level(self, size: int) -> tuple[_Level | _Roots, Any]:
        """Level `size` and the generator's state once it is drawn (before any of its paths is
        checked)."""
        while len(self.levels) < size:
            built = len(self.levels) + 1
            if self.checked[-1]:  # asked for as a first checked level before: run it out now
                self.levels[-1].materialize()
                self.checked[-1] = False
            checked = built == size
            self.levels.append(
                _next_level(
                    self.levels[-1], self.rng, self.consumers, self.steps, self.config, checked
                )
            )
            self.checked.append(checked)
            self.states.append(self.rng.getstate())
        return self.levels[size - 1], self.states[size - 1]


_FIRST_ROUNDS: weakref.WeakValueDictionary[tuple, _FirstRound] = weakref.WeakValueDictionary()


def _first_round(
    registry: Registry, seed: int, config: SearchConfig, split: str, starts: list[Environment]
) -> _FirstRound:
    """The first round for this search: shared with the searches of this thread (their walks
    interleave only at yields, never inside a level) over the same environments, starts, seed,
    split and configuration but for the sizes (and what only checks paths)."""
    shared = replace(config, min_size=1, max_size=1, inputs_per_composite=1, constant_probes=0)
    key = (
        threading.get_ident(),
        tuple(map(id, registry)),
        tuple(map(id, starts)),
        seed,
        split,
        shared,
    )
    found = _FIRST_ROUNDS.get(key)
    if found is None:
        found = _FIRST_ROUNDS[key] = _FirstRound(registry, seed, shared, split, starts)
    return found


# ---------------------------------------------------------------------------------------------
# The search


def search(
    registry: Registry,
    seed: int = 0,
    config: SearchConfig | None = None,
    split: str = "train",
    starts: list[Environment] | None = None,
) -> Iterator[Chain]:
    """Yield quality-controlled trajectories, shortest first within each round of roots.

    Roots are drawn in rounds, one per start environment in a random order each round, so the
    stream never runs dry; stop consuming it when you have enough. Deterministic for a seed."""
    config = config or SearchConfig()
    rng = random.Random(f"races-search/{seed}/{split}")
    consumers = registry.consumers()
    starts = list(starts) if starts is not None else sorted(registry, key=lambda e: e.name)
    times: Counter[tuple[str, ...]] = Counter()  # yields per sequence of environments
    roots: set[tuple[tuple[str, ...], str]] = set()  # (sequence, rendered x_0) yielded
    with step_timer():
        first: _FirstRound | None = _first_round(registry, seed, config, split, starts)
        steps = first.steps
        level, state = first.level(config.min_size)
        rng.setstate(state)
        size = config.min_size
        index = len(starts)
        while True:
            yielded_any = False
            while level is not None:
                nxt = _Level(steps, config) if size < config.max_size else None
                i = 0
                while (traj := level.get(i)) is not None:
                    i += 1
                    names = traj.names()
                    if times[names] >= config.inputs_per_composite:
                        fresh = False  # (no need to render x_0 for the second test)
                    else:
                        key = (names, traj.envs[0].input.render(traj.x0))
                        fresh = key not in roots
                    if fresh and not _constant(traj, config, rng, steps):
                        times[names] += 1
                        roots.add(key)
                        yielded_any = True
                        yield traj
                    if nxt is not None:
                        candidates = consumers.get(traj.envs[-1].output.name, ())
                        nxt.add(traj, permutation(rng, candidates))
                if nxt is not None:
                    nxt.closed = True
                level, size = nxt, size + 1
            first = None  # the shared round lives as long as some search is still in it
            if not yielded_any and index > 50 * max(1, len(starts)):
                return  # rounds keep finding nothing new: the space is exhausted
            level = _draw_roots(rng, starts, steps, config, seed, index, split)
            index += len(starts)
            size = 1
            while size < config.min_size:  # levels below min_size are only expanded
                size += 1
                level = _next_level(level, rng, consumers, steps, config, size == config.min_size)


def take(iterator: Iterator[Any], n: int) -> list[Any]:
    out = []
    for item in iterator:
        out.append(item)
        if len(out) >= n:
            break
    return out
