"""Read a `tirl synth run` / `tirl synth races` output file as demonstrations for SFT.

Each line of the file (`trajectories.jsonl`, written by `tirl.synth.formats.sft_record`) is one
solved problem: `problem`, `answer`, the `protocol` it was written in, and its `steps` (free
text, or code with the output the model is shown). `read_sft_records` turns each into the
problem and its demonstration parts (`Think` text, `Code` with its recorded output: real
sandbox output once the synth run's replace stage ran), for `tirl.tasks.demos.demo_trajectory`.

`steps_to_parts` is the one place steps become parts, so the tokens trained on are the text the
file shows (its `parts`/`text` fields, rendered the same way): text before a block is wrapped
as the protocol wraps reasoning (`Protocol.reasoning`: `<think>` in AgentMath's tags); each
text step ends with a newline; the closing text does not.

A record written in another protocol than the run's is an error, not a silent re-render: the
teacher's text, the format stage and the answer check all saw that protocol. Every bad input is
a one-line `ConfigError` naming `file:line` (architecture.md invariant 6).

Tools: a code step names its tool (`"tool": "shell"`; absent: Python, so files written before
there were other tools read as they always did) and becomes that tool's block of the run's
protocol. A tool that is not registered is an error, and so is one the run did not enable when
the run's protocol is given (`tirl.tools.toolset_protocol`): its blocks would be refused in a
rollout, so a demonstration must not teach them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.config import ConfigError
from tirl.protocol import PROTOCOLS, Protocol
from tirl.tasks.base import Code, DemoPart, Think
from tirl.tools import DEFAULT_TOOLS, TOOLS

REQUIRED_FIELDS = ("problem", "answer", "protocol", "steps")
STEP_KINDS = ("text", "code")


@dataclass(frozen=True)
class SFTRecord:
    """One record of an SFT file: the problem, its demonstration parts, and where it came from.
    `statuses` holds the sandbox status of each code step ("ok" when the file has none)."""

    problem: str
    parts: list[DemoPart]
    answer: str
    id: str
    protocol: str
    where: str  # "file:line"
    statuses: list[str] = field(default_factory=list)


def steps_to_parts(steps: Sequence[Mapping[str, Any]], protocol_name: str) -> list[DemoPart]:
    """Demonstration parts of synth steps (dicts with `kind`, `text`, and for code `output` or,
    before the replace stage, the teacher's `simulated` output), written as `protocol_name`
    writes them (see the module doc): the reasoning before a block wrapped as the protocol wraps
    it (`Protocol.reasoning`: AgentMath's <think>), the closing text plain."""
    reasoning = PROTOCOLS.get_entry(protocol_name).reasoning
    last_code = max((i for i, s in enumerate(steps) if s["kind"] == "code"), default=-1)
    parts: list[DemoPart] = []
    for step in steps[: last_code + 1]:
        if step["kind"] == "code":
            shown = step.get("output")
            if shown is None:
                shown = step.get("simulated") or ""
            parts.append(Code(step["text"], shown, step.get("tool") or DEFAULT_TOOLS[0]))
        elif reasoning is not None:
            parts.append(Think(f"{reasoning[0]}{step['text']}{reasoning[1]}\n"))
        else:
            parts.append(Think(step["text"] + "\n"))
    closing = "".join(s["text"] + "\n" for s in steps[last_code + 1 :])
    if closing.strip():
        parts.append(Think(closing.rstrip("\n")))
    return parts


def _protocol_name(protocol: Protocol | str | None) -> str | None:
    return protocol.name if isinstance(protocol, Protocol) else protocol


def _steps(rec: dict, where: str, enabled: Sequence[str] | None) -> list[dict[str, Any]]:
    steps = rec["steps"]
    if not isinstance(steps, list) or not steps:
        raise ConfigError(f"{where}: 'steps' must be a non-empty list")
    out = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ConfigError(f"{where}: step {i} is not a JSON object")
        kind = step.get("kind")
        if kind not in STEP_KINDS:
            raise ConfigError(
                f"{where}: step {i} has unknown kind {kind!r} (expected 'text' or 'code')"
            )
        text = step.get("text", step.get("code") if kind == "code" else None)
        if not isinstance(text, str):
            raise ConfigError(f"{where}: step {i} ({kind}) has no text")
        if kind == "code":
            _check_tool(step.get("tool", DEFAULT_TOOLS[0]), f"{where}: step {i}", enabled)
        out.append({**step, "text": text})
    return out


def _check_tool(tool: Any, where: str, enabled: Sequence[str] | None) -> None:
    """ConfigError unless `tool` is registered and (`enabled` given) enabled in the run."""
    if not isinstance(tool, str) or tool not in TOOLS:
        raise ConfigError(f"{where}: unknown tool {tool!r} (registered: {', '.join(TOOLS)})")
    if enabled is not None and tool not in enabled:
        raise ConfigError(
            f"{where}: a {tool} block, a tool this run does not enable (tools: {', '.join(enabled)})"
        )


def parse_sft_record(rec: Any, where: str, protocol: Protocol | str | None = None) -> SFTRecord:
    """One record (a parsed JSON line); `protocol` is the run's (None: the record's own; a
    `Protocol` also says which tools the run enables, a name does not)."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: not a JSON object (got {type(rec).__name__})")
    for name in REQUIRED_FIELDS:
        if name not in rec or rec[name] is None:
            raise ConfigError(f"{where}: missing field {name!r}")
    for name in ("problem", "protocol"):
        if not isinstance(rec[name], str):
            raise ConfigError(f"{where}: field {name!r} is not text")
    written = rec["protocol"]
    if written not in PROTOCOLS:
        raise ConfigError(
            f"{where}: unknown protocol {written!r} (known: {', '.join(sorted(PROTOCOLS))})"
        )
    wanted = _protocol_name(protocol)
    if wanted is not None and written != wanted:
        raise ConfigError(f"{where}: written in {written}, the run uses {wanted}")
    enabled = protocol.enabled_tools if isinstance(protocol, Protocol) else None
    steps = _steps(rec, where, enabled)
    return SFTRecord(
        problem=rec["problem"],
        parts=steps_to_parts(steps, written),
        answer=str(rec["answer"]),
        id=str(rec.get("id") or where),
        protocol=written,
        where=where,
        statuses=[s.get("status") or "ok" for s in steps if s["kind"] == "code"],
    )


def read_sft_records(path: str | Path, protocol: Protocol | str | None = None) -> list[SFTRecord]:
    """Every record of an SFT file, in order (blank lines skipped). `protocol`: the run's
    protocol, which every record must have been written in (None: accept each record's own)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such SFT file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
        records.append(parse_sft_record(rec, where, protocol))
    if not records:
        raise ConfigError(f"{path}:1: empty SFT file (no records)")
    return records


def read_sft_file(
    path: str | Path, protocol: Protocol | str | None = None
) -> list[tuple[str, list[DemoPart]]]:
    """(problem, parts) of every record, for `demo_trajectory` (see `read_sft_records`)."""
    return [(r.problem, r.parts) for r in read_sft_records(path, protocol)]
