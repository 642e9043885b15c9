"""Tool calls in `tirl serve` and the training gateway: vLLM's `--enable-auto-tool-choice
--tool-call-parser hermes`, in tirl's own call format (`tirl.protocol.calls`, `hermes_tools`).

Requests (`tool_settings`, `tool_calls_of`, called by `tirl.apps.server_requests`): `tools`, a
list of `{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`;
`tool_choice` "auto" or "none" (the server reads the calls the model writes; it cannot force
one); `parallel_tool_calls`. Assistant messages may carry `tool_calls` in the OpenAI wire format
(`function.arguments` a JSON string, parsed to an object before templating, as vLLM does) and
`role: "tool"` messages their `tool_call_id`. Every error names its field
(`tools[1].function.name`, `messages[3].tool_calls[0].function.arguments`).

Rendering (`render_tool_chat`) of a request with `tools` or an assistant's `tool_calls` (one
with neither, tool messages included, is the template's alone, as before), by what the
tokenizer's chat template can do (`tool_rendering`):
- a template that renders `tools=`, an assistant's calls exactly as `hermes_tools` writes them
  and tool messages (Qwen2.5's): the template, with the calls' arguments as objects;
- a ChatML template that renders none of them (the tiny model's, SmolLM2's): the conversation
  written the way tirl's own `hermes_tools` rollout writes it for that tokenizer: the tools
  listed after the system message as tirl's prompts list them (`functions_note`; a system
  message holding only the list when the request has none), an assistant's calls after its
  content as the protocol's blocks (`render_call`), each run of tool messages as the
  protocol's tool turn (a user turn of `<tool_response>` blocks, Qwen2.5's);
- any other template: a 400 in one line.
So a request of [system S, user Q] with the enabled tools' function definitions as `tools` is
the prompt `tirl train protocol.name=hermes_tools prompt.chat=true prompt.system=S` samples
from, and after the model's call and the tool's answer, the context tirl's rollout builds.

Responses (`ToolCalls.message`): with tools and `tool_choice` not "none", the completion's
`<tool_call>` blocks are read with the protocol's own decoding (`CallProtocol.function_calls`):
`content` is the text before the first call, less the separator the template writes between
an assistant's content and its calls (None when blank), `tool_calls` each call with a fresh
`call_<hex>` id and its arguments as a JSON string, `finish_reason` "tool_calls". A block that
is not a call leaves the whole completion as content (vLLM does the same). The choice's text,
which the gateway splices the next prompt with, stays the completion as sampled.
`parallel_tool_calls: false` stops a choice as soon as a call closes, as tirl's rollout
stops at a call (exact match): a model SFT'd in `hermes_tools` never wrote past one.

Streaming with tools: a call is known only once the completion is whole, so nothing of a
choice is streamed before its end; then its content and its calls come as one delta each
(`delta.tool_calls[i]` with `index`, `id`, `type` and the whole `function`).

Not covered: `tool_choice` "required" or a named function; calls in any format but Hermes JSON.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from tirl.protocol.calls import HERMES_TOOLS, PYTHON_ARGUMENT, template_response_markers
from tirl.protocol.fences import DEFAULT_TOOL, Boundary
from tirl.tasks.prompts import functions_note

TOOL_CHOICES = ("auto", "none")
MAX_TOOLS = 128
MAX_CALLS = 64  # tool calls in one assistant message
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
# The protocol the server reads and writes calls with: exact match, whatever it was registered.
CALLS = HERMES_TOOLS.with_boundary(Boundary.EXACT_MATCH)
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"  # Qwen2.5's, Hermes'
_CONTENT = "TIRL-CONTENT-5c2b"  # an assistant's content in the template probe


class ToolRequestError(ValueError):
    """A request's tools or tool messages the server refuses; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolSettings:
    """A chat request's `tools` (checked, as given), `tool_choice` and `parallel_tool_calls`."""

    tools: list[dict]
    choice: str = "auto"
    parallel: bool = True

    @property
    def parse_calls(self) -> bool:
        """Whether the completion's calls are read back as `tool_calls`."""
        return bool(self.tools) and self.choice != "none"


@dataclass(frozen=True)
class ToolCalls:
    """How a completion's calls are read: the template's separator between an assistant's
    content and its first call, and whether a choice stops at its first closed call."""

    separator: str
    stop_at_call: bool

    def closed(self, text: str) -> bool:
        """Whether `text` holds a complete call block (valid or not)."""
        return CALLS.closed_call(text) is not None

    def message(self, text: str) -> dict[str, Any] | None:
        """The assistant message of a completion `text` with calls, or None (no call, or a
        block that is not one: the text stays content)."""
        found = CALLS.function_calls(text)
        if found is None:
            return None
        head = text[: found[0][0]]
        if self.separator and head.endswith(self.separator):
            head = head[: -len(self.separator)]
        calls = [
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for _, name, args in found
        ]
        return {"role": "assistant", "content": head if head.strip() else None, "tool_calls": calls}


# -- requests --------------------------------------------------------------------------------


def tool_settings(body: dict[str, Any]) -> ToolSettings:
    """The request's tool fields, checked; ToolRequestError names the first bad one."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ToolRequestError("tools", f"tools must be a list, got {value_kind(tools)}")
    if len(tools) > MAX_TOOLS:
        raise ToolRequestError("tools", f"at most {MAX_TOOLS} tools, got {len(tools)}")
    names = set()
    for i, tool in enumerate(tools):
        name = _check_tool(tool, f"tools[{i}]")
        if name in names:
            raise ToolRequestError(
                f"tools[{i}].function.name", f"tools[{i}]: a second function named {name!r}"
            )
        names.add(name)
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto"
    if choice not in TOOL_CHOICES:
        raise ToolRequestError(
            "tool_choice",
            f'tool_choice may be "auto" or "none" (the server reads the calls the model writes;'
            f" it cannot force one), got {show_value(choice)}",
        )
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolRequestError(
            "parallel_tool_calls",
            f"parallel_tool_calls must be true or false, got {show_value(parallel)}",
        )
    return ToolSettings(tools, choice, True if parallel is None else parallel)


def _check_tool(tool: Any, where: str) -> str:
    if not isinstance(tool, dict):
        raise ToolRequestError(where, f"{where} must be an object, got {value_kind(tool)}")
    extra = sorted(set(tool) - {"type", "function"})
    if extra:
        raise ToolRequestError(
            f"{where}.{clip(extra[0], 100)}", f"{where}: {extra[0]!r} is unknown"
        )
    if tool.get("type") != "function":
        raise ToolRequestError(
            f"{where}.type", f'{where}.type must be "function", got {show_value(tool.get("type"))}'
        )
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ToolRequestError(
            f"{where}.function", f"{where}.function must be an object, got {value_kind(function)}"
        )
    extra = sorted(set(function) - FUNCTION_KEYS)
    if extra:
        raise ToolRequestError(
            f"{where}.function.{clip(extra[0], 100)}",
            f"{where}.function: {extra[0]!r} is unknown (it takes {', '.join(sorted(FUNCTION_KEYS))})",
        )
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise ToolRequestError(
            f"{where}.function.name",
            f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {show_value(name)}",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolRequestError(
            f"{where}.function.description",
            f"{where}.function.description must be a string, got {value_kind(description)}",
        )
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ToolRequestError(
            f"{where}.function.parameters",
            f"{where}.function.parameters must be a JSON Schema object, got {value_kind(parameters)}",
        )
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ToolRequestError(
            f"{where}.function.strict", f"{where}.function.strict must be true or false"
        )
    return name


def tool_calls_of(value: Any, where: str) -> list[dict]:
    """An assistant message's `tool_calls` (`where` names the field), checked, each
    `{"id"?, "type": "function", "function": {"name", "arguments": <an object>}}` with its
    arguments parsed from their JSON string, as a chat template takes them."""
    if not isinstance(value, list):
        raise ToolRequestError(where, f"{where} must be a list, got {value_kind(value)}")
    if len(value) > MAX_CALLS:
        raise ToolRequestError(where, f"{where} may hold at most {MAX_CALLS} calls")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise ToolRequestError(at, f"{at} must be an object, got {value_kind(call)}")
        extra = sorted(set(call) - {"id", "type", "function"})
        if extra:
            raise ToolRequestError(f"{at}.{clip(extra[0], 100)}", f"{at}: {extra[0]!r} is unknown")
        if call.get("type", "function") != "function":
            raise ToolRequestError(f"{at}.type", f'{at}.type must be "function"')
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise ToolRequestError(f"{at}.id", f"{at}.id must be a string")
        function = call.get("function")
        if not isinstance(function, dict) or set(function) - {"name", "arguments"}:
            raise ToolRequestError(
                f"{at}.function", f'{at}.function must be {{"name": ..., "arguments": ...}}'
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolRequestError(f"{at}.function.name", f"{at}.function.name must be a string")
        arguments = _arguments(function.get("arguments"), f"{at}.function.arguments")
        out = {"type": "function", "function": {"name": name, "arguments": arguments}}
        if call.get("id") is not None:
            out["id"] = call["id"]
        calls.append(out)
    return calls


def _arguments(value: Any, where: str) -> dict:
    if isinstance(value, dict):  # not the wire format, but unambiguous
        return value
    if not isinstance(value, str):
        raise ToolRequestError(where, f"{where} must be a JSON string, got {value_kind(value)}")
    try:
        arguments = json.loads(value)
    except (ValueError, RecursionError) as e:
        raise ToolRequestError(where, f"{where} is not valid JSON ({clip(str(e))})") from None
    if not isinstance(arguments, dict):
        raise ToolRequestError(
            where, f"{where} must hold a JSON object, got {value_kind(arguments)}"
        )
    return arguments


# -- rendering -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRendering:
    """How a tokenizer's chat template takes tools: "template" (it renders them itself) or
    "hermes" (ChatML: tirl writes them), and the separator it writes between an assistant's
    content and its first call."""

    mode: str
    separator: str


_RENDERINGS: dict[str, ToolRendering | None] = {}  # by chat template


def tool_rendering(tokenizer) -> ToolRendering | None:
    """What `tokenizer`'s chat template can do with tools (the module doc), or None."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    if template not in _RENDERINGS:
        _RENDERINGS[template] = _probe(tokenizer)
    return _RENDERINGS[template]


def _probe(tokenizer) -> ToolRendering | None:
    if template_response_markers(tokenizer, CALLS) is not None:
        function = {"name": DEFAULT_TOOL, "arguments": {PYTHON_ARGUMENT: "print(1)"}}
        call = {"type": "function", "function": function}
        messages = [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": _CONTENT, "tool_calls": [call]},
        ]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False)
        except Exception:
            return None
        block = CALLS.render_code("print(1)")
        if _CONTENT not in text or block not in text:
            return None
        start = text.index(_CONTENT) + len(_CONTENT)
        return ToolRendering("template", text[start : text.index(block, start)])
    probe = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": f"{RESPONSE_OPEN}X{RESPONSE_CLOSE}"},
    ]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    except Exception:
        return None
    if text.endswith("A" + HERMES_TOOLS.render_output("X")) and "S" in text:
        return ToolRendering("hermes", "")
    return None


def uses_tools(messages: list[dict], settings: ToolSettings) -> bool:
    """Whether a request needs tool rendering: tools, or an assistant's calls in it. Tool
    messages alone are the template's to render, as they were before tools came (SmolLM2's
    writes an `<|im_start|>tool` turn), as vLLM renders them."""
    return bool(settings.tools) or any(m.get("tool_calls") for m in messages)


def render_tool_chat(tokenizer, messages: list[dict], settings: ToolSettings) -> str:
    """The prompt text of a conversation with tools (the module doc); ToolRequestError where
    the template can take none. Errors of the template itself propagate."""
    rendering = tool_rendering(tokenizer)
    if rendering is None:
        raise ToolRequestError(
            "tools",
            "this model's chat template renders neither tools and tool calls in the Hermes"
            " <tool_call> format nor plain ChatML turns (where tirl writes them), so tools and"
            " tool messages cannot be rendered",
        )
    if rendering.mode == "template":
        tools = {"tools": settings.tools} if settings.tools else {}
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **tools
        )
    return tokenizer.apply_chat_template(
        hermes_messages(messages, settings.tools), tokenize=False, add_generation_prompt=True
    )


def hermes_messages(messages: list[dict], tools: list[dict]) -> list[dict[str, str]]:
    """`messages` as plain ChatML messages written the way tirl's `hermes_tools` rollout writes
    them: the tools after the system message, calls as the protocol's blocks after the
    content, each run of tool messages as one user turn of `<tool_response>` blocks."""
    out: list[dict[str, str]] = []
    for m in messages:
        if m["role"] == "tool":
            response = f"{RESPONSE_OPEN}{m['content']}{RESPONSE_CLOSE}"
            if out and out[-1].get("tool_turn"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "tool_turn": True})
            continue
        content = m["content"]
        if m.get("tool_calls"):
            content += "".join(CALLS.render_call(**_name_args(c)) for c in m["tool_calls"])
        out.append({"role": m["role"], "content": content})
    for m in out:
        m.pop("tool_turn", None)
    if tools:
        note = functions_note(tools)
        if out and out[0]["role"] in ("system", "developer"):
            out[0]["content"] += note
        else:
            out.insert(0, {"role": "system", "content": note.lstrip("\n")})
    return out


def _name_args(call: dict) -> dict:
    return {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}


def value_kind(value: Any) -> str:
    """What a JSON value is, in words, for an error message ("an array", "null")."""
    names = {dict: "an object", list: "an array", bool: "a boolean", str: "a string"}
    names.update({type(None): "null", int: "an integer", float: "a number"})
    return names.get(type(value), type(value).__name__)


def show_value(value: Any) -> str:
    """A short JSON rendering of a bad value for an error message."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return clip(text, 60)


def clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
