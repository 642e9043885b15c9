"""The registry of sandbox transports: what a transport's module imports to register.

A transport is a factory `(SandboxConfig) -> SandboxClient` registered by name
(`@SANDBOX_TRANSPORTS.register("local")`). This module holds only the registry, so the built-in
transports (`tirl.sandbox.transports`) import it and nothing that reads it: the code that checks
`sandbox.kind` and builds the client (`tirl.sandbox.config`: `SandboxConfig`, `make_sandbox`)
imports the built-in transports. The dependency runs one way, readers -> built-in transports ->
this module. Reading `SANDBOX_TRANSPORTS` from here finds the built-in ones only once something
has imported `tirl.sandbox.config`: read it from there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tirl.registry import Registry
from tirl.sandbox.api import SandboxClient

if TYPE_CHECKING:  # an annotation only: the config's module imports the transports
    from tirl.sandbox.config import SandboxConfig

SandboxFactory = Callable[["SandboxConfig"], SandboxClient]

SANDBOX_TRANSPORTS: Registry[SandboxFactory] = Registry("sandbox transport")
