"""CIR's markdown-fence protocol with exact-match code boundaries (CIR §2.3.2, Figure 1b).

The model writes a ```` ```python ```` block; the moment the closing fence appears in the
text it has generated, the block is complete and runs (no stop token needed). The
interpreter's answer is appended as an ```` ```output ```` block, tokenized on its own and
marked as a tool segment, and the model goes on.

    <model>  ```python\\nprint(483 * 917)\\n```
    <tool>   \\n```output\\n442911\\n```\\n
    <model>  The answer is \\boxed{442911}.<eos>

Only the detection and the rendering live here; driving a model and a sandbox is `tirl.rollout`.
"""

from __future__ import annotations

import re

CODE_OPEN = "```python\n"
CODE_CLOSE = "\n```"
_CLOSED_BLOCK = re.compile(r"```python\n(.*?)\n```", re.DOTALL)


def closed_code_block(text: str) -> str | None:
    """The code of the first complete ```python block in `text`, or None.

    `text` is what the model generated since the last tool output, so a complete block
    here is the one that has just closed.
    """
    match = _CLOSED_BLOCK.search(text)
    return match.group(1) if match else None


def render_tool_output(output: str) -> str:
    """The text appended after a code block: the interpreter's answer in an output fence."""
    return f"\n```output\n{output}\n```\n"


def render_code(code: str) -> str:
    return f"{CODE_OPEN}{code}{CODE_CLOSE}"
