"""AgentMath's tag protocol: `<think>` reasoning, `<code>` blocks, `<interpreter>` feedback.

AgentMath (§3) marks the three kinds of text with tags; the rollout treats `<think>` as free
model text, runs a `<code>` block once it closes, and shows the sandbox's answer inside
`<interpreter>` (a tool segment, loss-masked like CIR's output fence):

    <model>  <think>Multiply.</think>\\n<code>\\nprint(483 * 917)\\n</code>
    <tool>   \\n<interpreter>\\n442911\\n</interpreter>\\n
    <model>  The answer is \\boxed{442911}.<eos>

The paper does not fix the whitespace inside the tags; the newlines here are our choice, and
the match is exact (`<code>print(1)</code>` without them is not a block). In stop-token mode
the model must write `<interpreter>` after `</code>` itself (see `tirl.protocol.fences`). Its
shape is tags: another tool's block is `<word>` ... `</word>` (the shell tool's `<bash>`; the
paper has only Python, so a tag named after the tool's language, like the fence, is our choice).
"""

from __future__ import annotations

from tirl.protocol.fences import Protocol, Shape

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

AGENTMATH_TAGS = Protocol(
    name="agentmath_tags",
    code_open="<code>\n",
    code_close="\n</code>",
    output_open="\n<interpreter>\n",
    output_close="\n</interpreter>\n",
    shape=Shape.TAGS,
    reasoning=(THINK_OPEN, THINK_CLOSE),
)
