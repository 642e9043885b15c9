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

`max_frontier` caps the states of one level of a round (the plain search capped the states
waiting at once, which needed the whole level above before the first child of the next).

What it costs, and what issue 30 changed to cut it (which tasks a seed gives changed with it:
tests/data/races_golden.jsonl holds the new output, and tests/test_envs_races_distribution.py
checks that 20,000 tasks keep the distribution of the search before it, commit 370123e):
- Every state's children depend on its path alone: its candidates are taken in an order drawn
  from a key derived from its path (`seeding.hashed_order`; a root's key from its seed, split,
  round and position), not from one generator shared by the whole search. So a level is run
  only as far as the searches ask (`_Level`): the size-5 search runs the states its yields
  descend from (~1 state of level 4 per 3 composites of size 5), where the search before it had
  to draw orders for all ~18,000 states of level 4 to keep one generator's sequence.
- The searches of one registry, seed and split share one walk of that tree (`_Walk`), whatever
  their sizes: `build_tasks` runs one search per size, and the levels below a size are run once.
- Constant probes come from a fixed pool of inputs per first environment (`_Probes`), and a
  chain's probe outputs extend its parent's (a trie over the sequences of environments): a
  chain's probes cost one step each, and the first output that differs from y_t decides.
- What one environment does to one state is memoized (`_Steps`): mappers are deterministic, and
  states recur (small integers, booleans, short lists): about half of the steps.
- Entries, probe outputs and chains are tuples or slotted objects: a build of 20,000 tasks
  holds ~10^5 of them, and the garbage collector's full passes over them cost ~10% of it. So
  `build_tasks` runs its searches over a walk of their own (`sized_searches`), which knows
  every search that reads it: its levels drop the states all their readers have passed, and
  its probe trie keeps no node of the largest size (~55,000 fewer objects at 20,000 tasks; the
  collector's full passes cost ~40% less). The collector's thresholds are left alone: a build
  is a generator that a task source keeps open for a whole training run, so a setting changed
  until it ends would hold for the caller's objects too.
"""

from __future__ import annotations

import _signal
import math
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

from tirl.envs.core import Chain, Environment, Environments
from tirl.envs.seeding import child_key, hashed_order, item_rng, path_key, permutation


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


class _Alarm:
    """The state of the step timer. The SIGALRM handler raises StepTimeout in whatever code
    runs when the signal lands; in a `__del__`, a weakref or garbage-collector callback, or a
    mapper's own `except Exception`, that exception is swallowed ("Exception ignored in ...")
    and the step would run on untimed and count as a success. So the alarm repeats until the
    step ends (a swallowed one is raised again), and a step it fired in counts as timed out
    however it returned. It raises only while `armed`, so a repeat landing after the step has
    ended raises nothing."""

    armed = False
    fired = False


def _expire(signum, frame):
    if _Alarm.armed:
        _Alarm.fired = True
        raise StepTimeout


def _timed_call(mapper, state: Any, timeout: float) -> Any:
    """`mapper(state)` under the step timer (`_Alarm`); StepTimeout if the alarm fired."""
    _Alarm.fired, _Alarm.armed = False, True
    signal.setitimer(signal.ITIMER_REAL, timeout, timeout)  # then again every `timeout`
    try:
        out = mapper(state)
    finally:
        _Alarm.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    if _Alarm.fired:  # its StepTimeout was swallowed on the way
        raise StepTimeout
    return out


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


_MEMO_LIMIT = 100_000  # states; past it the memo starts afresh (bounded memory)
_FAILED = (False, None, None)  # the entry of a step whose input is invalid or whose mapper raised


class _Steps:
    """What each environment does to each state, run once per distinct pair.

    Mappers are deterministic functions of their input, so a repeated (environment, state) pair
    gives the same output. States are kept by type, then by value, so True and 1 (equal in
    Python) stay apart. A run that timed out is not kept, nor one that ran longer than the
    timeout outside the timer (a later, timed step must be able to time out). An entry is
    (ran, f_e(y), text): `text` is f_e(y) rendered when the output is a valid value of its type
    that renders in at most `max_render_chars` characters, else None (the step fails whatever
    the chain). Entries are tuples and failures share one: a long build holds ~10^5 of them, and
    the garbage collector walks every container that survives (lists cost it ~20% of the build).

    The timer measures wall-clock time, so on a busy machine a fast mapper can be descheduled
    past it; a step that times out is run once more before it is dropped, so that which
    composites exist does not depend on the machine's load (a mapper that is really slow times
    out twice)."""

    def __init__(self, config: SearchConfig) -> None:
        self.config = config
        self.memo: dict[type, dict[Any, dict[Environment, tuple[bool, Any, str | None]]]] = {}
        self.states = 0

    def _run(
        self, env: Environment, state: Any, timed: bool
    ) -> tuple[tuple[bool, Any, str | None] | None, bool]:
        """(a fresh entry or None if the mapper timed out twice, whether to keep it)."""
        if env.input.check(state) is not None:
            return _FAILED, True
        timeout = self.config.step_timeout_s
        for _ in range(2 if timed else 1):
            start = 0.0 if timed else time.perf_counter()
            try:
                out = _timed_call(env.mapper, state, timeout) if timed else env.mapper(state)
            except StepTimeout:
                continue
            except Exception:  # a mapper that raises failed its step
                return _FAILED, True
            keep = timed or time.perf_counter() - start <= timeout
            return (True, out, self._text(env, out)), keep
        return None, False

    def _text(self, env: Environment, out: Any) -> str | None:
        if env.output.check(out) is not None:
            return None
        text = env.output.render(out)
        return text if len(text) <= self.config.max_render_chars else None

    def of_state(self, state: Any) -> dict[Environment, tuple[bool, Any, str | None]] | None:
        """The entries of one state, by environment (None for an unhashable state: not kept).
        Looked up once per state, then once per environment by identity: hashing a state (a
        long tuple, say) once per frontier state instead of once per candidate."""
        by_value = self.memo.get(type(state))
        if by_value is None:
            by_value = self.memo[type(state)] = {}
        try:
            found = by_value.get(state)
        except TypeError:
            return None
        if found is None:
            if self.states >= _MEMO_LIMIT:
                self.memo.clear()
                self.states = 0
                by_value = self.memo[type(state)] = {}
            found = by_value[state] = {}
            self.states += 1
        return found

    def step(
        self,
        traj: Chain,
        env: Environment,
        timed: bool,
        known: dict[Environment, tuple[bool, Any, str | None]] | None,
    ) -> Chain | None:
        """`traj` extended by `env`, or None if the step fails a step check (as `try_step`);
        `known` is `of_state(traj.final)`."""
        ys = traj.ys
        state = ys[-1] if ys else traj.x0  # (traj.final, without a property call per step)
        found = known.get(env) if known is not None else None
        if found is None:
            found, keep = self._run(env, state, timed)
            if found is None:
                return None
            if keep and known is not None:
                known[env] = found
        text = found[2]
        if text is None:
            return None
        out = found[1]
        if env.output.name == env.input.name and out == state:
            return None  # the step left the state unchanged
        if ys:
            previous = ys[-2] if len(ys) >= 2 else traj.x0
            if out == previous and type(out) is type(previous):
                return None  # undoes the step before
        texts = traj.texts
        return Chain(traj.x0, traj.envs + (env,), ys + (out,), texts + (text,) if texts else ())


def try_step(traj: Chain, env: Environment, config: SearchConfig) -> Chain | None:
    """`traj` extended by `env`, or None if the step fails a step check."""
    steps = _Steps(config)
    return steps.step(traj, env, _timed(), steps.of_state(traj.final))


# ---------------------------------------------------------------------------------------------
# Constant probes


_NO_INPUT = object()  # a pool input whose sampler raised


class _ProbeNode:
    """The probe outputs of one sequence of environments e_1..e_k: the values it gives on the
    pool inputs of e_1 that it runs on, in pool order, computed as far as asked. Its source is
    the pool itself for k = 1 (`parent` None), else its parent's outputs, each run through e_k:
    the outputs of a chain extend its parent's, and each runs once."""

    __slots__ = ("env", "parent", "values", "tried", "children")

    def __init__(self, env: Environment, parent: _ProbeNode | None) -> None:
        self.env = env
        self.parent = parent
        self.values: tuple[Any, ...] = ()  # (a tuple: the garbage collector skips it)
        self.tried = 0  # source values taken so far
        self.children: dict[Environment, _ProbeNode] = {}


class _Probes:
    """Inputs for the constant check, from a fixed pool per first environment: the pool of e is
    what e's sampler draws from `item_rng("races-probe", e.name, ...)`, at most 4 *
    constant_probes inputs (the tries the check allows). Chains that share a prefix share its
    probe outputs (a trie over the sequences of environments), so a chain's probes cost one
    step each. A walk that knows its largest size (`last`) keeps no node of that size: no
    longer chain extends it, and the few chains of that size checked again (found constant
    before, or yielded fewer than `inputs_per_composite` times) get their outputs again from
    their parent's (the same values: mappers are deterministic); a build of 20,000 tasks kept
    ~10,000 of them for the garbage collector."""

    def __init__(
        self, steps: _Steps, config: SearchConfig, seed: int, split: str, last: int | None = None
    ) -> None:
        self.steps = steps
        self.last = last
        self.wanted = config.constant_probes
        self.size = 4 * config.constant_probes
        self.key = f"probe/level{config.level}"
        self.level = config.level
        self.seed, self.split = seed, split
        self.roots: dict[Environment, _ProbeNode] = {}
        self.pools: dict[Environment, tuple[random.Random, list[Any]]] = {}

    def node(self, envs: Sequence[Environment]) -> _ProbeNode:
        first = envs[0]
        node = self.roots.get(first)
        if node is None:
            node = self.roots[first] = _ProbeNode(first, None)
        for k in range(1, len(envs)):
            env = envs[k]
            child = node.children.get(env)
            if child is None:
                child = _ProbeNode(env, node)
                if k + 1 != self.last:
                    node.children[env] = child
            node = child
        return node

    def _pool_input(self, env: Environment, i: int) -> Any:
        """Pool input i of `env`: the i-th draw of its sampler from the pool's own generator
        (drawn in order, as far as asked)."""
        found = self.pools.get(env)
        if found is None:
            rng = item_rng("races-probe", f"{env.name}/{self.key}", self.split, self.seed, 0)
            found = self.pools[env] = (rng, [])
        rng, pool = found
        while len(pool) <= i:
            try:
                pool.append(env.sample(rng, self.level))
            except Exception:  # a sampler that raises spends its try
                pool.append(_NO_INPUT)
        return pool[i]

    def _more(self, node: _ProbeNode) -> bool:
        """Add one more output to `node`; False when its source is spent. Each step runs as
        `core.run_chain` runs it (an invalid input or a mapper that raises ends the probe),
        untimed like the probes before, and outside the step memo: the trie already runs each
        (sequence, pool input) once, and probe states rarely recur."""
        env = node.env
        while True:
            parent = node.parent
            if parent is None:
                if node.tried >= self.size:
                    return False
                x = self._pool_input(env, node.tried)
                node.tried += 1
                if x is _NO_INPUT:
                    continue
            else:
                if node.tried >= len(parent.values) and not self._more(parent):
                    return False
                x = parent.values[node.tried]
                node.tried += 1
            try:
                if env.input.check(x) is not None:
                    continue
                value = env.mapper(x)
            except Exception:  # a check or a mapper that raises: run_chain would raise too
                continue
            node.values += (value,)
            return True

    def constant(self, traj: Chain) -> bool:
        """True if the chain maps other inputs to the same final value too (a degenerate path):
        its outputs on the first `constant_probes` pool inputs it runs on all equal y_t. Other
        inputs may not survive every step's constraints; if none does, the last step alone is
        probed on inputs of its own. Outputs are computed one at a time and the first that
        differs from y_t decides (most chains are not constant: one probe step each)."""
        final, wanted = traj.final, self.wanted
        for envs in (traj.envs, traj.envs[-1:]):
            node = self.node(envs)
            i = 0
            while i < wanted and (i < len(node.values) or self._more(node)):
                if node.values[i] != final:
                    return False
                i += 1
            if i:
                return True
        return False


# ---------------------------------------------------------------------------------------------
# The walk: rounds of roots, levels of states


_SEARCH, _BELOW = 0, 1  # the readers of a level: the search of its size, the level below it
_DROP_AT = 256  # states a level drops at once (each drop moves the states it keeps)


class _States:
    """The states of one level of a round, run as far as asked: state i is `items[i - base]`,
    its key `key(i)`. In a walk that knows its readers (`_Walk.sizes`: the searches of
    `build_tasks`, one per size), a level drops the states that every reader has passed: each
    reads the states in order (the search of the level's size, and the level below, which
    expands them as parents), so none is asked for again. A build of 20,000 tasks ran ~26,000
    states and held them all (with their tuples, ~40% of what the garbage collector walked on
    each full pass); it holds the few thousand between its readers now."""

    def __init__(self, readers: list[float] | None) -> None:
        self.items: list[Chain] = []
        self.keys: list[bytes] = []  # a root's key; a child's parent's key, with `names`
        self.names: list[str] = []  # a child's environment (`_Level`)
        self.base = 0  # states dropped
        self.read = readers  # per reader, the states it has passed (None: keep every state)

    def take(self, i: int, reader: int | None) -> Chain | None:
        """State i if run, else None; `reader` has passed the states before i."""
        j = i - self.base
        if j < 0:
            raise RuntimeError(f"state {i} of a level was dropped before {reader} read it")
        items = self.items
        found = items[j] if j < len(items) else None
        read = self.read
        if read is not None and reader is not None:
            read[reader] = i
            if not i & 63:  # (now and then: a drop needs the slowest reader)
                self._drop()
        return found

    def key(self, i: int) -> bytes:
        """The key of state i, which orders its children's candidates."""
        return self.keys[i - self.base]

    def passed(self, reader: int, i: float) -> None:
        """`reader` will not ask for states before i again (math.inf: for none of them)."""
        if self.read is not None:
            self.read[reader] = i
            self._drop()

    def _drop(self) -> None:
        """Drop the states every reader has passed, once there are `_DROP_AT` of them."""
        low = min(self.read)
        if low - self.base >= _DROP_AT:
            drop = int(min(low - self.base, len(self.items)))
            del self.items[:drop]
            del self.keys[:drop]
            del self.names[:drop]
            self.base += drop


class _Roots(_States):
    """Level 1 of a round: one root per start environment, in the round's random order, each
    x_0 from its own `item_rng`; run (step-checked) as far as asked."""

    def __init__(self, walk: _Walk, round_: int) -> None:
        super().__init__(walk.readers(1))
        self.walk = walk
        n = len(walk.starts)
        self.order = permutation(
            item_rng("races-round", "roots", walk.split, walk.seed, round_), walk.starts
        )
        self.first_index = round_ * n  # x_0 of the i-th root: index first_index + i
        self.round = round_
        self.next = 0

    def get(self, i: int, counts: Counter[str], reader: int | None = None) -> Chain | None:
        items, walk = self.items, self.walk
        while self.base + len(items) <= i and self.next < len(self.order):
            j = self.next
            self.next += 1
            env = self.order[j]
            rng = item_rng("races-root", env.name, walk.split, walk.seed, self.first_index + j)
            x0 = env.sample(rng, walk.config.level)
            start = Chain(x0, (), (), (env.input.render(x0),))
            root = walk.steps.step(start, env, _timed(), walk.steps.of_state(x0))
            counts["steps"] += 1
            if root is None:
                counts["steps_rejected"] += 1
                continue
            items.append(root)
            self.keys.append(path_key("races-state", walk.split, walk.seed, self.round, j))
        return self.take(i, reader)


class _Level(_States):
    """Level k > 1 of a round: the children of level k - 1's states, parent by parent, each
    parent's candidates in an order drawn from its own key (`seeding.hashed_order`; the key is
    derived from the state's path), up to `frontier_cap` kept per parent and `max_frontier` per
    level. Run as far as asked: a search for size 5 runs the states its yields descend from,
    not whole levels."""

    def __init__(self, walk: _Walk, above: _Level | _Roots, size: int) -> None:
        super().__init__(walk.readers(size))
        self.walk = walk
        self.above = above
        self.next = 0  # the next parent to expand
        self.done = False

    def get(self, i: int, counts: Counter[str], reader: int | None = None) -> Chain | None:
        items = self.items
        while self.base + len(items) <= i and not self.done:
            self._expand_next(counts)
        return self.take(i, reader)

    def key(self, i: int) -> bytes:
        """The key of state i, derived from its parent's when asked (`seeding.child_key`): most
        states are never expanded (those of the largest size, and most below it): at 20,000
        tasks ~10,000 keys are asked for, where every one of ~34,000 states was hashed."""
        j = i - self.base
        return child_key(self.keys[j], self.names[j])

    def _expand_next(self, counts: Counter[str]) -> None:
        j = self.next
        above = self.above
        parent = above.get(j, counts, _BELOW)
        if parent is None:
            self.done = True
            return
        self.next = j + 1
        walk = self.walk
        cap, limit = walk.config.frontier_cap, walk.config.max_frontier
        key = above.key(j)
        candidates = walk.consumers.get(parent.envs[-1].output.name, ())
        items, keys, names = self.items, self.keys, self.names
        step, timed = walk.steps.step, _timed()
        known = walk.steps.of_state(parent.final)
        kept = tried = 0
        for env in hashed_order(key, candidates):
            if kept >= cap:
                break
            tried += 1
            child = step(parent, env, timed, known)
            if child is not None:
                items.append(child)
                keys.append(key)
                names.append(env.name)
                kept += 1
                if self.base + len(items) >= limit:
                    self.done = True
                    break
        counts["steps"] += tried
        counts["steps_rejected"] += tried - kept


class _Round:
    """One round: its roots and the levels below them, built as the searches reach them."""

    def __init__(self, walk: _Walk, round_: int) -> None:
        self.levels: list[_Level | _Roots] = [_Roots(walk, round_)]
        self.walk = walk

    def level(self, size: int) -> _Level | _Roots:
        while len(self.levels) < size:
            self.levels.append(_Level(self.walk, self.levels[-1], len(self.levels) + 1))
        return self.levels[size - 1]


class _Walk:
    """What the searches over one registry, seed, split and start environments share, whatever
    their sizes and path checks: the rounds (each state's children depend on its path alone, so
    every search sees the same tree), the step memo and the probe trie. `build_tasks` runs one
    search per size over one walk: a size-5 search runs the levels 1-4 that the smaller sizes
    run anyway."""

    def __init__(
        self,
        registry: Environments,
        seed: int,
        config: SearchConfig,
        split: str,
        starts: list[Environment],
        sizes: frozenset[int] | None = None,
    ) -> None:
        self.registry, self.starts = registry, starts  # held: the ids in the key stay theirs
        self.seed, self.split, self.config = seed, split, config
        self.sizes = sizes  # of its searches, one each, when it knows them all (`sized_searches`)
        self.consumers = registry.consumers()
        self.steps = _Steps(config)
        self.probes = _Probes(self.steps, config, seed, split, max(sizes) if sizes else None)
        self.rounds: weakref.WeakValueDictionary[int, _Round] = weakref.WeakValueDictionary()

    def readers(self, size: int) -> list[float] | None:
        """The readers of a level of this size that have yet to pass its states (`_States`):
        None (keep every state) unless the walk knows its searches; a reader that will never
        come has passed them all."""
        if self.sizes is None:
            return None
        return [0 if size in self.sizes else math.inf, 0 if size < max(self.sizes) else math.inf]

    def round(self, i: int) -> _Round:
        """Round i (kept while some search is in it)."""
        found = self.rounds.get(i)
        if found is None:
            found = self.rounds[i] = _Round(self, i)
        return found


_WALKS: weakref.WeakValueDictionary[tuple, _Walk] = weakref.WeakValueDictionary()


def _walk(
    registry: Environments, seed: int, config: SearchConfig, split: str, starts: list[Environment]
) -> _Walk:
    """The walk for this search: shared with the searches of this thread (their pulls interleave
    only at yields) over the same environments, starts, seed, split and configuration but for
    the sizes and the number of inputs per composite."""
    shared = replace(config, min_size=1, max_size=1, inputs_per_composite=1)
    key = (threading.get_ident(), tuple(map(id, registry)), tuple(map(id, starts)), seed, split)
    key += (shared,)
    found = _WALKS.get(key)
    if found is None:
        found = _WALKS[key] = _Walk(registry, seed, shared, split, starts)
    return found


# ---------------------------------------------------------------------------------------------
# The search


def search(
    registry: Environments,
    seed: int = 0,
    config: SearchConfig | None = None,
    split: str = "train",
    starts: list[Environment] | None = None,
    counts: Counter[str] | None = None,
) -> Iterator[Chain]:
    """Yield quality-controlled trajectories, shortest first within each round of roots.

    Roots are drawn in rounds, one per start environment in a random order each round, so the
    stream never runs dry; stop consuming it when you have enough. Deterministic for a seed.
    `counts`, if given, is incremented as the search goes: "steps" attempted and
    "steps_rejected" by a step check (in the states this search was the first to expand),
    "paths" checked, "paths_duplicate" (a composite yielded enough times, or from the same
    x_0), "paths_constant", and "yielded"."""
    config = config or SearchConfig()
    starts = list(starts) if starts is not None else sorted(registry, key=lambda e: e.name)
    counts = counts if counts is not None else Counter()
    with step_timer():
        yield from _paths(_walk(registry, seed, config, split, starts), config, counts)


def sized_searches(
    registry: Environments,
    seed: int,
    config: SearchConfig,
    split: str,
    sizes: Sequence[int],
    counts: Counter[str] | None = None,
) -> dict[int, Iterator[Chain]]:
    """One search per size (`config` with min_size = max_size = size), as `search` gives them,
    over one walk of their own: it knows every search that reads it, so its levels drop the
    states that all of them have passed (`_States`), where a shared walk (`_walk`) keeps every
    state for a search that may come later. Each search times its steps from its first pull,
    as `search` does."""
    counts = counts if counts is not None else Counter()
    starts = sorted(registry, key=lambda e: e.name)
    shared = replace(config, min_size=1, max_size=1, inputs_per_composite=1)
    walk = _Walk(registry, seed, shared, split, starts, frozenset(sizes))
    return {s: _timed_paths(walk, replace(config, min_size=s, max_size=s), counts) for s in sizes}


def _timed_paths(walk: _Walk, config: SearchConfig, counts: Counter[str]) -> Iterator[Chain]:
    with step_timer():
        yield from _paths(walk, config, counts)


def _paths(walk: _Walk, config: SearchConfig, counts: Counter[str]) -> Iterator[Chain]:
    """The paths of `config`'s sizes that pass the path checks, round by round (`search`)."""
    times: dict[tuple[str, ...], int] = {}  # yields per sequence of environments
    roots: set[tuple[tuple[str, ...], str]] = set()  # (sequence, rendered x_0) yielded
    constant = walk.probes.constant
    several = config.inputs_per_composite > 1
    round_ = 0
    while True:
        current = walk.round(round_)  # held while this search is in it
        yielded_any = False
        for size in range(config.min_size, config.max_size + 1):
            level = current.level(size)
            i = 0
            while (traj := level.get(i, counts, _SEARCH)) is not None:
                i += 1
                counts["paths"] += 1
                names = traj.names()
                if times.get(names, 0) >= config.inputs_per_composite:
                    counts["paths_duplicate"] += 1
                    continue
                if several:  # (with one input per composite, `times` says it all)
                    key = (names, traj.texts[0])
                    if key in roots:
                        counts["paths_duplicate"] += 1
                        continue
                if constant(traj):
                    counts["paths_constant"] += 1
                    continue
                times[names] = times.get(names, 0) + 1
                if several:
                    roots.add(key)
                yielded_any = True
                counts["yielded"] += 1
                yield traj
            level.passed(_SEARCH, math.inf)
        if not yielded_any and round_ >= 50:
            return  # rounds keep finding nothing new: the space is exhausted
        round_ += 1


def take(iterator: Iterator[Any], n: int) -> list[Any]:
    out = []
    for item in iterator:
        out.append(item)
        if len(out) >= n:
            break
    return out
