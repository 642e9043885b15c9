"""The pipeline's stages: each takes one `Item` and keeps it (maybe changed) or rejects it.

Order and why (AgentMath §3.1; the paper's three phases flattened into one chain):

1. decontaminate     n-gram overlap with benchmark problems            -> "contaminated"
2. codeify           the teacher rewrites the CoT with code blocks      (teacher request)
3. format            any known convention -> steps; unreadable rejected  -> the FormatError reason
4. execute           every block in one stateful sandbox session; a failure is rejected, or,
                     with self_correct on, the trajectory is cut after the failing block
5. self_correct      for cut trajectories only: the teacher diagnoses, fixes and continues; the
                     whole trajectory is executed again for real. It comes right after execute
                     (not last, as the paper lists it) so corrected trajectories get the same
                     output replacement, alignment, limits and answer check as the rest.
6. replace_outputs   shown output := real output (counts how many differed)
7. feedback_alignment blocks whose real output differs from the simulated one go to the judge;
                     a DISAGREE (or no readable verdict) rejects
8. code_limits       AST depth and line count per block (line count only for a tool whose
                     code is not Python source: `Tool.code_is_python`)
9. answer_check      \\boxed{} in the model's own text, verified against the reference answer

A stage returns `Outcome`: the item (None when rejected), the rejection reason, and notes
(counters summed into the report). Stages hold no per-run state beyond their shared `Context`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tirl.rewards.answer import extract_answer
from tirl.synth.config import SynthConfig
from tirl.synth.filters import ContaminationIndex, code_limit_reason, code_lines
from tirl.synth.formats import FormatError, model_text, parse_solution, render_parts
from tirl.synth.prompts import (
    codeify_messages,
    judge_messages,
    parse_verdicts,
    self_correct_messages,
)
from tirl.synth.records import Item, Step
from tirl.tools import TOOLS, ToolContext


@dataclass
class Outcome:
    item: Item | None
    reason: str | None = None
    notes: dict[str, int] = field(default_factory=dict)


def keep(item: Item, **notes: int) -> Outcome:
    return Outcome(item, None, notes)


def reject(reason: str, **notes: int) -> Outcome:
    return Outcome(None, reason, notes)


@dataclass
class Context:
    cfg: SynthConfig
    sandbox: Any = None  # a tirl.sandbox.SandboxClient
    teacher: Any = None  # a tirl.synth.client.ChatClient
    judge: Any = None
    index: ContaminationIndex | None = None


# --------------------------------------------------------------------------------- helpers


class _TimedSession:
    """A session whose cells run with the synth run's timeout: what a tool's runner is handed,
    so every tool's block runs under the same `sandbox.timeout_s`."""

    def __init__(self, session, timeout_s: float) -> None:
        self.session, self.timeout_s = session, timeout_s

    async def run(self, code: str):
        return await self.session.run(code, timeout_s=self.timeout_s)


async def execute_steps(sandbox, steps: list[Step], timeout_s: float, max_chars: int) -> int | None:
    """Run the code steps in order in one session, each with its tool's own runner (the path a
    rollout's blocks take: a shell step sees the files a Python step wrote), filling `real`
    (the text the model is shown) and `status`. Returns the index of the first block that
    failed without being marked `expected_error`, else None."""
    session = await sandbox.session()
    timed = _TimedSession(session, timeout_s)

    async def opened():
        return timed

    try:
        for i, step in enumerate(steps):
            if step.kind != "code":
                continue
            result = await TOOLS[step.tool].run(step.text, ToolContext(opened, max_chars))
            step.real, step.status = result.output, result.status
            if result.status != "ok" and not step.expected_error:
                return i
    finally:
        await session.close()
    return None


def _same_output(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip() == b.strip()


def _text_after(steps: list[Step], i: int) -> str:
    after = []
    for s in steps[i + 1 :]:
        if s.kind == "code":
            break
        after.append(s.text)
    return "\n".join(after)


def _partial_solution(item: Item) -> str:
    """The trajectory so far as the teacher reads it (AgentMath tags, outputs real)."""
    parts = render_parts(item.problem, item.steps, "agentmath_tags")
    return "".join(t for kind, t in parts[1:])


# ---------------------------------------------------------------------------------- stages


async def decontaminate(item: Item, ctx: Context) -> Outcome:
    if ctx.index is not None and ctx.index.contaminated(item.problem):
        return reject("contaminated")
    return keep(item)


async def codeify(item: Item, ctx: Context) -> Outcome:
    cfg = ctx.cfg
    messages = codeify_messages(item.problem, item.cot, cfg.tools, cfg.codeify_examples)
    item.raw = await ctx.teacher.chat(messages)
    return keep(item)


async def format_correct(item: Item, ctx: Context) -> Outcome:
    text = item.raw if item.raw is not None else item.cot
    try:
        item.steps = parse_solution(text, ctx.cfg.tools)
    except FormatError as e:
        return reject(e.reason)
    return keep(item)


async def execute(item: Item, ctx: Context) -> Outcome:
    sb = ctx.cfg.sandbox
    failed = await execute_steps(ctx.sandbox, item.steps, sb.timeout_s, sb.max_output_chars)
    if failed is None:
        return keep(item)
    if not ctx.cfg.stages.self_correct:
        return reject("unexecutable code")
    item.steps = item.steps[: failed + 1]
    item.steps[failed].expected_error = True
    item.failed_block = failed
    return keep(item, sent_to_self_correct=1)


async def self_correct(item: Item, ctx: Context) -> Outcome:
    if item.failed_block is None:
        return keep(item)
    messages = self_correct_messages(item.problem, _partial_solution(item), ctx.cfg.tools)
    reply = await ctx.teacher.chat(messages)
    try:
        continuation = parse_solution(reply, ctx.cfg.tools)
    except FormatError as e:
        return reject(f"correction unreadable: {e.reason}")
    steps = [Step(**{**vars(s), "real": None, "status": None}) for s in item.steps] + continuation
    sb = ctx.cfg.sandbox
    if await execute_steps(ctx.sandbox, steps, sb.timeout_s, sb.max_output_chars) is not None:
        return reject("correction still fails")
    if steps[item.failed_block].status == "ok":
        return reject("error did not reproduce")
    item.steps, item.failed_block = steps, None
    return keep(item, corrected=1)


async def replace_outputs(item: Item, ctx: Context) -> Outcome:
    changed = 0
    for step in item.code_steps:
        changed += not _same_output(step.simulated, step.real)
        step.output = step.real
    return keep(item, outputs_replaced=changed)


async def feedback_alignment(item: Item, ctx: Context) -> Outcome:
    # A block whose simulated output was right needs no judge: the reasoning was written for it.
    # A failing block kept for self-correction is followed by a diagnosis, not by use of it.
    checks = [
        (s.text, s.real or "", _text_after(item.steps, i))
        for i, s in enumerate(item.steps)
        if s.kind == "code" and not s.expected_error and not _same_output(s.simulated, s.real)
    ]
    if not checks:
        return keep(item)
    reply = await ctx.judge.chat(judge_messages(item.problem, checks))
    verdicts = parse_verdicts(reply, len(checks))
    if verdicts is None:
        return reject("judge verdict unreadable", judged_blocks=len(checks))
    if not all(verdicts):
        return reject("reasoning disagrees with output", judged_blocks=len(checks))
    return keep(item, judged_blocks=len(checks))


async def code_limits(item: Item, ctx: Context) -> Outcome:
    lim = ctx.cfg.limits
    for step in item.code_steps:
        if TOOLS[step.tool].code_is_python:
            why = code_limit_reason(step.text, lim.max_ast_depth, lim.max_lines, lim.min_ast_depth)
        else:  # no Python syntax tree to measure: the line count alone
            why = "too many lines" if code_lines(step.text) > lim.max_lines else None
        if why is not None and not step.expected_error:
            return reject(why)
    return keep(item)


async def answer_check(item: Item, ctx: Context) -> Outcome:
    from tirl.rewards.verify import default_verifier

    parts = render_parts(item.problem, item.steps, ctx.cfg.output_format)
    predicted = extract_answer(model_text(parts), ("boxed",))
    if predicted is None:
        return reject("missing answer")
    verdict = await default_verifier().averify(item.answer, predicted)
    return keep(item) if verdict.correct else reject("wrong answer")


STAGES = {
    "decontaminate": decontaminate,
    "codeify": codeify,
    "format": format_correct,
    "execute": execute,
    "self_correct": self_correct,
    "replace_outputs": replace_outputs,
    "feedback_alignment": feedback_alignment,
    "code_limits": code_limits,
    "answer_check": answer_check,
}
