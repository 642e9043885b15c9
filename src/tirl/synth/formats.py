"""Format consistency: teacher text -> steps, and steps -> SFT trajectories in one protocol.

Teachers mix conventions: `<code>` tags or ```` ```python ```` / ```` ```py ```` fences,
`<interpreter>` or ```` ```output ```` blocks, `<think>` wrappers or none, odd whitespace.
`parse_solution` accepts all of these and returns plain steps (text, or code with the output the
teacher simulated); `render_parts` writes them back in exactly one protocol
(`tirl.protocol`: AgentMath tags or CIR fences). A text that cannot be read unambiguously (an
unclosed block, an output block with no code before it, no code at all) raises `FormatError`
with the reason, and the format stage rejects it.

The SFT record stores the steps and the protocol they were written in; `load_sft_trajectories`
reads them back (`tirl.tasks.sft_file`) as token trajectories (`tirl.tasks.demos`), each segment
tokenized on its own (the tool output separately, so it is loss-masked). Steps become text in
one place (`tirl.tasks.sft_file.steps_to_parts` + `tirl.tasks.demos.demo_segment_texts`), so the
`parts` a record shows are the text its trajectory is tokenized from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from tirl.protocol import Protocol, get_protocol
from tirl.protocol.segments import SegmentKind, Trajectory
from tirl.protocol.tags import THINK_CLOSE, THINK_OPEN
from tirl.synth.records import Step
from tirl.tasks.base import Code
from tirl.tasks.demos import demo_segment_texts, demo_trajectory, recorded_outputs
from tirl.tasks.prompts import PLAIN_TEMPLATE, PromptRenderer
from tirl.tasks.sft_file import read_sft_records, steps_to_parts
from tirl.tools import DEFAULT_TOOLS, toolset_protocol

_BLOCK = re.compile(
    r"<code>[ \t]*\n?(?P<tag_code>.*?)\n?[ \t]*</code>"
    r"|```(?:python|py|python3)[ \t]*\n(?P<fence_code>.*?)\n?[ \t]*```"
    r"|<bash>[ \t]*\n?(?P<tag_shell>.*?)\n?[ \t]*</bash>"
    r"|```(?:bash|sh|shell)[ \t]*\n(?P<fence_shell>.*?)\n?[ \t]*```"
    r"|<interpreter>[ \t]*\n?(?P<tag_out>.*?)\n?[ \t]*</interpreter>"
    r"|```output[ \t]*\n(?P<fence_out>.*?)\n?[ \t]*```",
    re.DOTALL,
)
# Leftover openers in text mean a block that never closed (or a fence in an unknown language).
_STRAY = re.compile(r"</?code>|</?bash>|</?interpreter>|```")


def _code_of(m: re.Match[str]) -> tuple[str, str] | None:
    """(tool, code) of a matched code block, or None for an output block."""
    for tool, groups in (
        ("python", ("tag_code", "fence_code")),
        ("shell", ("tag_shell", "fence_shell")),
    ):
        for group in groups:
            if m.group(group) is not None:
                return tool, m.group(group)
    return None


class FormatError(ValueError):
    """The text cannot be turned into steps; `reason` is the short rejection reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _clean_text(text: str) -> str:
    return text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").strip()


def parse_solution(text: str, tools: Sequence[str] = DEFAULT_TOOLS) -> list[Step]:
    """Steps of a solution written in any of the known conventions (see the module doc). Shell
    blocks (```` ```bash ````, `<bash>`) are steps of the shell tool; a block of a tool not in
    `tools` is a FormatError (the run could not train on it)."""
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
        call = _code_of(m)
        if call is not None:
            tool, code = call
            add_text(between)
            if tool not in tools:
                raise FormatError(f"a {tool} block, a tool this run does not enable")
            if not code.strip():
                raise FormatError("empty code block")
            steps.append(Step("code", code.strip("\n"), tool=tool))
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


def steps_protocol(protocol_name: str, tools: list[str]) -> Protocol:
    """`protocol_name` with the blocks of Python and of every tool in `tools` enabled: how a
    record whose code steps use `tools` is written (a tool's block is the same text whatever
    else a run enables). ConfigError (one line) for a tool that is not registered."""
    return toolset_protocol(
        get_protocol(protocol_name), list(dict.fromkeys([*DEFAULT_TOOLS, *tools]))
    )


def render_parts(problem: str, steps: list[Step], protocol_name: str) -> list[tuple[str, str]]:
    """(kind, text) segments: the prompt, then model text ending at each code block's close
    (where a rollout would stop), the shown output as a tool segment, and so on. With AgentMath
    tags, reasoning before a block is wrapped in <think>; the closing text is not."""
    parts = steps_to_parts([vars(s) for s in steps], protocol_name)
    protocol = steps_protocol(protocol_name, [p.tool for p in parts if isinstance(p, Code)])
    segments = demo_segment_texts(protocol, parts, recorded_outputs(parts))
    prompt = (SegmentKind.PROMPT.value, PLAIN_TEMPLATE.format(problem=problem))
    return [prompt, *((kind.value, text) for kind, text in segments)]


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
    path: str | Path,
    tokenizer,
    protocol: str | None = None,
    renderer: PromptRenderer | None = None,
) -> list[Trajectory]:
    """Trajectories for `tirl.train.sft.train_sft` from a synth output JSONL. `protocol`: the
    run's protocol, which every record must be written in (a `ConfigError` naming file:line
    otherwise; None accepts each record's own). `renderer` writes the prompts (plain prompts in
    the record's protocol by default; given, its protocol is the run's, and a code step for a
    tool it does not enable is an error)."""
    renderers: dict[tuple[str, ...], PromptRenderer] = {}
    trajs = []
    for rec in read_sft_records(path, protocol if renderer is None else renderer.protocol):
        if renderer is None:  # the record's protocol, with the tools its steps use
            tools = [p.tool for p in rec.parts if isinstance(p, Code)]
            key = (rec.protocol, *dict.fromkeys(tools))
            if key not in renderers:
                written = steps_protocol(rec.protocol, tools)
                renderers[key] = PromptRenderer(tokenizer, written, chat=False)
            use = renderers[key]
        else:
            use = renderer
        traj = demo_trajectory(
            use, rec.problem, rec.parts, None, {"id": rec.id, "answer": rec.answer}
        )
        for call, status in zip(traj.tool_calls, rec.statuses):
            call.status = status
        trajs.append(traj)
    return trajs
