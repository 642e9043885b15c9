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

Tools: a protocol detects the blocks of one or more tools (`blocks`, one `ToolBlock` each:
the tool's name and its opening and closing markers). Without `blocks` it has the one Python
block (`code_open` / `code_close`), as before tools existed; `tirl.tools.toolset_protocol` gives
the blocks of the run's tools, and of the registered tools the run did not enable
(`ToolBlock.enabled` False: detected, then refused). Whatever tool a block is for, its answer is
written in the same output block and is the same kind of tool segment.

How another tool's block is written follows from the protocol's `shape` and a short word the
tool declares for that shape (`tool_markers`): markdown fences write the block for word `w` as
```` ```w\\n ... \\n``` ```` (the shell tool's ```` ```bash ````), tags as `<w>\\n ... \\n</w>`
(`<bash>`). So a new protocol of either shape writes every tool's block without a tool being
edited. A protocol of neither shape (`shape` None) has only its own Python block. A call
protocol (`Shape.CALLS`, `tirl.protocol.calls`: `hermes_tools`) has one block for every tool,
holding a JSON call that names the tool; it overrides the few hooks here that say which tool a
block is for (`closed_call`, `call_error`) and how its answer is written for a tokenizer
(`for_tokenizer`, `encode_output`), which for fences and tags are as they always were.

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

from tirl.protocol.tokens import encode_wrapped

DEFAULT_TOOL = "python"  # the tool a protocol's own code block is for


@dataclass(frozen=True)
class ToolBlock:
    """How a block for tool `tool` is written: `open + code + close`. A block that is not
    `enabled` is still detected (it ends the model's turn like any other), but it is answered
    with one line instead of being run (`tirl.tools`)."""

    tool: str
    open: str
    close: str
    enabled: bool = True
    # Call protocols (`Shape.CALLS`, `tirl.protocol.calls`): the call arguments that may carry
    # the code, the first the one its function declares (and demonstrations write).
    arguments: tuple[str, ...] = ()


class Shape(str, Enum):
    """How a protocol writes a tool's block from the word the tool declares (`tool_markers`)."""

    FENCES = "fences"  # ```word\n ... \n```
    TAGS = "tags"  # <word>\n ... \n</word>
    # one call block for every tool, the call inside names the tool (`tirl.protocol.calls`)
    CALLS = "calls"


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
    Another tool's block is written from the word the tool declares for `shape`
    (`tool_markers`).
    """

    name: str
    code_open: str
    code_close: str
    output_open: str
    output_close: str
    boundary: Boundary = Boundary.EXACT_MATCH
    blocks: tuple[ToolBlock, ...] = ()  # () = the one Python block, code_open + code_close
    shape: Shape | None = None  # how other tools' blocks are written; None: Python's only
    # How a demonstration wraps the reasoning before a block (AgentMath's <think>...</think>);
    # None: plain text. The rollout reads any text the model writes alike.
    reasoning: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:  # a plugin may write the shape as its string ("tags")
            object.__setattr__(self, "shape", Shape(self.shape))
        if not self.stop_marker:
            raise ValueError(f"protocol {self.name!r}: output_open has no stop marker")
        names = [b.tool for b in self.blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"protocol {self.name!r}: a tool has two blocks ({names})")
        self._check_blocks()

    def _check_blocks(self) -> None:
        opens = [b.open for b in self.tool_blocks]
        for i, a in enumerate(opens):  # one opener inside another would make blocks ambiguous
            if any(a in b or b in a for b in opens[i + 1 :]):
                raise ValueError(f"protocol {self.name!r}: block openers overlap ({opens})")

    @property
    def tool_blocks(self) -> tuple[ToolBlock, ...]:
        """The blocks this protocol detects: `blocks`, or the one Python block."""
        return self.blocks or (ToolBlock(DEFAULT_TOOL, self.code_open, self.code_close),)

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(b.tool for b in self.tool_blocks)

    @property
    def enabled_tools(self) -> tuple[str, ...]:
        """The tools whose blocks run (the others' blocks are detected and refused)."""
        return tuple(b.tool for b in self.tool_blocks if b.enabled)

    def tool_markers(self, word: str) -> tuple[str, str] | None:
        """(open, close) of the block a tool names `word` in this protocol's shape, or None
        when the protocol has no shape (only its own Python block)."""
        if self.shape is Shape.FENCES:
            return f"```{word}\n", "\n```"
        if self.shape is Shape.TAGS:
            return f"<{word}>\n", f"\n</{word}>"
        return None

    def with_blocks(self, blocks: tuple[ToolBlock, ...]) -> Protocol:
        """The same protocol detecting `blocks` (the tools' blocks of a run)."""
        return dataclasses.replace(self, blocks=tuple(blocks))

    @property
    def stop_marker(self) -> str:
        """What the model must write after a closed block in stop-token mode."""
        return self.output_open.strip()

    @property
    def server_stop(self) -> tuple[str, ...]:
        """Strings a completions server should stop at; the boundary is then checked locally.

        Exact match stops at the closing markers (CIR fences: "```" for every tool, as
        `OpenAIEngine` does today; tags: one per tool); stop-token mode at the stop marker,
        which a stop at "```" alone would run past.
        """
        if self.boundary is Boundary.EXACT_MATCH:
            return tuple(dict.fromkeys(b.close.strip() for b in self.tool_blocks))
        return (self.stop_marker,)

    def with_boundary(self, boundary: Boundary | str) -> Protocol:
        return dataclasses.replace(self, boundary=Boundary(boundary))

    @cached_property
    def _patterns(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        return tuple(
            (b.tool, re.compile(re.escape(b.open) + "(.*?)" + re.escape(b.close), re.DOTALL))
            for b in self.tool_blocks
        )

    def closed_call(self, text: str) -> tuple[str, str] | None:
        """(tool, code) of the block that `text` has just finished, or None.

        `text` is what the model generated since the last tool output. Exact match: the
        complete block that closed first (the earliest end; for one tool this is the first
        block), so growing the text chunk by chunk finds the same block as reading it whole.
        Stop token: the first-closed complete block followed (after whitespace only) by the
        stop marker; a closed block without it is never run.
        """
        matches = sorted(
            (
                (m.end(), m.start(), tool, m.group(1))
                for tool, p in self._patterns
                for m in p.finditer(text)
            ),
        )
        for end, _, tool, code in matches:
            if self.boundary is Boundary.EXACT_MATCH:
                return tool, code
            if text[end:].lstrip().startswith(self.stop_marker):
                return tool, code
        return None

    def call_error(self, tool: str, code: str) -> str | None:
        """Why a block `closed_call` found cannot run (one line, the model's answer), or None.
        None here: every block of a fence or tag protocol is a call. A call protocol's block
        holds a structured call that can be malformed (`tirl.protocol.calls`)."""
        return None

    def closed_block(self, text: str) -> str | None:
        """The code of the block that `text` has just finished (any tool's), or None."""
        call = self.closed_call(text)
        return None if call is None else call[1]

    def block_for(self, tool: str) -> ToolBlock:
        for b in self.tool_blocks:
            if b.tool == tool:
                return b
        raise KeyError(f"protocol {self.name!r} has no block for tool {tool!r}")

    def _marker_end(self) -> int:
        return self.output_open.index(self.stop_marker) + len(self.stop_marker)

    def render_output(self, output: str) -> str:
        """The tool segment's text after a block: the interpreter's answer, or a notice."""
        if self.boundary is Boundary.EXACT_MATCH:
            return f"{self.output_open}{output}{self.output_close}"
        return f"{self.output_open[self._marker_end() :]}{output}{self.output_close}"

    def encode_output(self, tokenizer, output: str) -> list[int]:
        """The tool segment's ids for `output`: `render_output(output)` tokenized on its own,
        the output's special-token spellings kept as text (`tirl.protocol.tokens`). A special
        token spelt in the protocol's own markers (a chat template's turn end) is that token."""
        text = self.render_output(output)  # head + output + output_close
        head = text[: len(text) - len(self.output_close) - len(output)]
        return encode_wrapped(tokenizer, head, output, self.output_close)

    def for_tokenizer(self, tokenizer) -> Protocol:
        """This protocol as it is written for `tokenizer`'s model: itself here; a call protocol
        takes its tool answer's markers from the tokenizer's chat template."""
        return self

    def render_code(self, code: str, tool: str = DEFAULT_TOOL) -> str:
        """A block as a demonstration writes it (with the stop marker in stop-token mode)."""
        b = self.block_for(tool)
        block = f"{b.open}{code}{b.close}"
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
    shape=Shape.FENCES,
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
