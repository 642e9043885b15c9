"""The OpenEnv server's settings, its episode error and the "client gone" event of a
connection: importable without openenv, so a bad setting is reported before openenv is needed."""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass

from tirl.config import setting
from tirl.protocol import PROTOCOLS
from tirl.sandbox.config import SandboxConfig
from tirl.tasks.base import SPLITS
from tirl.tools import DEFAULT_TOOLS, tools_problem


class EpisodeError(ValueError):
    """A request the current episode cannot take (no episode yet, or it is over)."""


class ClientGone(EpisodeError):
    """The client of the episode went away while a step was running; the step was cut."""


# Set by the server's middleware (`tirl.integrations.openenv.server.WatchClient`) for the
# handler of one WebSocket connection: the event is set as soon as its client disconnects, so a
# step running for it stops (`TirlEnvironment.step_async`) instead of finishing for nobody.
CLIENT_GONE: ContextVar[asyncio.Event | None] = ContextVar("tirl_openenv_client_gone", default=None)


@dataclass
class OpenEnvSettings:
    """How the OpenEnv server runs episodes."""

    split: str = setting(
        "train",
        doc="the split reset draws tasks from (train or test); a reset may name another",
        check=lambda v: None if v in SPLITS else f"must be one of {', '.join(SPLITS)}",
    )
    tasks: int = setting(
        10_000,
        "[1, 1000000000]",
        "distinct tasks reset draws from: seed s gives task s mod tasks of the split (RACES"
        " generates a split in order, once, up to the largest index asked: a bound on that work)",
    )
    max_tool_calls: int = setting(
        4, "[0, 1000]", "code blocks an episode may run; one more ends it with reward 0"
    )
    protocol: str = setting(
        "cir_fences",
        doc="how code blocks are written and their output shown (a registered protocol)",
        check=lambda name: PROTOCOLS.problem(name),
    )
    tools: list[str] = setting(
        factory=lambda: list(DEFAULT_TOOLS),
        doc="the tools whose blocks run (tirl.tools: python, shell); other tools' blocks get one line",
        check=tools_problem,
    )
    max_sessions: int = setting(64, "[1, 100000]", "concurrent WebSocket sessions (episodes)")
    sandbox: SandboxConfig = setting(
        factory=SandboxConfig, doc="where the code runs, its limits, what the model sees of it"
    )
