"""Teacher-free demonstrations for the arithmetic items (`tirl.envs.arithmetic.ArithmeticItem`).

Thin helpers over `tirl.tasks.prompts` (the plain prompt) and `tirl.tasks.demos` (parts to
token trajectories), kept for the callers that work with `ArithmeticItem`s. A code-integrated
demonstration is the code that computes the answer, the real output of the sandbox (through the
one shared formatter, architecture.md invariant 4), and the boxed answer. A text-only demonstration
states the boxed answer directly. Each segment is tokenized on its own, exactly as a rollout
would produce it (see `tirl.tasks.demos`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tirl.envs.arithmetic import ArithmeticItem
from tirl.protocol.fences import CIR_FENCES, Protocol
from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.protocol.tokens import encode_literal
from tirl.tasks.base import Code, DemoPart, Think
from tirl.tasks.demos import demo_segment_texts, demo_trajectory, run_demo_codes
from tirl.tasks.prompts import PLAIN_TEMPLATE, PromptRenderer
from tirl.tasks.sources.arithmetic import ANSWER_TEMPLATE, TEXT_ANSWER_TEMPLATE

__all__ = [
    "ANSWER_TEMPLATE",
    "TEXT_ANSWER_TEMPLATE",
    "code_demonstrations",
    "code_for",
    "demonstration_texts",
    "prompt_for",
    "run_codes",
    "text_demonstrations",
    "text_only_texts",
    "to_trajectory",
]


def prompt_for(task: ArithmeticItem) -> str:
    return PLAIN_TEMPLATE.format(problem=task.question)


def code_for(task: ArithmeticItem) -> str:
    return f"print({task.expression})"


def code_parts(task: ArithmeticItem, output: str) -> list[DemoPart]:
    """The code, then the answer copied from the interpreter's output."""
    return [Code(code_for(task), output), Think(ANSWER_TEMPLATE.format(answer=output))]


def demonstration_texts(
    task: ArithmeticItem, output: str, protocol: Protocol = CIR_FENCES
) -> list[tuple[SegmentKind, str]]:
    """The (kind, text) segments of a code-integrated demonstration. The text is the same in
    both boundary modes; in stop-token mode the model's segment also writes the stop marker
    (CIR Figure 1a), so a policy fine-tuned on it learns to ask for execution."""
    segments = demo_segment_texts(protocol, code_parts(task, output), [output])
    return [(SegmentKind.PROMPT, prompt_for(task)), *segments]


def text_only_texts(task: ArithmeticItem) -> list[tuple[SegmentKind, str]]:
    return [
        (SegmentKind.PROMPT, prompt_for(task)),
        (SegmentKind.MODEL, TEXT_ANSWER_TEMPLATE.format(answer=task.answer)),
    ]


def to_trajectory(parts: Sequence[tuple[SegmentKind, str]], tokenizer, meta: dict) -> Trajectory:
    """Tokenize each (kind, text) segment on its own (model and tool text with special-token
    spellings kept as text, as `tirl.tasks.demos` does) and end the last segment with
    end-of-sequence."""
    segments = [
        Segment(
            kind,
            tokenizer(text, add_special_tokens=False)["input_ids"]
            if kind is SegmentKind.PROMPT
            else encode_literal(tokenizer, text),
            text,
        )
        for kind, text in parts
    ]
    segments[-1].ids.append(tokenizer.eos_token_id)
    return Trajectory(segments=segments, meta=meta)


async def run_codes(
    sandbox, tasks: Sequence[ArithmeticItem], max_chars: int, concurrency: int = 16
) -> list[str]:
    """The model-visible output of each task's code, run in the sandbox."""
    outputs = await run_demo_codes(
        sandbox,
        [[Code(code_for(t))] for t in tasks],
        max_chars,
        names=[repr(t.question) for t in tasks],
        concurrency=concurrency,
    )
    return [out for (out,) in outputs]


def code_demonstrations(
    tasks: Sequence[ArithmeticItem],
    outputs: Sequence[str],
    tokenizer,
    protocol: Protocol = CIR_FENCES,
) -> list[Trajectory]:
    renderer = PromptRenderer(tokenizer, protocol, chat=False)
    return [
        demo_trajectory(
            renderer, task.question, code_parts(task, output), [output], {"question": task.question}
        )
        for task, output in zip(tasks, outputs)
    ]


def text_demonstrations(tasks: Sequence[ArithmeticItem], tokenizer) -> list[Trajectory]:
    renderer = PromptRenderer(tokenizer, CIR_FENCES, chat=False)
    return [
        demo_trajectory(
            renderer,
            t.question,
            [Think(TEXT_ANSWER_TEMPLATE.format(answer=t.answer))],
            [],
            {"question": t.question},
        )
        for t in tasks
    ]
