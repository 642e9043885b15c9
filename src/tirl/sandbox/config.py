"""The one sandbox section every command reads, and the registry of sandbox transports.

`SandboxConfig` is the `sandbox:` section of `tirl train` / `eval` / `ablate` / `study`
configs, of `tirl synth` configs and of the verl plugin's run config. It is the one place a
sandbox setting is declared: each is a `setting(...)` with its range and doc, and the rest
derives from it:

- `limits()` turns the session limits into the `SandboxLimits` a local sandbox enforces (every
  field of `SandboxLimits` is a setting here, with the same default, so a new limit is added
  there and here, and `tests/test_sandbox_settings.py` fails until both have it);
- `tirl sandbox serve` (`tirl.cli.sandbox`) makes one flag per setting in `SERVED_SETTINGS`,
  with this range, default and doc, so a server's sessions take the settings of a run's.

`kind` names a registered transport (`SANDBOX_TRANSPORTS`):

- `local`: sessions forked on this machine (`tirl.sandbox.local.Sandbox`);
- `http`: sessions on `tirl sandbox serve` servers at `urls` (`tirl.sandbox.http.HTTPSandbox`);
  their limits and preloads are the servers' own, set when they were started;
- `ray`: sessions on a pool of `actors` Ray actors (`tirl.sandbox.ray_pool.RaySandboxPool`),
  on the Ray cluster this process is connected to, or a local one.

`urls` and `actors`, the built-in transports' own settings, stay flat keys of the section,
like `rollout.urls` beside `rollout.engine`: the addresses and sizes a run connects to are
keys of their section, checked against the kind that reads them, and these two are written in
every saved run config, the verl plugin's launch keys and its key table, and the RACES study's
list of placement keys, none of which a move could keep readable (`tirl.config` refuses a
moved key). A transport registered elsewhere declares its own settings instead
(`tirl.sandbox.registration.register_transport`): a dataclass of settings, read from
`options` and checked when the config loads.

`max_output_chars` is what the model is shown of a cell's output, whatever the transport: the
formatter (`tirl.sandbox.format_result`) cuts it on the caller's side, with one default
(`SHOWN_OUTPUT_CHARS`) for RL, evaluation, SFT demonstrations and synthesized data alike.

A transport is one file: a factory `(SandboxConfig) -> SandboxClient` registered with
`@SANDBOX_TRANSPORTS.register("name")`, or `(SandboxConfig, options)` with
`@register_transport("name", options=...)` (`tirl.sandbox.registration`; the built-in ones are
in `tirl.sandbox.transports`, which this module imports, so the `SANDBOX_TRANSPORTS` it
re-exports holds them). `make_sandbox(cfg)` builds the client; entering it starts it, so an
unreachable server or a cluster that cannot be joined is a one-line `SandboxError` before any
other work.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import tirl.sandbox.transports  # noqa: F401  (registers the built-in transports)
from tirl.config import ConfigError, from_dict, setting
from tirl.sandbox.api import SandboxClient
from tirl.sandbox.formatter import SHOWN_OUTPUT_CHARS
from tirl.sandbox.limits import DEFAULT_PRELOAD, SandboxLimits
from tirl.sandbox.registration import SANDBOX_TRANSPORTS, SandboxFactory, options_of

__all__ = [
    "DEFAULT_PRELOAD",
    "SANDBOX_TRANSPORTS",
    "SERVED_SETTINGS",
    "SandboxConfig",
    "SandboxFactory",
    "make_sandbox",
    "modules_problem",
]

_LIMITS = SandboxLimits()  # every session limit's default (tirl.sandbox.limits)


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
        factory=list,
        doc="http: the sandbox servers' base URLs; the servers' own flags set the limits and"
        " preloads of their sessions (tirl sandbox serve --help)",
        check=_urls_problem,
    )
    actors: int = setting(1, "[1, 100000]", "ray: sandbox actors in the pool")
    timeout_s: float = setting(
        _LIMITS.timeout_s, "(0, 3600]", "wall clock per code block, in seconds"
    )
    memory_mb: int = setting(
        _LIMITS.memory_mb,
        "[64, 1048576]",
        "data memory per session process (RLIMIT_DATA), in MB",
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
        _LIMITS.cpu_s,
        "[1, 86400]",
        "CPU seconds per session over its life (RLIMIT_CPU); unset (null) = no cap",
    )
    kill_background: bool = setting(
        _LIMITS.kill_background,
        doc="end the processes a cell leaves running when the cell returns",
    )
    grace_s: float = setting(
        _LIMITS.grace_s,
        "(0, 3600]",
        "seconds from a timed-out cell's interrupt to the kill of its session, if the cell"
        " ignores the interrupt",
    )
    capture_chars: int = setting(
        _LIMITS.capture_chars,
        "[16, 100000000]",
        "output kept per stream and cell (head + tail), before max_output_chars cuts what the"
        " model is shown",
    )
    file_size_mb: int = setting(
        _LIMITS.file_size_mb,
        "[1, 1048576]",
        "largest file a cell may write, in MB (RLIMIT_FSIZE)",
    )
    max_open_files: int = setting(
        _LIMITS.max_open_files,
        "[16, 1048576]",
        "open files per session process (RLIMIT_NOFILE)",
    )
    max_processes: int = setting(
        _LIMITS.max_processes,
        "[1, 100000]",
        "processes and threads of a session and its forks together (RLIMIT_NPROC)",
    )
    disk_mb: int = setting(
        _LIMITS.disk_mb,
        "[1, 1048576]",
        "size of a session's private /tmp, its working directory, in MB",
    )
    options: dict[str, Any] = setting(
        factory=dict,
        doc="settings of a transport that declares its own (one registered with"
        " tirl.sandbox.registration.register_transport), checked against them on load",
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
        self.transport_options()  # a bad option is one line now, not when the sandbox starts

    def limits(self) -> SandboxLimits:
        """The session limits of these settings (what a local sandbox enforces): every
        `SandboxLimits` field, from the setting of the same name."""
        return SandboxLimits(**{f.name: getattr(self, f.name) for f in fields(SandboxLimits)})

    def transport_options(self) -> Any:
        """`options` as the settings `kind` declares (an instance of its options dataclass),
        or None for a transport that declares none."""
        declared = options_of(SANDBOX_TRANSPORTS.get_entry(self.kind))
        if declared is None:
            if self.options:
                raise ConfigError(
                    f"sandbox.options: transport {self.kind} has no settings of its own",
                    "sandbox.options",
                )
            return None
        return from_dict(declared, self.options, "sandbox.options")


# The settings that shape a session, which a `tirl sandbox serve` server takes as flags and owns
# for its clients: the session limits and the preloads.
SERVED_SETTINGS = (*(f.name for f in fields(SandboxLimits)), "preload")


def make_sandbox(cfg: SandboxConfig) -> SandboxClient:
    """The client `cfg.kind` names. Use as `async with make_sandbox(cfg) as sandbox:`: it
    starts on entering (an unreachable server is a one-line SandboxError then, before any
    other work) and closes on leaving."""
    return SANDBOX_TRANSPORTS.get_entry(cfg.kind)(cfg)
