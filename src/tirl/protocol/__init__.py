"""How trajectories are written: token segments, and the code-block protocols."""

from __future__ import annotations

from tirl.protocol.calls import HERMES_TOOLS, INVALID_CALL, CallProtocol
from tirl.protocol.fences import CIR_FENCES, DEFAULT_TOOL, Boundary, Protocol, Shape, ToolBlock
from tirl.protocol.tags import AGENTMATH_TAGS
from tirl.registry import Registry

PROTOCOLS: Registry[Protocol] = Registry("protocol", entry_type=Protocol)
for _protocol in (CIR_FENCES, AGENTMATH_TAGS, HERMES_TOOLS):
    PROTOCOLS.add(_protocol.name, _protocol)


def get_protocol(name: str, boundary: Boundary | str = Boundary.EXACT_MATCH) -> Protocol:
    """A registered protocol by name ("cir_fences", "agentmath_tags", "hermes_tools") in a
    boundary mode."""
    return PROTOCOLS.get_entry(name).with_boundary(boundary)


__all__ = [
    "AGENTMATH_TAGS",
    "CIR_FENCES",
    "HERMES_TOOLS",
    "INVALID_CALL",
    "DEFAULT_TOOL",
    "PROTOCOLS",
    "Boundary",
    "CallProtocol",
    "Protocol",
    "Shape",
    "ToolBlock",
    "get_protocol",
]
