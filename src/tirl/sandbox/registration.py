"""The registry of sandbox transports: what a transport's module imports to register.

A transport is a factory `(SandboxConfig) -> SandboxClient` registered by name
(`@SANDBOX_TRANSPORTS.register("local")`). A transport with settings of its own declares them
as a dataclass of `tirl.config.setting` fields and registers with
`@register_transport("name", options=TheirSettings)`: its factory is then
`(SandboxConfig, settings) -> SandboxClient`, and the config's `sandbox.options` is read into
that dataclass when the config loads, so a bad key, type or range is one line before any work,
and nothing in `SandboxConfig` changes for a new transport.

This module holds only the registry, so the built-in transports (`tirl.sandbox.transports`)
import it and nothing that reads it: the code that checks `sandbox.kind` and builds the client
(`tirl.sandbox.config`: `SandboxConfig`, `make_sandbox`) imports the built-in transports. The
dependency runs one way, readers -> built-in transports -> this module. Reading
`SANDBOX_TRANSPORTS` from here finds the built-in ones only once something has imported
`tirl.sandbox.config`: read it from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, is_dataclass
from typing import TYPE_CHECKING, Any

from tirl.registry import Registry
from tirl.sandbox.api import SandboxClient

if TYPE_CHECKING:  # an annotation only: the config's module imports the transports
    from tirl.sandbox.config import SandboxConfig

SandboxFactory = Callable[["SandboxConfig"], SandboxClient]

SANDBOX_TRANSPORTS: Registry[SandboxFactory] = Registry("sandbox transport", entry_type=Callable)


@dataclass(frozen=True)
class Transport:
    """A transport with settings of its own: a `SandboxFactory` that reads `sandbox.options`
    into the dataclass `options` and hands it to `build`."""

    build: Callable[[SandboxConfig, Any], SandboxClient]
    options: type

    def __call__(self, cfg: SandboxConfig) -> SandboxClient:
        return self.build(cfg, cfg.transport_options())


def register_transport(
    name: str, *, options: type | None = None
) -> Callable[[Callable[..., SandboxClient]], Callable[..., SandboxClient]]:
    """Decorator: register a transport factory under `name`. Without `options` the factory is
    `(cfg) -> SandboxClient`; with `options` (a dataclass of settings, each with its default)
    it is `(cfg, settings) -> SandboxClient`, `settings` being `sandbox.options` read into it."""
    if options is not None and not (isinstance(options, type) and is_dataclass(options)):
        raise TypeError(f"transport {name!r}: options must be a dataclass, got {options!r}")

    def add(factory: Callable[..., SandboxClient]) -> Callable[..., SandboxClient]:
        SANDBOX_TRANSPORTS.add(name, factory if options is None else Transport(factory, options))
        return factory

    return add


def options_of(entry: SandboxFactory) -> type | None:
    """The settings dataclass a registered transport declares, or None."""
    return entry.options if isinstance(entry, Transport) else None
