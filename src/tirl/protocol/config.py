"""The `protocol:` section of a run config: how the model writes code and sees tool output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tirl.config import setting


def _protocol_problem(name: str) -> str | None:
    from tirl.protocol import PROTOCOLS  # the registry: no copied list of names here

    return PROTOCOLS.problem(name)


@dataclass
class ProtocolConfig:
    """How the model writes code and sees tool output (`tirl.protocol`), and how the end of a
    code block is detected; SFT, RL and evaluation all use it."""

    SHORTHAND = "name"  # `protocol: agentmath_tags` = `protocol: {name: agentmath_tags}`

    name: str = setting(
        "cir_fences",
        doc="a registered protocol: cir_fences (markdown fences), agentmath_tags"
        " (<code>/<interpreter>) or hermes_tools (tools as functions, <tool_call> JSON)",
        check=_protocol_problem,
    )
    boundary: Literal["exact_match", "stop_token"] = setting(
        "exact_match",
        doc="how a code block's end is detected (CIR Figure 1): exact_match runs the code the"
        " moment its closing marker is generated; stop_token waits for the model to write the"
        " output marker",
    )
