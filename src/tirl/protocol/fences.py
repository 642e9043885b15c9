"""Code-block protocols, and CIR's markdown fences with exact-match boundaries (CIR §2.3.2).

A `Protocol` says how the model writes code, how the interpreter's answer is shown to it, and
when a block counts as finished (the boundary mode):

- exact match (CIR Figure 1b, the default): the block runs the moment its closing marker
  appears in the text the model generated; no stop token is needed.
- stop token (CIR Figure 1a): the block runs only once the model writes an explicit stop
  marker right after it (the opening of the output block, e.g. ```` ```output ````). A model
  that closes the block but never writes the marker gets nothing run: the missed execution
  CIR attributes to this mode.

CIR's fences (`CIR_FENCES`, defined here) are the default; AgentMath's tags are in
`tirl.protocol.tags`. In exact-match mode with CIR's fences a trajectory reads

    <model>  ```python\\nprint(483 * 917)\\n```
    <tool>   \\n```output\\n442911\\n```\\n
    <model>  The answer is \\boxed{442911}.<eos>

and in stop-token mode the model itself writes the ```` \\n```output ```` marker, so the tool
segment starts after it; the text is the same, only the split between model and tool moves.

Only detection and rendering live here; driving a model and a sandbox is `tirl.rollout`.
Not covered: markers written with other spacing than the protocol's (a block opened with
```` ```py ```` or ```` ``` python ```` is not code under exact match, by design).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import Enum
from functools import cached_property


class Boundary(str, Enum):
    """When a closed code block runs."""

    EXACT_MATCH = "exact_match"  # as soon as its closing marker is in the text
    STOP_TOKEN = "stop_token"  # only once the stop marker follows the closed block


@dataclass(frozen=True)
class Protocol:
    """How code and tool output are written, and the boundary mode.

    A code block is `code_open + code + code_close`; tool output is rendered as
    `output_open + output + output_close`. The stop marker (stop-token mode) is `output_open`
    without its surrounding whitespace: the model opens the output block itself, and the tool
    writes the rest. In both modes `render_code(c) + render_output(o)` is the same text.
    """

    name: str
    code_open: str
    code_close: str
    output_open: str
    output_close: str
    boundary: Boundary = Boundary.EXACT_MATCH

    def __post_init__(self) -> None:
        if not self.stop_marker:
            raise ValueError(f"protocol {self.name!r}: output_open has no stop marker")

    @property
    def stop_marker(self) -> str:
        """What the model must write after a closed block in stop-token mode."""
        return self.output_open.strip()

    @property
    def server_stop(self) -> tuple[str, ...]:
        """Strings a completions server should stop at; the boundary is then checked locally.

        Exact match stops at the closing marker (CIR fences: "```", as `OpenAIEngine` does
        today); stop-token mode at the stop marker, which a stop at "```" alone would run past.
        """
        if self.boundary is Boundary.EXACT_MATCH:
            return (self.code_close.strip(),)
        return (self.stop_marker,)

    def with_boundary(self, boundary: Boundary | str) -> Protocol:
        return dataclasses.replace(self, boundary=Boundary(boundary))

    @cached_property
    def _block(self) -> re.Pattern[str]:
        return re.compile(
            re.escape(self.code_open) + "(.*?)" + re.escape(self.code_close), re.DOTALL
        )

    def closed_block(self, text: str) -> str | None:
        """The code of the block that `text` has just finished, or None.

        `text` is what the model generated since the last tool output. Exact match: the first
        complete block. Stop token: the first complete block followed (after whitespace only)
        by the stop marker; a closed block without it is never run.
        """
        if self.boundary is Boundary.EXACT_MATCH:
            match = self._block.search(text)
            return match.group(1) if match else None
        for match in self._block.finditer(text):
            if text[match.end() :].lstrip().startswith(self.stop_marker):
                return match.group(1)
        return None

    def _marker_end(self) -> int:
        return self.output_open.index(self.stop_marker) + len(self.stop_marker)

    def render_output(self, output: str) -> str:
        """The tool segment's text after a block: the interpreter's answer, or a notice."""
        if self.boundary is Boundary.EXACT_MATCH:
            return f"{self.output_open}{output}{self.output_close}"
        return f"{self.output_open[self._marker_end() :]}{output}{self.output_close}"

    def render_code(self, code: str) -> str:
        """A block as a demonstration writes it (with the stop marker in stop-token mode)."""
        block = f"{self.code_open}{code}{self.code_close}"
        if self.boundary is Boundary.EXACT_MATCH:
            return block
        return block + self.output_open[: self._marker_end()]


CODE_OPEN = "```python\n"
CODE_CLOSE = "\n```"

CIR_FENCES = Protocol(
    name="cir_fences",
    code_open=CODE_OPEN,
    code_close=CODE_CLOSE,
    output_open="\n```output\n",
    output_close="\n```\n",
)


def closed_code_block(text: str) -> str | None:
    """The code of the first complete ```python block in `text`, or None (CIR, exact match).

    `text` is what the model generated since the last tool output, so a complete block
    here is the one that has just closed.
    """
    return CIR_FENCES.closed_block(text)


def render_tool_output(output: str) -> str:
    """The text appended after a code block: the interpreter's answer in an output fence."""
    return CIR_FENCES.render_output(output)


def render_code(code: str) -> str:
    return CIR_FENCES.render_code(code)
