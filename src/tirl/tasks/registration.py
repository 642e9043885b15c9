"""The registry of task sources and its decorator: what a source's module imports to register.

A source is registered with its parameters as a dataclass (`@register_source("name")` on a
class whose fields are its config keys). This module holds only the registry, so the built-in
sources (`tirl.tasks.sources`) import it and nothing that reads it: the code that looks a
source up by name (`make_source`, `Mixture`, `source_names`) is `tirl.tasks.registry`, which
imports the built-in sources. The dependency runs one way, readers -> built-in sources -> this
module. Reading `SOURCES` from here finds the built-in sources only once something has imported
`tirl.tasks.registry` (or `tirl.tasks.sources`): read it from there.
"""

from __future__ import annotations

import dataclasses

from tirl.registry import Registry


def _check_source(name: str, cls: type) -> None:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"task source {name!r} must be a dataclass of its parameters")


# name -> the source's parameter dataclass (it builds the source).
SOURCES: Registry[type] = Registry("task source", check=_check_source)

# Class decorator: register a source dataclass under a name. Its instances are task sources
# (they have `item`, `size`, `demonstration` and `name`).
register_source = SOURCES.register
