"""The one registry every extension point shares: a name -> entry mapping with a decorator.

Advantage estimators, policy losses, rewards, task sources, protocols, engines and sandbox
transports are each a `Registry`. An entry is added by decorating it,

    @POLICY_LOSSES.register("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, mask, **params): ...

(or by the extension point's own decorator where an entry is more than the decorated object:
`register_engine` wraps a factory in an `EngineKind`). An entry of the wrong type is refused
when it is added (`entry_type`), not when a run first uses it.

from a file of tirl's or a plugin (`tirl.plugins`), and looked up by the name a config gives.
A config field checks its value with `registry.problem(name)`, so the accepted names are the
live registry's, never a copied list. A registry reads like a read-only dict (`name in r`,
`r[name]`, `sorted(r)`).

A registry loads nothing by name. Where the entries sit in the registry's own module
(estimators, losses, rewards, engines) there is nothing to load; where each is a file of its
own (task sources, tools, sandbox transports) the extension point is three parts, and the
dependency runs one way, readers -> built-in entries -> registry:

- the registry and its decorator, in a small module the entries import to register
  (`tirl.tasks.registration`, `tirl.tools.base`, `tirl.sandbox.registration`);
- the built-in entries, one package or module that imports them all (`tirl.tasks.sources`,
  `tirl.tools.builtins`, `tirl.sandbox.transports`); heavy dependencies (torch, Ray, a
  dataset library) are imported by an entry when it runs, not by its module;
- the code that reads the registry (`tirl.tasks.registry`, `tirl.tools.toolset`,
  `tirl.sandbox.config`), which imports the built-in entries with a plain `import` and
  re-exports the registry, so reading it from there always finds them.

The one thing a read still loads is the installed plugins (`tirl.plugins.load_installed`, on
the first read): a plugin lives outside tirl and is found by its entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from tirl.plugins import load_installed

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Named entries of one kind (`kind` is how messages name it: "policy loss", "engine")."""

    def __init__(
        self,
        kind: str,
        check: Callable[[str, T], None] | None = None,
        entry_type: type | None = None,
    ) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._check = check  # raises TypeError for an entry that cannot serve
        self._entry_type = entry_type  # what every entry must be an instance of

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: add the decorated entry under `name` (a name is registered once)."""

        def add(entry: T) -> T:
            self.add(name, entry)
            return entry

        return add

    def add(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if self._entry_type is not None and not isinstance(entry, self._entry_type):
            raise TypeError(
                f"{self.kind} {name!r} must be a {self._entry_type.__name__}, got"
                f" {type(entry).__name__} (see docs/extending.md for how to register one)"
            )
        if self._check is not None:
            self._check(name, entry)
        self._entries[name] = entry

    def entries(self) -> Mapping[str, T]:
        """A read-only view of the entries by name, as registered so far (no plugin loading on
        each read: for a hot loop that looks names up by the thousand)."""
        return MappingProxyType(self._entries)

    def unregister(self, name: str) -> None:
        """Remove `name` (tests, and a plugin that replaces its own entry)."""
        self._entries.pop(name, None)

    def _load_plugins(self) -> None:
        load_installed()  # installed plugins register before any name is looked up (once)

    def get_entry(self, name: str) -> T:
        """The entry under `name`; KeyError listing the registered names otherwise."""
        if name not in self:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(self)}")
        return self._entries[name]

    def problem(self, name: str) -> str | None:
        """Why `name` is not a registered entry (a config field's check), or None."""
        if name in self:
            return None
        return f"must name a registered {self.kind} ({', '.join(self)})"

    def __getitem__(self, name: str) -> T:
        self._load_plugins()
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self)})"
