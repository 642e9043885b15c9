"""The built-in sandbox transports, registered by name in `SANDBOX_TRANSPORTS`
(`tirl.sandbox.config`). Each factory imports its transport only when it is asked for, so the
`ray` entry costs nothing where Ray is not installed."""

from __future__ import annotations

from tirl.sandbox.api import SandboxClient
from tirl.sandbox.config import SANDBOX_TRANSPORTS, SandboxConfig


@SANDBOX_TRANSPORTS.register("local")
def local_sandbox(cfg: SandboxConfig) -> SandboxClient:
    from tirl.sandbox.local import Sandbox

    return Sandbox(cfg.limits(), preload=tuple(cfg.preload))


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
