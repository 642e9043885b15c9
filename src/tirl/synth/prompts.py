"""What the teacher and the judge are asked, and how the judge's answer is read.

Prompts follow AgentMath §3.1: code-ify compute-heavy steps only (simple arithmetic stays text,
so the model does not learn to call the tool for everything), show each block's output as the
teacher expects it (a simulation, replaced later by the real output), and end with a boxed
answer. The judge sees, for each block whose real output differs from the simulated one, the
code, the real output and the reasoning that follows, and answers one verdict per block. A
synth run's tools other than Python are announced by each tool's own note (`Tool.synth_note`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tirl.protocol import AGENTMATH_TAGS
from tirl.tools import DEFAULT_TOOLS, TOOLS

CODEIFY_SYSTEM = """\
You rewrite step-by-step math solutions into tool-integrated solutions.
Keep the reasoning. Replace compute-heavy steps (big arithmetic, algebra, enumeration, solving)
with Python code; keep simple arithmetic as text. Write each code block as
<code>
...python...
</code>
immediately followed by the output you expect it to print:
<interpreter>
...output...
</interpreter>
Code blocks share one interpreter session (variables persist). Every block must print what the
next step uses. Put reasoning in <think>...</think>. End with the final answer as \\boxed{...}."""

SELF_CORRECT_SYSTEM = """\
A tool-integrated solution stopped because its last code block failed; the interpreter's error is
shown. Continue the solution: first diagnose the error in one or two sentences, then write the
fixed code in a new <code> block (followed by its expected <interpreter> output), then continue
reasoning to the final answer as \\boxed{...}. Use the same tags; write only the continuation."""

JUDGE_SYSTEM = """\
You check tool-integrated solutions. For each numbered code block you get the code, the real
interpreter output, and the reasoning written after it. Say whether that reasoning is consistent
with the real output. Answer with one line per block, exactly "N: AGREE" or "N: DISAGREE"."""

_VERDICT = re.compile(r"^\s*(\d+)\s*[:.)]\s*(AGREE|DISAGREE)\b", re.MULTILINE | re.IGNORECASE)


def _with_tools(system: str, tools: Sequence[str]) -> str:
    """`system` followed, one line each, by the notes of the enabled tools that carry one
    (`Tool.synth_note`, with the tool's markers in AgentMath's tags, which these prompts use;
    the Python tool needs none: the prompts are about it)."""
    notes = [TOOLS[name].with_markers(TOOLS[name].synth_note, AGENTMATH_TAGS) for name in tools]
    return system + "".join(f"\n{note}" for note in notes if note)


# Worked examples of the rewrite: (problem, chain of thought, tool-integrated solution). AgentMath
# prompts its 671B teacher without any; a small teacher needs to see the tags used before it
# writes them (SmolLM2-135M wrote no code block for 32 of 32 problems without). Each is written
# by hand, keeps the simple step as text, and its outputs are what its code prints (tested).
CODEIFY_EXAMPLES: tuple[tuple[str, str, str], ...] = (
    (
        "A shop packs 17 boxes of 24 pencils and sells 45 pencils. How many pencils are left?",
        "The shop has 17 * 24 = 408 pencils.\nAfter selling 45 it has 408 - 45 = 363.\n"
        "The answer is \\boxed{363}.",
        "<think>First count the pencils in the boxes.</think>\n"
        "<code>\ntotal = 17 * 24\nprint(total)\n</code>\n<interpreter>\n408\n</interpreter>\n"
        "<think>408 pencils, and 45 are sold.</think>\n"
        "<code>\nprint(total - 45)\n</code>\n<interpreter>\n363\n</interpreter>\n"
        "<think>363 pencils are left.</think>\n\\boxed{363}",
    ),
    (
        "Calculate 347 * 29 - 118.",
        "347 * 29 = 10063, and 10063 - 118 = 9945.\nThe answer is \\boxed{9945}.",
        "<think>Compute the expression.</think>\n"
        "<code>\nprint(347 * 29 - 118)\n</code>\n<interpreter>\n9945\n</interpreter>\n"
        "<think>The result is 9945.</think>\n\\boxed{9945}",
    ),
    (
        "Ana saves $35 a week for 12 weeks, then spends $2 on a pen. How much does she keep?",
        "She saves 35 * 12 = 420 dollars.\nAfter the pen she keeps 420 - 2 = 418.\n"
        "The answer is \\boxed{418}.",
        "<code>\nsaved = 35 * 12\nprint(saved)\n</code>\n<interpreter>\n420\n</interpreter>\n"
        "<think>She saves 420 dollars; after the $2 pen she keeps 420 - 2 = 418.</think>\n"
        "\\boxed{418}",
    ),
)


def codeify_messages(
    problem: str, cot: str, tools: Sequence[str] = DEFAULT_TOOLS, examples: int = 0
) -> list[dict[str, str]]:
    """The rewrite request, after the first `examples` of CODEIFY_EXAMPLES as earlier turns."""
    system = _with_tools(CODEIFY_SYSTEM, tools)
    messages = [{"role": "system", "content": system}]
    for shown_problem, shown_cot, rewritten in CODEIFY_EXAMPLES[:examples]:
        messages.append({"role": "user", "content": _codeify_request(shown_problem, shown_cot)})
        messages.append({"role": "assistant", "content": rewritten})
    messages.append({"role": "user", "content": _codeify_request(problem, cot)})
    return messages


def _codeify_request(problem: str, cot: str) -> str:
    return f"Problem:\n{problem}\n\nSolution to rewrite:\n{cot}"


def self_correct_messages(
    problem: str, partial: str, tools: Sequence[str] = DEFAULT_TOOLS
) -> list[dict[str, str]]:
    user = f"Problem:\n{problem}\n\nSolution so far:\n{partial}"
    system = _with_tools(SELF_CORRECT_SYSTEM, tools)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def judge_messages(problem: str, blocks: list[tuple[str, str, str]]) -> list[dict[str, str]]:
    """blocks: (code, real output, reasoning after it), numbered from 1 in the prompt."""
    shown = "\n\n".join(
        f"Block {i}:\nCode:\n{code}\nReal output:\n{out}\nReasoning after it:\n{after}"
        for i, (code, out, after) in enumerate(blocks, 1)
    )
    user = f"Problem:\n{problem}\n\n{shown}"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_verdicts(text: str, n: int) -> list[bool] | None:
    """Agreement per block 1..n, or None when some block has no verdict."""
    found: dict[int, bool] = {}
    for m in _VERDICT.finditer(text):
        found.setdefault(int(m.group(1)), m.group(2).upper() == "AGREE")
    if any(i not in found for i in range(1, n + 1)):
        return None
    return [found[i] for i in range(1, n + 1)]
