"""Demonstrations as token trajectories, exactly as a rollout would have produced them.

A demonstration is a task's problem and its parts (`Think` text and `Code` blocks, from a
source's `demonstration` or a `tirl synth` file), with the interpreter's output for each block.
`demo_trajectory` writes it in the run's protocol and prompt style (`PromptRenderer`):

    <prompt>  the renderer's ids (plain text, or the chat template up to the assistant turn)
    <model>   Think text ... the code block (+ the stop marker in stop-token mode)
    <tool>    the interpreter's output, rendered by the protocol       (loss mask 0)
    <model>   ... the answer, then the renderer's eos id (`<|im_end|>` in chat)

Each segment is tokenized on its own (architecture.md invariant 1): a model segment ends where a
rollout's generation would stop (the block's close, or its stop marker), and the tool output is
tokenized separately, as the rollout does (`Protocol.encode_output`), with special-token
spellings kept as text (`tirl.protocol.tokens.encode_literal`: a printed `<|im_end|>` never ends
the turn). Model text is tokenized the same way: the only special token a demonstration teaches
is the final eos. (A call protocol's tool segment holds its chat template's turn markers as the
special tokens they are: they are the protocol's, not the output's; `tirl.protocol.calls`.)

`run_demo_codes` fills in the outputs of blocks that have none, each with its tool's own runner
(`tirl.tools`: the path a rollout's blocks take, so a shell step shows what a rollout's shell
block would), all of a demonstration's blocks in one sandbox session (architecture.md invariant 4).

Tools: each `Code` part names its tool (Python by default) and is written as that tool's block
of the run's protocol (`Protocol.render_code(source, tool)`; in a call protocol, the JSON call
of that tool's function). A block for a tool the protocol has no block for, or one the run did
not enable, is a one-line ValueError: a demonstration must not teach a block the run would
refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tqdm.auto import tqdm

from tirl.protocol import Protocol
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.protocol.tokens import encode_literal
from tirl.tasks.base import Code, DemoPart, Think
from tirl.tasks.prompts import PromptRenderer
from tirl.tools import TOOLS, ToolContext


def demo_segment_texts(
    protocol: Protocol, parts: Sequence[DemoPart], outputs: Sequence[str]
) -> list[tuple[SegmentKind, str]]:
    """The (kind, text) segments after the prompt: Think text runs into the next code block
    (one model segment, ending where a rollout stops), each block's output is a tool segment,
    and text after the last block is the closing model segment. `outputs` holds one shown
    output per Code part, in order. The text is the same in both boundary modes; only where
    the model's segment ends moves (`Protocol.render_code` / `render_output`)."""
    codes = [p for p in parts if isinstance(p, Code)]
    if len(outputs) != len(codes):
        raise ValueError(f"{len(codes)} code blocks but {len(outputs)} outputs")
    for code in codes:
        check_demo_tool(protocol, code.tool)
    texts: list[tuple[SegmentKind, str]] = []
    model = ""
    shown = iter(outputs)
    for part in parts:
        if isinstance(part, Think):
            model += part.text
        elif isinstance(part, Code):
            texts.append((SegmentKind.MODEL, model + protocol.render_code(part.source, part.tool)))
            texts.append((SegmentKind.TOOL, protocol.render_output(next(shown))))
            model = ""
        else:
            raise TypeError(f"a demonstration part is Think or Code, not {type(part).__name__}")
    if model:
        texts.append((SegmentKind.MODEL, model))
    return texts


def check_demo_tool(protocol: Protocol, tool: str) -> None:
    """ValueError (one line) unless `protocol` runs `tool`'s blocks (see the module doc)."""
    if tool not in protocol.enabled_tools:
        why = "is not enabled in this run" if tool in protocol.tool_names else "has no block here"
        raise ValueError(
            f"a demonstration block for tool {tool!r}: it {why} (protocol {protocol.name!r}"
            f" runs: {', '.join(protocol.enabled_tools)})"
        )


def recorded_outputs(parts: Sequence[DemoPart]) -> list[str]:
    """The outputs recorded on the Code parts (each must have one)."""
    codes = [p for p in parts if isinstance(p, Code)]
    missing = sum(c.output is None for c in codes)
    if missing:
        raise ValueError(f"{missing} code block(s) have no output: run them (run_demo_codes)")
    return [c.output for c in codes]  # type: ignore[misc]


def demo_trajectory(
    renderer: PromptRenderer,
    task_problem: str,
    parts: Sequence[DemoPart],
    outputs: Sequence[str] | None = None,
    meta: dict | None = None,
) -> Trajectory:
    """The token trajectory of one demonstration (see the module doc). `outputs`: one shown
    output per Code part (None: the outputs recorded on the parts). The last model segment
    ends with `renderer.eos_id`; a demonstration that ends with a tool output gets a model
    segment of that id alone, as a rollout whose model stops there would."""
    outputs = recorded_outputs(parts) if outputs is None else list(outputs)
    tokenizer = renderer.tokenizer
    prompt_ids = renderer.prompt_ids(task_problem)
    segments = [Segment(SegmentKind.PROMPT, prompt_ids, renderer.prompt_text(task_problem))]
    protocol, shown = renderer.protocol, iter(outputs)
    for kind, text in demo_segment_texts(protocol, parts, outputs):
        if kind is SegmentKind.TOOL:  # tokenized as a rollout tokenizes its tool segments
            ids = protocol.encode_output(tokenizer, next(shown))
        else:
            ids = encode_literal(tokenizer, text)
        segments.append(Segment(kind, ids, text))
    if segments[-1].kind is SegmentKind.MODEL and len(segments) > 1:
        segments[-1].ids.append(renderer.eos_id)
    else:
        segments.append(Segment(SegmentKind.MODEL, [renderer.eos_id], ""))
    codes = [p for p in parts if isinstance(p, Code)]
    return Trajectory(
        segments=segments,
        tool_calls=[ToolCall(c.source, "ok", out, tool=c.tool) for c, out in zip(codes, outputs)],
        meta=dict(meta or {}),
    )


async def run_demo_codes(
    sandbox,
    parts_list: Sequence[Sequence[DemoPart]],
    max_chars: int,
    names: Sequence[str] | None = None,
    concurrency: int = 16,
) -> list[list[str]]:
    """The shown output of every Code part of every demonstration, in order: a recorded output
    as it is, a missing one from running the block with its tool (`run_demo_block`). A
    demonstration's blocks run in order in one session, so later blocks see earlier variables
    and files (a shell step reads what a Python step wrote). A block that fails is a
    RuntimeError naming its task (`names[i]`, e.g. the task id): a demonstration must not
    teach a failing call it does not mean to. An unregistered tool is a KeyError (one line)
    before anything runs."""
    if names is None:
        names = [f"demonstration {i}" for i in range(len(parts_list))]
    for parts in parts_list:
        for part in parts:
            if isinstance(part, Code) and part.output is None:
                TOOLS.get_entry(part.tool)  # an unknown tool fails before any session opens
    gate = asyncio.Semaphore(concurrency)
    to_run = sum(any(isinstance(p, Code) and p.output is None for p in ps) for ps in parts_list)
    bar = tqdm(total=to_run, desc="sandbox: run demonstration code", leave=False)

    async def one(parts: Sequence[DemoPart], name: str) -> list[str]:
        codes = [p for p in parts if isinstance(p, Code)]
        if all(c.output is not None for c in codes):
            return [c.output for c in codes]  # type: ignore[misc]
        outputs = []
        async with gate:
            session = await sandbox.session()
            try:
                for code in codes:
                    if code.output is not None:
                        outputs.append(code.output)
                        continue
                    result = await run_demo_block(session, code, max_chars)
                    if result.status != "ok":
                        raise RuntimeError(
                            f"demonstration code for task {name} failed ({code.tool} block,"
                            f" {result.status}): {result.output}"
                        )
                    outputs.append(result.output)
            finally:
                await session.close()
        bar.update()
        return outputs

    try:
        return list(await asyncio.gather(*(one(p, n) for p, n in zip(parts_list, names))))
    finally:
        bar.close()


async def run_demo_block(session, code: Code, max_chars: int):
    """Run one block in `session` with its tool's own runner (`tirl.tools.Tool.run`, what a
    rollout calls), showing at most `max_chars` of output: a `ToolResult`."""

    async def opened():
        return session

    return await TOOLS[code.tool].run(code.source, ToolContext(opened, max_chars))
