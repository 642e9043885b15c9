"""Format consistency: teacher text -> steps, and steps -> SFT trajectories in one protocol.

Teachers mix conventions: `<code>` tags or ```` ```python ```` / ```` ```py ```` fences,
`<interpreter>` or ```` ```output ```` blocks, `<think>` wrappers or none, odd whitespace.
`parse_solution` accepts all of these and returns plain steps (text, or code of some tool with
the output the teacher simulated); `render_parts` writes them back in exactly one protocol
(`tirl.protocol`: AgentMath tags or CIR fences). Every registered tool's blocks are read, in
both shapes, by the words the tool declares and the aliases a teacher may write instead
(`tirl.tools.base.Tool`: ```` ```bash ````, ```` ```sh ```` or `<bash>` for the shell tool); the
pattern is built from the registry, once per set of tools. A text that cannot be read unambiguously (an
unclosed block, an output block with no code before it, no code at all) raises `FormatError`
with the reason, and the format stage rejects it.

The SFT record stores the steps and the protocol they were written in; `load_sft_trajectories`
reads them back (`tirl.tasks.sft_file`) as token trajectories (`tirl.tasks.demos`), each segment
tokenized on its own (the tool output separately, so it is loss-masked). Steps become text in
one place (`tirl.tasks.sft_file.steps_to_parts` + `tirl.tasks.demos.demo_segment_texts`), so the
`parts` a record shows are the text its trajectory is tokenized from.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

from tirl.protocol import Protocol, Shape, get_protocol
from tirl.protocol.segments import SegmentKind, Trajectory
from tirl.protocol.tags import THINK_CLOSE, THINK_OPEN
from tirl.synth.records import Step
from tirl.tasks.base import Code
from tirl.tasks.demos import demo_segment_texts, demo_trajectory, recorded_outputs
from tirl.tasks.prompts import PLAIN_TEMPLATE, PromptRenderer
from tirl.tasks.sft_file import read_sft_records, steps_to_parts
from tirl.tools import DEFAULT_TOOLS, TOOLS, toolset_protocol

# The output blocks a teacher writes after a block: AgentMath's tag and CIR's fence.
_OUTPUT_WORDS = {Shape.TAGS: "interpreter", Shape.FENCES: "output"}


def _block_regex(shape: Shape, word: str) -> str:
    """A block named `word` in `shape`, its body the one group, whitespace at its edges loose."""
    w = re.escape(word)
    if shape is Shape.TAGS:
        return rf"<{w}>[ \t]*\n?(.*?)\n?[ \t]*</{w}>"
    return rf"```{w}[ \t]*\n(.*?)\n?[ \t]*```"


def _teacher_words() -> tuple[tuple[str, Shape, str], ...]:
    """(tool, shape, word) for every word a teacher may name a registered tool's block by: its
    words and its aliases, in both shapes (a teacher mixes conventions whatever the run's)."""
    found = []
    for name in TOOLS:
        tool = TOOLS[name]
        for shape in Shape:
            for word in (tool.words.get(shape), *tool.aliases.get(shape, ())):
                if word is not None:
                    found.append((name, shape, word))
    return tuple(found)


@functools.lru_cache(maxsize=8)
def _reader(words: tuple[tuple[str, Shape, str], ...]):
    """(block pattern, stray pattern, tool per group) for one set of registered tools' words
    (compiled once per set: a plugin registering a tool makes a new set). Each alternative has
    one group, so `m.lastindex` says which block matched; its tool is None for output blocks.
    ValueError for a word two tools (or a tool and an output block) claim: a teacher's block
    would be read as either."""
    owners = {(shape, word): "the output block" for shape, word in _OUTPUT_WORDS.items()}
    for tool, shape, word in words:
        if owners.setdefault((shape, word), tool) != tool:
            raise ValueError(f"{owners[shape, word]!r} and tool {tool!r} both use {word!r}")
    blocks = [(tool, _block_regex(shape, word)) for tool, shape, word in words]
    blocks += [(None, _block_regex(shape, word)) for shape, word in _OUTPUT_WORDS.items()]
    pattern = re.compile("|".join(regex for _, regex in blocks), re.DOTALL)
    # Leftover openers in text mean a block that never closed (or a fence in an unknown
    # language): any tag a block is named by, or any fence.
    tags = [w for _, shape, w in words if shape is Shape.TAGS] + [_OUTPUT_WORDS[Shape.TAGS]]
    stray = re.compile("|".join(f"</?{re.escape(w)}>" for w in dict.fromkeys(tags)) + "|```")
    return pattern, stray, (None, *(tool for tool, _ in blocks))


class FormatError(ValueError):
    """The text cannot be turned into steps; `reason` is the short rejection reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _clean_text(text: str) -> str:
    return text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "").strip()


def parse_solution(text: str, tools: Sequence[str] = DEFAULT_TOOLS) -> list[Step]:
    """Steps of a solution written in any of the known conventions (see the module doc). A
    block named by a registered tool's word or alias, in either shape (```` ```bash ````,
    `<bash>`), is a step of that tool; a block of a tool not in `tools` is a FormatError (the
    run could not train on it)."""
    pattern, stray, tool_of = _reader(_teacher_words())
    steps: list[Step] = []
    pos = 0

    def add_text(chunk: str) -> None:
        if stray.search(chunk):
            raise FormatError("unclosed or unknown block")
        chunk = _clean_text(chunk)
        if chunk:
            steps.append(Step("text", chunk))

    for m in pattern.finditer(text):
        between = text[pos : m.start()]
        pos = m.end()
        tool, body = tool_of[m.lastindex], m.group(m.lastindex)
        if tool is not None:
            add_text(between)
            if tool not in tools:
                raise FormatError(f"a {tool} block, a tool this run does not enable")
            if not body.strip():
                raise FormatError("empty code block")
            steps.append(Step("code", body.strip("\n"), tool=tool))
            continue
        last = steps[-1] if steps else None
        if (
            _clean_text(between)
            or last is None
            or last.kind != "code"
            or last.simulated is not None
        ):
            raise FormatError("output block without its code block")
        last.simulated = body.strip("\n")
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
