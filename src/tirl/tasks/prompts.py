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

Not covered: multi-turn conversations, and templates that put tool output in a turn of its own
(tirl keeps the interpreter's answer inside the assistant turn, as CIR and AgentMath do).
"""

from __future__ import annotations

from collections.abc import Mapping

from tirl.config import ConfigError
from tirl.protocol import Boundary, Protocol, get_protocol
from tirl.tools import tools_prompt

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
}
STOP_TOKEN_NOTE = " To run a block, write {marker} right after it."


def default_system_prompt(protocol: Protocol) -> str:
    """The system message that explains `protocol` (its boundary mode included)."""
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
    return f"{text} {extra}" if extra else text


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
        self.protocol = get_protocol(protocol) if isinstance(protocol, str) else protocol
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat and not has_template:
            raise ConfigError(
                f"chat prompts need a chat template, and the tokenizer"
                f" {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r}"
                " has none (use plain prompts, or a tokenizer with a template)"
            )
        self.chat = has_template if chat is None else chat
        if self.chat:
            self.system = default_system_prompt(self.protocol) if system is None else system
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
            return self.tokenizer.apply_chat_template(
                self.messages(problem), add_generation_prompt=True, tokenize=False
            )
        plain = PLAIN_TEMPLATE.format(problem=problem)
        return f"{self.system}\n\n{plain}" if self.system else plain

    # ------------------------------------------------------------------ helpers
    def _template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        try:
            out = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True
            )
        except Exception as e:  # a template that refuses a system turn, say
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"the tokenizer's chat template failed: {first}") from None
        # transformers 5 returns a BatchEncoding, earlier releases the list of ids
        ids = out["input_ids"] if isinstance(out, Mapping) else out
        return [int(i) for i in ids]

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
