"""Tool calls in the chat model's own format: Hermes / Qwen2.5 `<tool_call>` JSON.

Instruction-tuned models call tools the way their chat template renders an assistant's
`tool_calls` (the `tools=[...]` of `apply_chat_template`). Qwen2.5's template, after the Hermes
function-calling format, writes one call as

    <tool_call>\\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\\n</tool_call>

and a tool's answer as a user turn holding `<tool_response>`. `HERMES_TOOLS` (registered as
`hermes_tools`) is that format as a tirl protocol (`CallProtocol`, shape `Shape.CALLS`): every
tool shares the one `<tool_call>` block, and which tool runs is the call's `name`; its code is
the argument the tool declares (`tirl.tools.Tool.code_arguments`: Python's `code`, the shell's
`script`). A trajectory in exact-match mode reads

    <model>  <tool_call>\\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\\n</tool_call>
    <tool>   <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n42\\n</tool_response><|im_end|>\\n
             <|im_start|>assistant\\n
    <model>  The answer is \\boxed{42}.<|im_end|>

The model's tokens end with its `</tool_call>`; the end of its turn, the tool turn and the
opening of its next turn are the tool segment (masked from the loss, architecture.md invariant
2), tokenized with the template's special tokens (`Protocol.encode_output`) and the output as
text. The tool turn's markers come from the tokenizer's chat template where it renders tool
calls and tool messages (`template_response_markers`: a conversation with a placeholder tool
answer is rendered and split around it); where it does not (SmolLM2's plain ChatML template, a
tokenizer with no template such as the tiny test model's), they are the Hermes strings above.

A call that cannot run (not JSON, no `name`, a name that is no tool of the run, its code
argument missing) still ends the model's turn: it is answered with one line (`call_error`) as
tool output, ToolCall status "error", tool `INVALID_CALL`, and the trajectory goes on.

Not covered: several calls answered in one tool turn (each call runs when it closes and gets
its own turn, as in exact match every block does); templates whose calls are not this JSON
(Llama 3's `<|python_tag|>`, Mistral's `[TOOL_CALLS]`). Stop-token mode asks the model to write
the tool turn's opening itself; with a chat template's special tokens in it that opening is not
text the rollout can see, so a chat tokenizer refuses it (`for_tokenizer`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from functools import cached_property

from tirl.protocol.fences import DEFAULT_TOOL, Boundary, Protocol, Shape, ToolBlock

INVALID_CALL = "invalid_call"  # ToolCall.tool of a call that names no tool or cannot be read
PYTHON_ARGUMENT = "code"  # the Python function's argument (`tirl.tools.python`)
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
_PLACEHOLDER = "TIRL-TOOL-OUTPUT-7d1f"  # a tool answer the template renders, then split at


@dataclass(frozen=True)
class CallProtocol(Protocol):
    """A protocol whose one block (`code_open` ... `code_close`) holds a JSON call
    `{"name": tool, "arguments": {...}}` for any tool (see the module doc)."""

    def _check_blocks(self) -> None:
        for b in self.tool_blocks:  # one block for every tool: the call names the tool
            if (b.open, b.close) != (self.code_open, self.code_close):
                raise ValueError(f"protocol {self.name!r}: tool {b.tool!r} has its own block")

    @property
    def tool_blocks(self) -> tuple[ToolBlock, ...]:
        default = ToolBlock(DEFAULT_TOOL, self.code_open, self.code_close, True, (PYTHON_ARGUMENT,))
        return self.blocks or (default,)

    def tool_markers(self, word: str) -> tuple[str, str]:
        return self.code_open, self.code_close

    @cached_property
    def _patterns(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        pattern = re.escape(self.code_open) + "(.*?)" + re.escape(self.code_close)
        return (("", re.compile(pattern, re.DOTALL)),)

    def closed_call(self, text: str) -> tuple[str, str] | None:
        """(tool, code) of the call that `text` has just finished, or None; a call that cannot
        run is (`INVALID_CALL`, the block's text)."""
        found = super().closed_call(text)
        if found is None:
            return None
        decoded = self._decode(found[1])
        return (INVALID_CALL, found[1]) if isinstance(decoded, str) else decoded

    def call_error(self, tool: str, code: str) -> str | None:
        if tool != INVALID_CALL:
            return None
        decoded = self._decode(code)
        return decoded if isinstance(decoded, str) else None

    def function_calls(self, text: str) -> list[tuple[int, str, dict]] | None:
        """Every complete block of `text` as (its start, the function's name, its arguments),
        in order; None when there is none or one of them is not a call (`parse_call`): how
        `tirl serve` reads a completion's calls (`tirl.apps.server_tools`)."""
        calls = []
        for _, pattern in self._patterns:
            for m in pattern.finditer(text):
                call = parse_call(m.group(1))
                if isinstance(call, str):
                    return None
                calls.append((m.start(), *call))
        return calls or None

    def function_call_text(self, name: str, arguments: dict) -> str:
        """The JSON of a call of function `name` with `arguments`, as Qwen2.5's template
        writes it (`{"name": ..., "arguments": ...}`, json.dumps' spacing)."""
        return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)

    def render_call(self, name: str, arguments: dict) -> str:
        """A call block of function `name` (any function, not only a tool of the run), as a
        model writes it in exact-match mode."""
        return f"{self.code_open}{self.function_call_text(name, arguments)}{self.code_close}"

    def _decode(self, body: str) -> tuple[str, str] | str:
        """(tool, code) of a call's JSON, or the one line that says why it cannot run."""
        known = ", ".join(self.tool_names)
        call = parse_call(body, strict=False)
        if isinstance(call, str):
            return call
        name, arguments = call
        if name not in self.tool_names:
            return f"Invalid tool call: no tool named {name!r} (tools: {known}); nothing was run."
        wanted = self.block_for(name).arguments or (PYTHON_ARGUMENT,)
        arguments = arguments if isinstance(arguments, dict) else {}
        code = next((arguments[k] for k in wanted if isinstance(arguments.get(k), str)), None)
        if code is None:
            return (
                f"Invalid tool call: {name} needs its {wanted[0]!r} argument as a string;"
                " nothing was run."
            )
        return name, code

    def call_text(self, code: str, tool: str = DEFAULT_TOOL) -> str:
        """The JSON of a call of `tool` with `code`, as Qwen2.5's template writes it."""
        return self.function_call_text(tool, {self.block_for(tool).arguments[0]: code})

    def render_code(self, code: str, tool: str = DEFAULT_TOOL) -> str:
        return super().render_code(self.call_text(code, tool), tool)

    def for_tokenizer(self, tokenizer) -> Protocol:
        """This protocol with its tool turn's markers as `tokenizer`'s chat template writes
        them (`template_response_markers`), or as registered where the template has none.
        ValueError in stop-token mode when the stop marker holds a special token."""
        markers = template_response_markers(tokenizer, self)
        protocol = self
        if markers is not None and markers != (self.output_open, self.output_close):
            protocol = dataclasses.replace(self, output_open=markers[0], output_close=markers[1])
        if protocol.boundary is Boundary.STOP_TOKEN:
            specials = [t for t in tokenizer.all_special_tokens if t and t in protocol.stop_marker]
            if specials:
                raise ValueError(
                    f"protocol {self.name!r} in stop_token mode needs a stop marker the model"
                    f" writes as text; for this tokenizer it holds {specials[0]!r} (use"
                    " exact_match)"
                )
        return protocol


def parse_call(body: str, strict: bool = True) -> tuple[str, dict] | str:
    """(name, arguments) of a call block's JSON `{"name": ..., "arguments": {...}}`, or the
    one line that says why it is not a call. The arguments may come as a JSON string (the
    OpenAI wire format); `strict`: they must then be an object (missing: {}), else anything
    that is not an object counts as none (the rollout then names the missing argument)."""
    try:
        call = json.loads(body)
    except ValueError as e:
        return f"Invalid tool call: not JSON ({e}); nothing was run."
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'Invalid tool call: expected {"name": ..., "arguments": {...}}; nothing was run.'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        if strict:
            return "Invalid tool call: its arguments are not a JSON object; nothing was run."
        arguments = {}
    return call["name"], arguments


def template_response_markers(tokenizer, protocol: CallProtocol) -> tuple[str, str] | None:
    """(output_open, output_close) of a tool answer as `tokenizer`'s chat template writes it
    after a call, or None when the template cannot say (none, one that fails on tool messages,
    or one that does not write the call exactly as `protocol` does).

    The template renders [user, assistant calling Python] and the same followed by a tool
    message holding a placeholder, with the assistant's next turn opened: the opening is what
    follows the call's `</tool_call>` up to the placeholder (the turn end, the tool turn's
    opening), the close what follows the placeholder (to the next assistant turn's opening)."""
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None
    code = "print(1)"
    arguments = {PYTHON_ARGUMENT: code}
    call = {"type": "function", "function": {"name": DEFAULT_TOOL, "arguments": arguments}}
    user = {"role": "user", "content": "Q"}
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    tool = {"role": "tool", "name": DEFAULT_TOOL, "content": _PLACEHOLDER}
    try:
        before = tokenizer.apply_chat_template([user, assistant], tokenize=False)
        after = tokenizer.apply_chat_template(
            [user, assistant, tool], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that refuses tool messages: the registered markers
        return None
    block = protocol.with_boundary(Boundary.EXACT_MATCH).render_code(code)
    if block not in before or not after.startswith(before) or after.count(_PLACEHOLDER) != 1:
        return None
    turn_end = before[before.rindex(block) + len(block) :]
    head, tail = after[len(before) :].split(_PLACEHOLDER)
    if not (turn_end + head).strip():
        return None  # the answer would not be marked off from the model's text at all
    return turn_end + head, tail


HERMES_TOOLS = CallProtocol(
    name="hermes_tools",
    code_open=CALL_OPEN,
    code_close=CALL_CLOSE,
    output_open="<|im_end|>\n<|im_start|>user\n<tool_response>\n",
    output_close="\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    shape=Shape.CALLS,
)
