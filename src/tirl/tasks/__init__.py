"""The one task interface (`tirl.tasks.base`) and the registry of task sources.

`Mixture`, `make_source` and `source_names` live in `tirl.tasks.registry`, which imports every
built-in source (RACES, benchmark files, ...); they are fetched from it on first use
(`__getattr__`), so importing `tirl.tasks.base` or this package for `Task` stays as light as
the interface. A module of `tirl.tasks` imports from the module that defines a name (a source
registers through `tirl.tasks.registration`), never from this package.
"""

from tirl.tasks.base import Code, DemoPart, Score, Task, TaskSource, Think
from tirl.tasks.registration import register_source

_READERS = ("Mixture", "make_source", "source_names")  # from tirl.tasks.registry

__all__ = [
    "Code",
    "DemoPart",
    "Mixture",
    "Score",
    "Task",
    "TaskSource",
    "Think",
    "make_source",
    "register_source",
    "source_names",
]


def __getattr__(name: str):
    if name in _READERS:
        from tirl.tasks import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'tirl.tasks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_READERS})
