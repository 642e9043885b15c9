"""How trajectories are written: token segments, and the code-block protocols."""

from __future__ import annotations

from tirl.protocol.fences import CIR_FENCES, Boundary, Protocol
from tirl.protocol.tags import AGENTMATH_TAGS

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (CIR_FENCES, AGENTMATH_TAGS)}


def get_protocol(name: str, boundary: Boundary | str = Boundary.EXACT_MATCH) -> Protocol:
    """A registered protocol by name ("cir_fences", "agentmath_tags") in a boundary mode."""
    if name not in PROTOCOLS:
        raise KeyError(f"unknown protocol {name!r}; known: {sorted(PROTOCOLS)}")
    return PROTOCOLS[name].with_boundary(boundary)


__all__ = ["AGENTMATH_TAGS", "CIR_FENCES", "PROTOCOLS", "Boundary", "Protocol", "get_protocol"]
