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


def codeify_messages(
    problem: str, cot: str, tools: Sequence[str] = DEFAULT_TOOLS
) -> list[dict[str, str]]:
    user = f"Problem:\n{problem}\n\nSolution to rewrite:\n{cot}"
    system = _with_tools(CODEIFY_SYSTEM, tools)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


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
