"""Teacher-free demonstrations for the arithmetic tasks.

A code-integrated demonstration is the code that computes the answer, the real output of the
sandbox (through the one shared formatter, DESIGN.md invariant 4), and the boxed answer. A
text-only demonstration states the boxed answer directly. Each segment is tokenized on its
own, exactly as a rollout would produce it: the model's segments end where the rollout would
stop them, and the tool output is tokenized separately.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tqdm.auto import tqdm

from tirl.envs.arithmetic import ArithmeticItem
from tirl.protocol.fences import CIR_FENCES, Protocol
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.sandbox import Sandbox, Status, format_result

PROMPT_TEMPLATE = "Problem: {question}\nSolution:\n"
ANSWER_TEMPLATE = "The answer is \\boxed{{{answer}}}."
# Text-only answers are guesses; a different lead-in keeps a model that learns both styles
# from mixing "copy the interpreter's output" with "guess" at the same context.
TEXT_ANSWER_TEMPLATE = "My estimate is \\boxed{{{answer}}}."


def prompt_for(task: ArithmeticItem) -> str:
    return PROMPT_TEMPLATE.format(question=task.question)


def code_for(task: ArithmeticItem) -> str:
    return f"print({task.expression})"


def demonstration_texts(
    task: ArithmeticItem, output: str, protocol: Protocol = CIR_FENCES
) -> list[tuple[SegmentKind, str]]:
    """The (kind, text) segments of a code-integrated demonstration. The text is the same in
    both boundary modes; in stop-token mode the model's segment also writes the stop marker
    (CIR Figure 1a), so a policy fine-tuned on it learns to ask for execution."""
    return [
        (SegmentKind.PROMPT, prompt_for(task)),
        (SegmentKind.MODEL, protocol.render_code(code_for(task))),
        (SegmentKind.TOOL, protocol.render_output(output)),
        (SegmentKind.MODEL, ANSWER_TEMPLATE.format(answer=output)),
    ]


def text_only_texts(task: ArithmeticItem) -> list[tuple[SegmentKind, str]]:
    return [
        (SegmentKind.PROMPT, prompt_for(task)),
        (SegmentKind.MODEL, TEXT_ANSWER_TEMPLATE.format(answer=task.answer)),
    ]


def to_trajectory(parts: Sequence[tuple[SegmentKind, str]], tokenizer, meta: dict) -> Trajectory:
    """Tokenize each segment on its own and end the last model segment with end-of-sequence."""
    segments = [
        Segment(kind, tokenizer(text, add_special_tokens=False)["input_ids"], text)
        for kind, text in parts
    ]
    segments[-1].ids.append(tokenizer.eos_token_id)
    return Trajectory(segments=segments, meta=meta)


async def run_codes(
    sandbox: Sandbox, tasks: Sequence[ArithmeticItem], max_chars: int, concurrency: int = 16
) -> list[str]:
    """The model-visible output of each task's code, run in the sandbox."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(tasks), desc="sandbox: run demonstration code", leave=False)

    async def one(task: ArithmeticItem) -> str:
        async with gate:
            result = await sandbox.run_once(code_for(task))
        bar.update()
        if result.status is not Status.OK:
            raise RuntimeError(
                f"demonstration code for {task.question!r} failed: {format_result(result)}"
            )
        return format_result(result, max_chars=max_chars)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        bar.close()


def code_demonstrations(
    tasks: Sequence[ArithmeticItem],
    outputs: Sequence[str],
    tokenizer,
    protocol: Protocol = CIR_FENCES,
) -> list[Trajectory]:
    demos = []
    for task, output in zip(tasks, outputs):
        traj = to_trajectory(
            demonstration_texts(task, output, protocol), tokenizer, {"question": task.question}
        )
        traj.tool_calls.append(ToolCall(code_for(task), "ok", output))
        demos.append(traj)
    return demos


def text_demonstrations(tasks: Sequence[ArithmeticItem], tokenizer) -> list[Trajectory]:
    return [to_trajectory(text_only_texts(t), tokenizer, {"question": t.question}) for t in tasks]
