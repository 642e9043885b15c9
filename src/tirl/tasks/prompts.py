"""A task's problem as prompt tokens: plain text, or a chat template's user turn.

Plain (a base model, the quickstart's tiny model): the prompt is `PLAIN_TEMPLATE`'s text,
tokenized without special tokens, and the sequence ends with the tokenizer's end-of-sequence.

Chat (an instruction-tuned model): the prompt ids are exactly what
`tokenizer.apply_chat_template([system, user], add_generation_prompt=True, tokenize=True)`
returns, so the model sees its own template, never a re-tokenized rendering of it. Generation
continues inside the assistant turn; code blocks and interpreter output stay in that turn, and
the turn ends with the template's end token (Qwen's `<|im_end|>`), which is `eos_id`: the id the
engine must stop on and a demonstration ends with. The system message explains the run's
protocol (`DEFAULT_SYSTEM_PROMPTS`, or the `system` given).

Tools as functions: with a call protocol (`tirl.protocol.calls`, `hermes_tools`) the enabled
tools' function definitions (`tirl.tools.function_schemas`) are passed as the template's
`tools=`, so a template that lists tools (Qwen2.5's) shows them its own way; where the template
does not list them (SmolLM2's, the tiny model's) the system message, the default or a given
one, is followed by them in Hermes' format (`functions_note`), as Qwen2.5's template follows a
given system message with its tools; so `tirl serve`, given the same system message and the
functions as `tools`, renders the same prompt (`tirl.apps.server_tools`). A plain prompt's
given system message and an empty one ("": no system message) list none. The tool's answer is then a turn of its own, as the
template writes it (the call protocol's `for_tokenizer`); fence and tag protocols keep the
interpreter's answer inside the assistant turn, as CIR and AgentMath do.

Not covered: multi-turn conversations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tirl.config import ConfigError
from tirl.protocol import Boundary, Protocol, Shape, get_protocol
from tirl.tools import function_schemas, tools_prompt

PLAIN_TEMPLATE = "Problem: {problem}\nSolution:\n"

DEFAULT_SYSTEM_PROMPTS: Mapping[str, str] = {
    "cir_fences": (
        "Solve the problem step by step. You can run Python: write code in a block that starts"
        " with ```python on its own line and ends with ```. It runs as soon as the block is"
        " closed, in one interpreter that keeps its variables between blocks, and what it"
        " prints comes back in an ```output block.{stop} Use the results to reason further."
        " Give the final answer in the format the problem asks for, otherwise as \\boxed{{}}."
    ),
    "agentmath_tags": (
        "Solve the problem step by step. Reason inside <think></think>. You can run Python:"
        " write code between <code> and </code>, each on its own line. It runs as soon as"
        " </code> is written, in one interpreter that keeps its variables between blocks, and"
        " what it prints comes back inside <interpreter></interpreter>.{stop} Use the results"
        " to reason further. Give the final answer in the format the problem asks for,"
        " otherwise as \\boxed{{}}."
    ),
    "hermes_tools": (
        "Solve the problem step by step. You can run code by calling the functions you are"
        " given. A call runs as soon as </tool_call> is written, in one session that keeps"
        " Python's variables between calls, and what it prints comes back inside"
        " <tool_response></tool_response>.{stop} Use the results to reason further. Give the"
        " final answer in the format the problem asks for, otherwise as \\boxed{{}}."
    ),
}
STOP_TOKEN_NOTE = " To run a block, write {marker} right after it."
# How the functions are listed where the chat template does not list them (Hermes' format).
FUNCTIONS_NOTE = (
    "\n\nThe functions are described within <tools></tools>:\n<tools>\n{functions}\n</tools>\n"
    "For each call, write a JSON object with the function's name and arguments within"
    " <tool_call></tool_call> tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def default_system_prompt(protocol: Protocol, list_functions: bool = True) -> str:
    """The system message that explains `protocol` (its boundary mode included). A call
    protocol's message ends with its functions (`FUNCTIONS_NOTE`) unless `list_functions` is
    False (the chat template lists them)."""
    if protocol.name not in DEFAULT_SYSTEM_PROMPTS:
        raise ConfigError(
            f"no default system prompt for protocol {protocol.name!r}; give one"
            f" (known: {', '.join(sorted(DEFAULT_SYSTEM_PROMPTS))})"
        )
    stop = ""
    if protocol.boundary is Boundary.STOP_TOKEN:
        stop = STOP_TOKEN_NOTE.format(marker=protocol.stop_marker)
    text = DEFAULT_SYSTEM_PROMPTS[protocol.name].format(stop=stop)
    extra = tools_prompt(protocol, protocol.enabled_tools)  # tools beyond Python, if any
    text = f"{text} {extra}" if extra else text
    if protocol.shape is Shape.CALLS and list_functions:
        text += functions_note(function_schemas(protocol))
    return text


def functions_note(functions: list[dict]) -> str:
    """What follows a system message to list `functions` (OpenAI function definitions) where
    the chat template does not (`FUNCTIONS_NOTE`, one JSON line each). `tirl serve` lists a
    request's `tools` the same way (`tirl.apps.server_tools`)."""
    lines = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    return FUNCTIONS_NOTE.format(functions=lines)


class PromptRenderer:
    """Turns problems into prompt ids for one tokenizer and protocol.

    `chat`: True uses the tokenizer's chat template (a ConfigError if it has none), False the
    plain template, None the chat template when the tokenizer has one. `system`: the system
    message of chat prompts; None is the protocol's default (`default_system_prompt`), "" sends
    no system message. Plain prompts have no system message unless one is given: then it comes
    first, followed by a blank line (with None the quickstart's prompt tokens are unchanged).
    """

    def __init__(
        self,
        tokenizer,
        protocol: Protocol | str,
        system: str | None = None,
        chat: bool | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        protocol = get_protocol(protocol) if isinstance(protocol, str) else protocol
        try:  # as written for this tokenizer (a call protocol's tool turn: its template's)
            self.protocol = protocol.for_tokenizer(tokenizer)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # a call protocol's functions, the chat template's `tools=`; None: no tools= at all
        self.functions = function_schemas(protocol) if protocol.shape is Shape.CALLS else None
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat and not has_template:
            raise ConfigError(
                f"chat prompts need a chat template, and the tokenizer"
                f" {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r}"
                " has none (use plain prompts, or a tokenizer with a template)"
            )
        self.chat = has_template if chat is None else chat
        if self.chat:
            listed = self._template_lists_functions()
            if system is None:
                system = default_system_prompt(self.protocol, list_functions=not listed)
            elif system and self.functions and not listed:
                # a given system message is followed by the functions as Qwen2.5's template
                # follows it with its tools: what `tirl serve` writes for the same messages
                system += functions_note(self.functions)
            self.system = system
        else:
            self.system = system or ""
        self.eos_id = self._turn_end_id() if self.chat else tokenizer.eos_token_id
        if self.eos_id is None:
            raise ConfigError("the tokenizer has no end-of-sequence token (eos_token)")

    def messages(self, problem: str) -> list[dict[str, str]]:
        """The chat messages of a prompt: the system message (unless empty), the user turn."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": problem}]

    def prompt_ids(self, problem: str) -> list[int]:
        """The prompt's token ids: the chat template's own, or the plain text's."""
        if self.chat:
            return self._template(self.messages(problem), add_generation_prompt=True)
        return list(
            self.tokenizer(self.prompt_text(problem), add_special_tokens=False)["input_ids"]
        )

    def prompt_text(self, problem: str) -> str:
        """The prompt as text (for display and for text-only engines; a chat prompt's text may
        tokenize differently from `prompt_ids`, so rollouts take the ids)."""
        if self.chat:
            tools = {} if self.functions is None else {"tools": self.functions}
            return self.tokenizer.apply_chat_template(
                self.messages(problem), add_generation_prompt=True, tokenize=False, **tools
            )
        plain = PLAIN_TEMPLATE.format(problem=problem)
        return f"{self.system}\n\n{plain}" if self.system else plain

    # ------------------------------------------------------------------ helpers
    def _template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        tools = {} if self.functions is None else {"tools": self.functions}
        try:
            out = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True, **tools
            )
        except Exception as e:  # a template that refuses a system turn, say
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"the tokenizer's chat template failed: {first}") from None
        # transformers 5 returns a BatchEncoding, earlier releases the list of ids
        ids = out["input_ids"] if isinstance(out, Mapping) else out
        return [int(i) for i in ids]

    def _template_lists_functions(self) -> bool:
        """True when the chat template writes the `tools=` it is given into the prompt (the
        first function's description appears in it), as Qwen2.5's does; SmolLM2's ignores it."""
        if not self.functions:
            return False
        description = self.functions[0]["function"]["description"]
        try:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": "y"}], tokenize=False, tools=self.functions
            )
        except Exception:  # a template that refuses tools: it lists none
            return False
        return description in text

    def _turn_end_id(self) -> int | None:
        """The template's end-of-turn token: the first special token after the assistant's
        content in a rendered exchange (Qwen's `<|im_end|>`, Llama 3's `<|eot_id|>`); the
        tokenizer's eos when the template shows none."""
        marker = "x"
        user = [{"role": "user", "content": "y"}]
        prompt = self._template(user, add_generation_prompt=True)
        full = self._template([*user, {"role": "assistant", "content": marker}], False)
        special = set(self.tokenizer.all_special_ids)
        if full[: len(prompt)] == prompt:
            for i in full[len(prompt) :]:
                if i in special:
                    return i
        return self.tokenizer.eos_token_id
