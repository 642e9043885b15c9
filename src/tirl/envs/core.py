"""Atomic environments, their registry, and composition (RACES §2.1–2.2).

An environment is e = (G_e, f_e, D_e, V_e) with a type signature tau_e = (X_e, Y_e):

- G_e, the sampler: `sample(rng, level)`; by default the input type's own sampler;
- f_e, the mapper: a deterministic, self-contained Python function (its source is the code
  rendering, `code`, so tool-use trajectories can be synthesized without a teacher);
- D_e, the descriptor: `instruction` says what f_e does to "the input"; `describe(x)` adds the
  rendered input and the answer format of Y_e;
- V_e, the verifier: `verify(answer_text, gold)`: the answer is parsed strictly with Y_e (an
  unreadable answer fails closed, with the reason) and compared with `equal` (Y_e's equality
  unless the environment brings its own check).

Library modules define environments with the `atomic` decorator, which registers them in the
global `REGISTRY` under "<domain>.<function name>". `Composite` chains environments whose types
match and records the trajectory pi_t = (x_0; e_1..e_t; y_1..y_t).
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import operator
import random
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tirl.envs.types import AnswerError, Type
from tirl.plugins import load_installed
from tirl.registry import Registry as NamedRegistry


class EnvironmentError_(ValueError):
    """A malformed environment definition or composition; the message names it."""


@dataclass(frozen=True, eq=False)
class Environment:
    name: str
    domain: str
    input: Type
    output: Type
    instruction: str
    mapper: Callable[[Any], Any]
    sampler: Callable[[random.Random, int], Any] | None = None
    equal: Callable[[Any, Any], bool] | None = None  # V_e's comparison; default output.equal
    levels: int = 3

    @property
    def signature(self) -> tuple[str, str]:
        """tau_e = (X_e, Y_e), by kind: what the type graph matches on."""
        return self.input.name, self.output.name

    def sample(self, rng: random.Random, level: int = 1) -> Any:
        """G_e: a valid input (the sampler's value must pass the input type's check)."""
        if self.sampler is not None:
            return self.sampler(rng, level)
        return self.input.sample(rng, level)

    def apply(self, x: Any) -> Any:
        """f_e on a value that must be a valid input; raises ValueError if it is not."""
        reason = self.input.check(x)
        if reason is not None:
            raise ValueError(f"{self.name}: invalid input ({reason})")
        return self.mapper(x)

    def describe(self, x: Any) -> str:
        """D_e: the problem for one input, with the answer format it expects."""
        return (
            f"{self.instruction}\n\nInput: {self.input.render(x)}\n\n"
            f"Answer with {self.output.answer_format}."
        )

    def verify(self, answer: str, gold: Any) -> tuple[bool, str]:
        """V_e: (correct, reason). Never raises for a bad answer: it fails closed."""
        try:
            value = self.output.parse(answer)
        except AnswerError as e:
            return False, str(e)
        return self.verify_value(value, gold)

    def verify_value(self, value: Any, gold: Any) -> tuple[bool, str]:
        same = self.equal(value, gold) if self.equal else self.output.equal(value, gold)
        return (True, "") if same else (False, "the value differs from the expected one")

    @property
    def code(self) -> str:
        """The mapper as standalone Python source (a function named `f`)."""
        return mapper_source(self.mapper)


def mapper_source(fn: Callable) -> str:
    """Source of `fn` without its decorators, renamed to `f`. Mappers import what they use
    inside their body, so this text runs on its own."""
    src = textwrap.dedent(inspect.getsource(fn))
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    head = lines[start].replace(f"def {fn.__name__}(", "def f(", 1)
    return "\n".join([head, *lines[start + 1 :]]) + "\n"


def run_source(source: str, x: Any) -> Any:
    """Execute a code rendering on `x` in a fresh namespace."""
    namespace: dict[str, Any] = {}
    exec(compile(source, "<environment code>", "exec"), namespace)
    return namespace["f"](x)


def _check_environment(name: str, env: Environment) -> None:
    for role, t in (("input", env.input), ("output", env.output)):
        if not isinstance(t, Type):
            raise EnvironmentError_(f"environment {name!r}: its {role} type {t!r} is not a Type")
    if not env.instruction.strip():
        raise EnvironmentError_(f"environment {name!r} has an empty instruction")


class Environments:
    """Environments by name (held in the one `tirl.registry.Registry`, so a name is registered
    once and a plugin's environments sit beside the library's), with the type graph the
    composition search walks. Asking for a name that does not exist is an error with the
    closest names in the message. Read the registry with the library in it from
    `tirl.envs.registry`. A read by name or of the whole loads installed plugins first, as
    every registry's does; `find` and `accepting`, which the search calls by the million, do
    not (a search has read the registry before)."""

    def __init__(self) -> None:
        self._named = NamedRegistry[Environment]("environment", check=_check_environment)
        self._accepting: dict[frozenset[str], tuple[Environment, ...]] = {}
        self._kinds: tuple[tuple[Environment, ...], tuple[str, ...]] | None = None

    @property
    def _envs(self) -> Mapping[str, Environment]:
        return self._named.entries()  # read-only, with C-level lookups for the search's loops

    def add(self, env: Environment) -> Environment:
        self._named.add(env.name, env)
        self.__dict__.get("_accepting", {}).clear()
        self._kinds = None
        return env

    def get(self, name: str) -> Environment:
        load_installed()
        try:
            return self._envs[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._envs, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise KeyError(f"no environment named {name!r}{hint}") from None

    def __contains__(self, name: str) -> bool:
        load_installed()
        return name in self._envs

    def find(self, names: Iterable[str]) -> list[Environment] | None:
        """The environments of `names` in order, or None if one is unknown: one C-level pass,
        where `get` per name costs a Python call each (scoring looks up every task's steps)."""
        found = list(map(self._envs.get, names))
        return None if None in found else found

    def __iter__(self):
        load_installed()
        return iter(self._envs.values())

    def __len__(self) -> int:
        load_installed()
        return len(self._envs)

    def names(self) -> list[str]:
        load_installed()
        return sorted(self._envs)

    def domains(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self._envs.values():
            counts[e.domain] = counts.get(e.domain, 0) + 1
        return dict(sorted(counts.items()))

    def consumers(self) -> dict[str, list[Environment]]:
        """The type graph, by input kind: which environments accept a value of each kind."""
        graph: dict[str, list[Environment]] = {}
        for e in self._envs.values():
            graph.setdefault(e.input.name, []).append(e)
        return graph

    def accepting(self, kinds: frozenset[str]) -> tuple[Environment, ...]:
        """The environments whose input is of one of `kinds`, in registration order (kept per
        set of kinds: SELECT asks for the same few sets again and again)."""
        cache = self.__dict__.setdefault("_accepting", {})  # (a registry unpickled from before)
        found = cache.get(kinds)
        if found is None:
            # (the input kinds listed once per registry, then filtered at C level: a set of
            # kinds seen for the first time cost ~25 us over ~460 environments)
            listed = self.__dict__.get("_kinds")
            if listed is None:
                envs = tuple(self._envs.values())
                listed = self._kinds = (envs, tuple(e.input.name for e in envs))
            envs, inputs = listed
            found = cache[kinds] = tuple(itertools.compress(envs, map(kinds.__contains__, inputs)))
        return found

    def type_graph(self) -> dict[tuple[str, str], int]:
        """How many environments map each input kind to each output kind: the edges of the
        type graph whose paths are the composites."""
        edges: dict[tuple[str, str], int] = {}
        for e in self._envs.values():
            edges[e.signature] = edges.get(e.signature, 0) + 1
        return dict(sorted(edges.items()))

    def subset(self, names: Iterable[str]) -> Environments:
        sub = Environments()
        for n in names:
            sub.add(self.get(n))
        return sub


REGISTRY = Environments()


def atomic(
    domain: str,
    input: Type,
    output: Type,
    instruction: str,
    *,
    sampler: Callable[[random.Random, int], Any] | None = None,
    equal: Callable[[Any, Any], bool] | None = None,
    registry: Environments | None = None,
) -> Callable[[Callable], Callable]:
    """Register the decorated mapper as the environment "<domain>.<function name>"."""

    def wrap(fn: Callable) -> Callable:
        env = Environment(
            name=f"{domain}.{fn.__name__}",
            domain=domain,
            input=input,
            output=output,
            instruction=instruction,
            mapper=fn,
            sampler=sampler,
            equal=equal,
        )
        (registry if registry is not None else REGISTRY).add(env)
        return fn

    return wrap


_NAME = operator.attrgetter("name")


@dataclass(frozen=True, slots=True)
class Chain:
    """pi_t = (x_0; e_1..e_t; y_1..y_t) with y_i = f_{e_i}(y_{i-1}), y_0 = x_0 (§2.3).

    `texts`, when not empty, holds the rendered states x_0, y_1..y_t: the search renders every
    state for its length check, and a task made from the chain reuses those texts instead of
    rendering each state again (`rendered`). Not part of the chain's identity."""

    x0: Any
    envs: tuple[Environment, ...]
    ys: tuple[Any, ...]
    texts: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.envs)

    @property
    def final(self) -> Any:
        return self.ys[-1] if self.ys else self.x0

    def extend(self, env: Environment) -> Chain:
        """extend(pi_t, e) = (x_0; e_1..e_t, e; y_1..y_t, f_e(y_t)); raises if e cannot run."""
        return Chain(self.x0, self.envs + (env,), self.ys + (env.apply(self.final),))

    def names(self) -> tuple[str, ...]:
        return tuple(map(_NAME, self.envs))

    def rendered(self) -> tuple[str, ...]:
        """The states x_0, y_1..y_t as their types render them."""
        if len(self.texts) == len(self.envs) + 1:
            return self.texts
        first = self.envs[0].input.render(self.x0)
        return (first, *(e.output.render(y) for e, y in zip(self.envs, self.ys)))


@dataclass(frozen=True, eq=False)
class Composite:
    """F_{pi_t} = f_{e_t} o … o f_{e_1}: again an environment-like object with signature
    (X_{e_1}, Y_{e_t}) (the compositional closure of §2.2). Construction refuses a chain whose
    kinds do not match."""

    envs: tuple[Environment, ...]
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not self.envs:
            raise EnvironmentError_("a composite needs at least one environment")
        for a, b in zip(self.envs, self.envs[1:]):
            if a.output.name != b.input.name:
                raise EnvironmentError_(
                    f"cannot compose {a.name} -> {b.name}: {a.name} returns {a.output.name}"
                    f" but {b.name} takes {b.input.name}"
                )
        if not self.name:
            object.__setattr__(self, "name", " -> ".join(e.name for e in self.envs))

    @property
    def input(self) -> Type:
        return self.envs[0].input

    @property
    def output(self) -> Type:
        return self.envs[-1].output

    @property
    def signature(self) -> tuple[str, str]:
        return self.input.name, self.output.name

    def run(self, x0: Any) -> Chain:
        traj = Chain(x0, (), ())
        for e in self.envs:
            traj = traj.extend(e)
        return traj

    def apply(self, x0: Any) -> Any:
        return self.run(x0).final

    def then(self, other: Environment | Composite) -> Composite:
        more = other.envs if isinstance(other, Composite) else (other,)
        return Composite(self.envs + tuple(more))


def run_chain(envs: Sequence[Environment], x0: Any) -> Any:
    """(f_{e_k} o … o f_{e_1})(x_0), or raises if some step cannot run (used by SORT/SELECT,
    whose predicted chains need not type-check)."""
    value = x0
    for e in envs:
        value = e.apply(value)
    return value
