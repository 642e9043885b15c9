"""Format consistency: teacher text -> steps, and steps -> SFT trajectories in one protocol.

Teachers mix conventions: `<code>` tags or ```` ```python ```` / ```` ```py ```` fences,
`<interpreter>` or ```` ```output ```` blocks, `<think>` wrappers or none, odd whitespace.
`parse_solution` accepts all of these and returns plain steps (text, or code with the output the
teacher simulated); `render_parts` writes them back in exactly one protocol
(`tirl.protocol`: AgentMath tags or CIR fences). A text that cannot be read unambiguously (an
unclosed block, an output block with no code before it, no code at all) raises `FormatError`
with the reason, and the format stage rejects it.

The SFT record stores the steps, so `load_sft_trajectories` can render them in either protocol.
Each segment is tokenized on its own (the tool output separately, so it is loss-masked), as
`tirl.synth.arithmetic` does for the quickstart demonstrations.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tirl.protocol import get_protocol
from tirl.protocol.segments import SegmentKind, ToolCall, Trajectory
from tirl.protocol.tags import THINK_CLOSE, THINK_OPEN
from tirl.synth.arithmetic import PROMPT_TEMPLATE, to_trajectory
from tirl.synth.records import Step

_BLOCK = re.compile(
    r"<code>[ \t]*\n?(?P<tag_code>.*?)\n?[ \t]*</code>"
    r"|```(?:python|py|python3)[ \t]*\n(?P<fence_code>.*?)\n?[ \t]*```"
    r"|<interpreter>[ \t]*\n?(?P<tag_out>.*?)\n?[ \t]*</interpreter>"
    r"|```output[ \t]*\n(?P<fence_out>.*?)\n?[ \t]*```",
    re.DOTALL,
)
# Leftover openers in text mean a block that never closed (or a fence in an unknown language).
_STRAY = re.compile(r"</?code>|</?interpreter>|```")


class FormatError(ValueError):
    """The text cannot be turned into steps; `reason` is the short rejection reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _clean_text(text: str) -> str:
    return text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").strip()


def parse_solution(text: str) -> list[Step]:
    """Steps of a solution written in any of the known conventions (see the module doc)."""
    steps: list[Step] = []
    pos = 0

    def add_text(chunk: str) -> None:
        if _STRAY.search(chunk):
            raise FormatError("unclosed or unknown block")
        chunk = _clean_text(chunk)
        if chunk:
            steps.append(Step("text", chunk))

    for m in _BLOCK.finditer(text):
        between = text[pos : m.start()]
        pos = m.end()
        code = m.group("tag_code") if m.group("tag_code") is not None else m.group("fence_code")
        if code is not None:
            add_text(between)
            if not code.strip():
                raise FormatError("empty code block")
            steps.append(Step("code", code.strip("\n")))
            continue
        out = m.group("tag_out") if m.group("tag_out") is not None else m.group("fence_out")
        last = steps[-1] if steps else None
        if (
            _clean_text(between)
            or last is None
            or last.kind != "code"
            or last.simulated is not None
        ):
            raise FormatError("output block without its code block")
        last.simulated = out.strip("\n")
    add_text(text[pos:])
    if not any(s.kind == "code" for s in steps):
        raise FormatError("no code block")
    return steps


def render_parts(problem: str, steps: list[Step], protocol_name: str) -> list[tuple[str, str]]:
    """(kind, text) segments: the prompt, then model text ending at each code block's close
    (where a rollout would stop), the shown output as a tool segment, and so on. With AgentMath
    tags, reasoning before a block is wrapped in <think>; the closing text is not."""
    protocol = get_protocol(protocol_name)
    tags = protocol_name == "agentmath_tags"
    parts: list[tuple[str, str]] = [
        (SegmentKind.PROMPT.value, PROMPT_TEMPLATE.format(question=problem))
    ]
    model = ""
    for i, step in enumerate(steps):
        if step.kind == "text":
            before_code = any(s.kind == "code" for s in steps[i + 1 :])
            wrap = tags and before_code
            model += f"{THINK_OPEN}{step.text}{THINK_CLOSE}\n" if wrap else step.text + "\n"
            continue
        model += protocol.render_code(step.text)
        parts.append((SegmentKind.MODEL.value, model))
        shown = step.output if step.output is not None else (step.simulated or "")
        parts.append((SegmentKind.TOOL.value, protocol.render_output(shown)))
        model = ""
    if model.strip():
        parts.append((SegmentKind.MODEL.value, model.rstrip("\n")))
    return parts


def model_text(parts: list[tuple[str, str]]) -> str:
    """The model's own text: where the final answer must be read from (invariant 3)."""
    return "".join(t for k, t in parts if k == SegmentKind.MODEL.value)


def sft_record(item, protocol_name: str) -> dict:
    parts = render_parts(item.problem, item.steps, protocol_name)
    return {
        "id": item.id,
        "problem": item.problem,
        "answer": item.answer,
        "protocol": protocol_name,
        "steps": [vars(s) for s in item.steps],
        "parts": [{"kind": k, "text": t} for k, t in parts],
        "text": "".join(t for _, t in parts),
        "source": item.source,
    }


def load_sft_trajectories(
    path: str | Path, tokenizer, protocol: str | None = None
) -> list[Trajectory]:
    """Trajectories for `tirl.train.sft.train_sft` from a synth output JSONL. `protocol`
    re-renders the steps in that protocol (default: the one each record was written in)."""
    trajs = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            steps = [Step(**s) for s in rec["steps"]]
            name = protocol or rec["protocol"]
            parts = render_parts(rec["problem"], steps, name)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a synth trajectory record ({e})") from None
        traj = to_trajectory(
            [(SegmentKind(k), t) for k, t in parts],
            tokenizer,
            {"id": rec["id"], "answer": rec["answer"]},
        )
        traj.tool_calls = [
            ToolCall(s.text, s.status or "ok", s.output or "") for s in steps if s.kind == "code"
        ]
        trajs.append(traj)
    return trajs
