"""Randomized breadth-first search for composite environments, with quality control (RACES §2.3).

From a root x_0 ~ G_{e_1}, the search extends trajectories level by level: for the frontier state
y_t it takes the domain-compatible candidates C(y_t) = {e : X_e = type(y_t)} in random order and
keeps up to `frontier_cap` of them that pass the step checks, so short compositions are explored
first and no high-degree type swamps the pool. Every kept step really ran: each trajectory
records x_0, e_1..e_t and y_1..y_t.

Step checks (a step is dropped when it fails one): the state is a valid input of the candidate
(its constraints); the mapper returns within `step_timeout_s` without raising; the output is a
valid value of its type; the step changes the state; it does not undo the previous step
(y_{t+1} != y_{t-1}); the new state renders in at most `max_render_chars` characters.
Path checks, before a trajectory is yielded: its size is within [min_size, max_size]; its
sequence of environments was yielded fewer than `inputs_per_composite` times before, never from
the same x_0 (by default each composite once; more instances of one composite, each from a fresh
root, are what a small set of environments needs to give more than a handful of tasks); and its
output is not constant: the same chain run on `constant_probes` other inputs must not give the
same y_t every time.
"""

from __future__ import annotations

import random
import signal
import threading
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tirl.envs.core import Chain, Environment, Registry, run_chain
from tirl.envs.seeding import item_rng


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


def try_step(traj: Chain, env: Environment, config: SearchConfig) -> Chain | None:
    """`traj` extended by `env`, or None if the step fails a step check."""
    state = traj.final
    if env.input.check(state) is not None:
        return None
    timed = signal.getsignal(signal.SIGALRM) is _expire
    try:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, config.step_timeout_s)
        out = env.mapper(state)
    except Exception:  # a mapper that raises or runs too long (StepTimeout) failed its step
        return None
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
    if env.output.check(out) is not None:
        return None
    if env.output.name == env.input.name and out == state:
        return None  # the step left the state unchanged
    previous = traj.ys[-2] if len(traj.ys) >= 2 else (traj.x0 if traj.ys else None)
    if traj.ys and out == previous and type(out) is type(previous):
        return None  # undoes the step before
    if len(env.output.render(out)) > config.max_render_chars:
        return None
    return Chain(traj.x0, traj.envs + (env,), traj.ys + (out,))


def _constant(traj: Chain, config: SearchConfig, rng: random.Random) -> bool:
    """True if the chain maps other inputs to the same final value too (a degenerate path).
    Other roots may not survive every step's constraints; if none does, the last step alone is
    probed on inputs of its own."""
    for envs in (traj.envs, traj.envs[-1:]):
        outputs = []
        for _ in range(4 * config.constant_probes):
            if len(outputs) >= config.constant_probes:
                break
            try:
                outputs.append(run_chain(envs, envs[0].sample(rng, config.level)))
            except Exception:
                continue
        if outputs:
            return all(o == traj.final for o in outputs)
    return False


def _root(
    env: Environment, config: SearchConfig, seed: int, index: int, split: str
) -> Chain | None:
    rng = item_rng("races-root", env.name, split, seed, index)
    return try_step(Chain(env.sample(rng, config.level), (), ()), env, config)


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
    index = 0
    with step_timer():
        while True:
            frontier: deque[Chain] = deque()
            for env in rng.sample(starts, len(starts)):
                root = _root(env, config, seed, index, split)
                index += 1
                if root is not None:
                    frontier.append(root)
            yielded_any = False
            while frontier:
                traj = frontier.popleft()
                if traj.size >= config.min_size:
                    names = traj.names()
                    root = (names, traj.envs[0].input.render(traj.x0))
                    fresh = times[names] < config.inputs_per_composite and root not in roots
                    if fresh and not _constant(traj, config, rng):
                        times[names] += 1
                        roots.add(root)
                        yielded_any = True
                        yield traj
                if traj.size >= config.max_size:
                    continue
                candidates = consumers.get(traj.envs[-1].output.name, [])
                kept = 0
                for env in rng.sample(candidates, len(candidates)):
                    if kept >= config.frontier_cap or len(frontier) >= config.max_frontier:
                        break
                    nxt = try_step(traj, env, config)
                    if nxt is not None:
                        frontier.append(nxt)
                        kept += 1
            if not yielded_any and index > 50 * max(1, len(starts)):
                return  # rounds keep finding nothing new: the space is exhausted


def take(iterator: Iterator[Any], n: int) -> list[Any]:
    out = []
    for item in iterator:
        out.append(item)
        if len(out) >= n:
            break
    return out
