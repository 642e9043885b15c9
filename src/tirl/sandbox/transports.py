"""The built-in sandbox transports, registered by name in `SANDBOX_TRANSPORTS`
(`tirl.sandbox.registration`; `tirl.sandbox.config`, which reads it, imports this module). Each
factory imports its transport only when it is asked for, so the `ray` entry costs nothing where
Ray is not installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tirl.sandbox.api import SandboxClient
from tirl.sandbox.registration import SANDBOX_TRANSPORTS

if TYPE_CHECKING:  # an annotation only: tirl.sandbox.config imports this module
    from tirl.sandbox.config import SandboxConfig


@SANDBOX_TRANSPORTS.register("local")
def local_sandbox(cfg: SandboxConfig, *, pool_size: int = 0) -> SandboxClient:
    """A sandbox in this process's tree, with the section's limits and preloads. A server's
    (`tirl sandbox serve`) also forks `pool_size` sessions ahead of requests."""
    from tirl.sandbox.local import Sandbox

    return Sandbox(cfg.limits(), preload=tuple(cfg.preload), pool_size=pool_size)


@SANDBOX_TRANSPORTS.register("http")
def http_sandbox(cfg: SandboxConfig) -> SandboxClient:
    from tirl.sandbox.http import HTTPSandbox

    return HTTPSandbox(cfg.urls)


@SANDBOX_TRANSPORTS.register("ray")
def ray_sandbox(cfg: SandboxConfig) -> SandboxClient:
    from tirl.config import ConfigError

    try:
        from tirl.sandbox.ray_pool import RaySandboxPool
    except ImportError as e:
        raise ConfigError(
            f"sandbox.kind ray needs Ray: pip install 'tirl[ray]' ({e})", "sandbox.kind"
        ) from None
    return RaySandboxPool(cfg.actors, limits=cfg.limits(), preload=tuple(cfg.preload))
