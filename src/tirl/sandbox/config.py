"""The one sandbox section every command reads, and the registry of sandbox transports.

`SandboxConfig` is the `sandbox:` section of `tirl train` / `eval` / `ablate` / `study`
configs, of `tirl synth` configs and of the verl plugin's run config; `tirl sandbox serve`
takes its defaults from it. `kind` names a registered transport (`SANDBOX_TRANSPORTS`):

- `local`: sessions forked on this machine (`tirl.sandbox.local.Sandbox`);
- `http`: sessions on `tirl sandbox serve` servers at `urls` (`tirl.sandbox.http.HTTPSandbox`);
  their timeouts and memory limits are the servers' own, set when they were started;
- `ray`: sessions on a pool of `actors` Ray actors (`tirl.sandbox.ray_pool.RaySandboxPool`),
  on the Ray cluster this process is connected to, or a local one.

`max_output_chars` is what the model is shown of a cell's output, whatever the transport: the
formatter (`tirl.sandbox.format_result`) cuts it on the caller's side, with one default
(`SHOWN_OUTPUT_CHARS`) for RL, evaluation, SFT demonstrations and synthesized data alike.

A transport is one file: a factory `(SandboxConfig) -> SandboxClient` registered with
`@SANDBOX_TRANSPORTS.register("name")` (`tirl.sandbox.registration`; the built-in ones are in
`tirl.sandbox.transports`, which this module imports, so the `SANDBOX_TRANSPORTS` it re-exports
holds them). `make_sandbox(cfg)` builds the client; entering it starts it, so an unreachable
server or a cluster that cannot be joined is a one-line `SandboxError` before any other work.
"""

from __future__ import annotations

from dataclasses import dataclass

import tirl.sandbox.transports  # noqa: F401  (registers the built-in transports)
from tirl.config import ConfigError, setting
from tirl.sandbox.api import SandboxClient
from tirl.sandbox.formatter import SHOWN_OUTPUT_CHARS
from tirl.sandbox.limits import DEFAULT_PRELOAD, SandboxLimits
from tirl.sandbox.registration import SANDBOX_TRANSPORTS, SandboxFactory

__all__ = [
    "DEFAULT_PRELOAD",
    "SANDBOX_TRANSPORTS",
    "SandboxConfig",
    "SandboxFactory",
    "make_sandbox",
    "modules_problem",
]


def modules_problem(modules: list[str]) -> str | None:
    """Why `modules` cannot be preloaded (a bad name, one not installed), or None."""
    import importlib.util
    import re

    for name in modules:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            return f"must list module names; {name!r} is not one"
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"must list installed modules; there is no module {name!r}"
    return None


def _urls_problem(urls: list[str]) -> str | None:
    from yarl import URL

    for url in urls:
        try:
            parsed = URL(url)
        except (ValueError, TypeError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            return f"must list server base URLs like http://127.0.0.1:8765, got {url!r}"
    return None


@dataclass
class SandboxConfig:
    """Where model-written code runs, under which limits, and what the model sees of it."""

    kind: str = setting(
        "local",
        doc="the transport: local (this machine), http (tirl sandbox serve servers at urls),"
        " ray (a pool of Ray actors), or one registered in tirl.sandbox.config",
        check=lambda name: SANDBOX_TRANSPORTS.problem(name),
    )
    urls: list[str] = setting(
        factory=list, doc="http: the sandbox servers' base URLs", check=_urls_problem
    )
    actors: int = setting(1, "[1, 100000]", "ray: sandbox actors in the pool")
    timeout_s: float = setting(
        5.0, "(0, 3600]", "wall clock per code block, in seconds (http: the server's)"
    )
    memory_mb: int = setting(
        1024, "[64, 1048576]", "address-space limit per session, in MB (http: the server's)"
    )
    max_output_chars: int = setting(
        SHOWN_OUTPUT_CHARS,
        "[16, 10000000]",
        "interpreter output shown to the model, in characters (head + tail)",
    )
    preload: list[str] = setting(
        factory=lambda: list(DEFAULT_PRELOAD),
        doc="modules imported once in the sandbox's parent and shared by every session",
        check=modules_problem,
    )
    cpu_s: int | None = setting(
        None, "[1, 86400]", "CPU seconds per session over its life (RLIMIT_CPU); null = no cap"
    )
    kill_background: bool = setting(
        True, doc="end the processes a cell leaves running when the cell returns"
    )

    def validate(self) -> None:
        if self.kind == "http" and not self.urls:
            raise ConfigError(
                "sandbox.urls must list the servers' base URLs for kind http", "sandbox.urls"
            )
        if self.kind != "http" and self.urls:
            raise ConfigError(
                f"sandbox.urls is read only by kind http, and kind is {self.kind}",
                "sandbox.urls",
            )

    def limits(self):
        """These settings as `tirl.sandbox.SandboxLimits` (what a local sandbox enforces)."""
        return SandboxLimits(
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            cpu_s=self.cpu_s,
            kill_background=self.kill_background,
        )


def make_sandbox(cfg: SandboxConfig) -> SandboxClient:
    """The client `cfg.kind` names. Use as `async with make_sandbox(cfg) as sandbox:`: it
    starts on entering (an unreachable server is a one-line SandboxError then, before any
    other work) and closes on leaving."""
    return SANDBOX_TRANSPORTS.get_entry(cfg.kind)(cfg)
