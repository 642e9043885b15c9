"""What `tirl serve` accepts: every request is checked here, whole, before it joins a batch.

`parse_completion` and `parse_chat` turn a request body into a `GenerationRequest` (token-id
prompts within the model's vocabulary and context, finite sampling parameters in range) or
raise `BadRequest`, whose `param` names the offending field the way the OpenAI API does
(`{"error": {"message", "type", "param", "code"}}`). Nothing that passes can fail another
request in the batch: the engine only ever sees token ids below the vocabulary size, a prompt
plus `max_tokens` that fits the context and the server's KV cache budget (a request beyond the
budget could never be admitted: it is a 400 naming the budget, not a wait), and temperatures
in [0, 100].

Fields:
- supported: `model`, `prompt` (text, token ids, or a list of either) / `messages`,
  `max_tokens` (`max_completion_tokens` for chat), `temperature`, `n`, `seed`, `stop`,
  `stream`, `stream_options.include_usage`, `logprobs` (completions: 0 or 1, the sampled
  tokens' log-probs), `user` (accepted, unused), and vLLM's `return_token_ids`,
  `include_stop_str_in_output`, `skip_special_tokens`; chat also `tools`, `tool_choice`
  ("auto" or "none"), `parallel_tool_calls`, assistant messages' `tool_calls` and tool
  messages' `tool_call_id` (checked and rendered by `tirl.apps.server_tools`);
- not supported, accepted only at the value that changes nothing (`top_p: 1`, `echo: false`,
  `logit_bias: {}`, `presence_penalty: 0`, ...); any other value is a 400 naming the field;
- any other field is a 400 too: a parameter we do not know is never silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tirl.apps.server_tools import (
    ToolCalls,
    ToolRequestError,
    clip,
    render_tool_chat,
    show_value,
    tool_calls_of,
    tool_rendering,
    tool_settings,
    uses_tools,
    value_kind,
)

# How a prompt's text becomes token ids. `tirl serve` tokenizes it whole (`plain_encoder`);
# the training gateway (`tirl.apps.gateway`) splices the ids a session's model sampled before.
Encode = Callable[[str], list[int]]

MAX_N = 64  # choices per prompt
MAX_PROMPTS = 64  # prompts per request (a batched `prompt`)
MAX_CHOICES = 256  # n x prompts
MAX_STOPS = 16
MAX_STOP_CHARS = 1000
MAX_MESSAGES = 1024
MAX_TEMPERATURE = 100.0  # as `tirl eval --temperature`
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
ROLES = ("system", "developer", "user", "assistant", "tool")


class BadRequest(Exception):
    """A request the server refuses; `param` is the field at fault ("body" for the whole)."""

    def __init__(
        self, param: str, message: str, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


@dataclass(frozen=True)
class ModelLimits:
    """What the served model can take."""

    names: frozenset[str]  # the model names a request may ask for
    vocab_size: int  # token ids must be below this (rows of the input embedding)
    max_len: int  # prompt + generated tokens, at most
    # The most UTF-8 bytes one token can stand for (`token_bytes_bound`). A text longer than
    # max_len * this has more tokens than the context holds: it is refused before tokenizing,
    # so no request costs more tokenizing than the context is worth.
    max_token_bytes: int = 64
    # KV positions the server may hold for requests in flight (`HFEngine.kv_budget`): one
    # request's prompt + max_tokens must fit it too. None: no budget.
    kv_budget: int | None = None

    @property
    def max_text_bytes(self) -> int:
        return self.max_len * self.max_token_bytes

    @property
    def max_request(self) -> int:
        """The most positions one request can take: the context, or the budget if smaller."""
        return self.max_len if self.kv_budget is None else min(self.max_len, self.kv_budget)


def token_bytes_bound(tokenizer) -> int:
    """An upper bound on the UTF-8 bytes one token of `tokenizer` covers: the longest entry of
    its vocabulary, special tokens included, as written there (a byte-level token spells each
    byte with one character of one or two bytes; a SentencePiece one writes a space as the
    three-byte '▁'): never less than what the token decodes to."""
    return max(len(token.encode("utf-8")) for token in tokenizer.get_vocab())


@dataclass(frozen=True)
class GenerationRequest:
    chat: bool
    prompts: list[list[int]]  # one or more token-id prompts
    max_tokens: list[int]  # per prompt (chat: the room left in the context by default)
    temperature: float
    n: int
    seed: int | None
    stops: tuple[str, ...]
    include_stop: bool
    skip_special: bool
    return_token_ids: bool
    logprobs: bool
    stream: bool
    include_usage: bool
    # Called with (prompt ids, the choice) for each choice answered in full; the training
    # gateway records a session's calls with it. Not a request field.
    on_choice: Callable[[list[int], Any], None] | None = field(default=None, compare=False)
    # How the completion's tool calls are read back (a chat request with tools); None: not.
    tools: ToolCalls | None = None


_COMMON = {
    "model", "max_tokens", "temperature", "n", "seed", "stop", "stream", "stream_options",
    "return_token_ids", "include_stop_str_in_output", "skip_special_tokens", "user",
}  # fmt: skip
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "best_of"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice"}
CHAT_FIELDS |= {"parallel_tool_calls"}

# Unsupported fields, accepted at (and only at) the values that make them no-ops.
_NEUTRAL_COMMON: dict[str, tuple] = {
    "top_p": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "top_k": (-1, 0),
    "min_p": (0,),
    "repetition_penalty": (1,),
    "ignore_eos": (False,),
    "min_tokens": (0,),
    "stop_token_ids": ([],),
}
NEUTRAL_COMPLETION = {**_NEUTRAL_COMMON, "echo": (False,), "suffix": ("",)}
NEUTRAL_CHAT = {
    **_NEUTRAL_COMMON,
    "logprobs": (False,),
    "top_logprobs": (0,),
    "response_format": ({"type": "text"},),
}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in a request body, or BadRequest(param="body")."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest("body", "the request body is JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int of > 4300 digits
        raise BadRequest("body", f"the request body is not valid JSON ({clip(str(e))})") from None
    if not isinstance(body, dict):
        raise BadRequest("body", f"the request body must be a JSON object, got {value_kind(body)}")
    return body


def plain_encoder(tokenizer) -> Encode:
    """A prompt's text tokenized whole, no special tokens added (what `tirl serve` does)."""
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def parse_completion(
    body: dict[str, Any], limits: ModelLimits, tokenizer, encode: Encode | None = None
) -> GenerationRequest:
    """`encode`: how a text prompt becomes ids (None: `plain_encoder`)."""
    _check_fields(body, COMPLETION_FIELDS, NEUTRAL_COMPLETION)
    _check_model(body, limits)
    params = _params(body, limits, chat=False)
    prompts = _prompts(body, limits, encode or plain_encoder(tokenizer))
    max_tokens = params.pop("max_tokens") or 16
    return _fit(
        GenerationRequest(
            chat=False, prompts=prompts, max_tokens=[max_tokens] * len(prompts), **params
        ),
        limits,
        "max_tokens",
    )


def parse_chat(
    body: dict[str, Any], limits: ModelLimits, tokenizer, encode: Encode | None = None
) -> GenerationRequest:
    """`encode`: how the rendered template becomes ids (None: `plain_encoder`)."""
    _check_fields(body, CHAT_FIELDS, NEUTRAL_CHAT)
    _check_model(body, limits)
    params = _params(body, limits, chat=True)
    try:
        settings = tool_settings(body)
        messages = _messages(body)
    except ToolRequestError as e:
        raise BadRequest(e.param, str(e)) from None
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest(
            "messages",
            "this model's tokenizer has no chat template, so messages cannot be rendered;"
            " use /v1/completions with a prompt",
        )
    sized = [m["content"] for m in messages] + [json.dumps(settings.tools)]
    sized += [json.dumps(m["tool_calls"]) for m in messages if m.get("tool_calls")]
    _check_text_size("".join(sized), limits, "messages")
    tooled = uses_tools(messages, settings)
    try:
        if tooled:
            text = render_tool_chat(tokenizer, messages, settings)
        else:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
    except ToolRequestError as e:
        raise BadRequest(e.param, str(e)) from None
    except Exception as e:  # a template's own raise_exception(), or one it cannot handle
        raise BadRequest(
            "messages", f"the chat template cannot render these messages: {clip(str(e))}"
        ) from None
    ids = (encode or plain_encoder(tokenizer))(_text(text, "messages"))
    _check_prompt_ids(ids, limits, "messages")
    # Without a limit, a chat completion may fill the context (as vLLM does), within the budget.
    max_tokens = params.pop("max_tokens") or limits.max_request - len(ids)
    field = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    calls = None
    if settings.parse_calls:
        rendering = tool_rendering(tokenizer)
        calls = ToolCalls(rendering.separator, stop_at_call=not settings.parallel)
    return _fit(
        GenerationRequest(chat=True, prompts=[ids], max_tokens=[max_tokens], tools=calls, **params),
        limits,
        field,
    )


# -- pieces ----------------------------------------------------------------------------------


def _params(body: dict[str, Any], limits: ModelLimits, chat: bool) -> dict[str, Any]:
    """Every field but the prompt, checked (cheap, so before the prompt is tokenized)."""
    max_tokens = _int(body, "max_tokens", None, 1, limits.max_len)
    if chat:
        max_tokens = _int(body, "max_completion_tokens", None, 1, limits.max_len) or max_tokens
    n = _int(body, "n", 1, 1, MAX_N)
    best_of = body.get("best_of")
    if best_of is not None and (type(best_of) is not int or best_of != n):
        raise BadRequest(
            "best_of",
            f"best_of is not supported (only null or equal to n, {n}), got {show_value(best_of)}",
        )
    logprobs = None if chat else body.get("logprobs")  # chat: only the neutral false
    if logprobs is not None and (type(logprobs) is not int or logprobs not in (0, 1)):
        raise BadRequest(
            "logprobs",
            "logprobs must be null, 0 or 1 (the sampled tokens' log-probs; top alternatives"
            f" are not computed), got {show_value(logprobs)}",
        )
    stream = _bool(body, "stream", False)
    if stream and logprobs is not None:
        raise BadRequest("logprobs", "log-probs are not returned when streaming")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise BadRequest("stream_options", "stream_options is only allowed with stream: true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise BadRequest(
                "stream_options", 'stream_options may hold only {"include_usage": true|false}'
            )
        include_usage = _bool(options, "include_usage", False, "stream_options.include_usage")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("user", f"user must be a string, got {value_kind(user)}")
    return dict(
        max_tokens=max_tokens,
        temperature=_temperature(body),
        n=n,
        seed=_int(body, "seed", None, *SEED_RANGE),
        stops=_stops(body),
        include_stop=_bool(body, "include_stop_str_in_output", False),
        skip_special=_bool(body, "skip_special_tokens", True),
        return_token_ids=_bool(body, "return_token_ids", False),
        logprobs=logprobs is not None,
        stream=stream,
        include_usage=include_usage,
    )


def _fit(req: GenerationRequest, limits: ModelLimits, field: str) -> GenerationRequest:
    """`req` if its choices are few enough and every prompt + max_tokens fits the context."""
    if req.n * len(req.prompts) > MAX_CHOICES:
        raise BadRequest(
            "n", f"n x prompts must be at most {MAX_CHOICES}, got {req.n * len(req.prompts)}"
        )
    for i, (ids, m) in enumerate(zip(req.prompts, req.max_tokens)):
        which = f" (prompt {i})" if len(req.prompts) > 1 else ""
        if len(ids) + m > limits.max_len:
            raise BadRequest(
                field,
                f"the prompt{which} has {len(ids)} tokens and {field} is {m}: together more"
                f" than the model's context of {limits.max_len} tokens; ask for at most"
                f" {limits.max_len - len(ids)}",
            )
        if len(ids) + m > limits.max_request:
            raise BadRequest(
                field,
                f"the prompt{which} has {len(ids)} tokens and {field} is {m}: together"
                f" {len(ids) + m} KV positions, more than this server's KV cache budget of"
                f" {limits.kv_budget} (tirl serve --kv-cache-tokens); ask for at most"
                f" {limits.max_request - len(ids)}",
            )
    return req


def _check_fields(body: dict[str, Any], known: set[str], neutral: dict[str, tuple]) -> None:
    for name, value in body.items():
        if name in known:
            continue
        if name in neutral:
            if value is None or any(_same(value, v) for v in neutral[name]):
                continue
            allowed = " or ".join(json.dumps(v) for v in neutral[name])
            raise BadRequest(
                name,
                f"{name} is not supported by tirl serve (only null or {allowed}, which change"
                f" nothing), got {show_value(value)}",
            )
        raise BadRequest(
            clip(name, 100),
            f"unknown field {clip(name, 100)!r}; this endpoint takes: {', '.join(sorted(known))}",
        )


def _same(value: Any, neutral: Any) -> bool:
    """value == neutral, without True == 1 or 1.0 == True."""
    if isinstance(neutral, bool) or isinstance(value, bool):
        return value is neutral
    if isinstance(neutral, (int, float)):
        return isinstance(value, (int, float)) and value == neutral
    return type(value) is type(neutral) and value == neutral


def _check_model(body: dict[str, Any], limits: ModelLimits) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise BadRequest("model", f"model must be a string, got {value_kind(model)}")
    if model not in limits.names:
        raise BadRequest(
            "model",
            f"the model {clip(model, 200)!r} does not exist here; this server has"
            f" {', '.join(sorted(limits.names))} (GET /v1/models)",
            status=404,
            code="model_not_found",
        )


def _int(body: dict[str, Any], name: str, default: Any, low: int, high: int) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not int or not low <= value <= high:
        raise BadRequest(
            name, f"{name} must be an integer in [{low}, {high}], got {show_value(value)}"
        )
    return value


def _bool(body: dict[str, Any], name: str, default: bool, label: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(
            label or name, f"{label or name} must be true or false, got {show_value(value)}"
        )
    return value


def _temperature(body: dict[str, Any]) -> float:
    value = body.get("temperature")
    if value is None:
        return 1.0
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TEMPERATURE
    ):
        raise BadRequest(
            "temperature",
            f"temperature must be a finite number in [0, {MAX_TEMPERATURE:g}], got {show_value(value)}",
        )
    return float(value)


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest(
            "stop", f"stop must be a string or a list of strings, got {show_value(value)}"
        )
    if len(stops) > MAX_STOPS:
        raise BadRequest("stop", f"stop may hold at most {MAX_STOPS} strings, got {len(stops)}")
    for s in stops:
        if not 0 < len(s) <= MAX_STOP_CHARS:
            raise BadRequest(
                "stop", f"each stop string must have 1 to {MAX_STOP_CHARS} characters, got {len(s)}"
            )
    return tuple(dict.fromkeys(stops))


def _prompts(body: dict[str, Any], limits: ModelLimits, encode: Encode) -> list[list[int]]:
    if "prompt" not in body or body["prompt"] is None:
        raise BadRequest("prompt", "missing field 'prompt' (text, token ids, or a list of either)")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        items: list = [prompt]
    elif isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        items = prompt
    else:
        raise BadRequest(
            "prompt",
            "prompt must be a string, a non-empty list of token ids, or a list of strings or"
            f" of token-id lists, got {show_value(prompt)}",
        )
    if len(items) > MAX_PROMPTS:
        raise BadRequest("prompt", f"at most {MAX_PROMPTS} prompts per request, got {len(items)}")
    for item in items:  # every text bounded before any is tokenized
        if isinstance(item, str):
            _check_text_size(item, limits, "prompt")
    prompts = []
    for item in items:
        if isinstance(item, str):
            ids = encode(_text(item, "prompt")) if item else []
        else:
            ids = item
        _check_prompt_ids(ids, limits, "prompt")
        prompts.append(list(ids))
    return prompts


def _check_text_size(text: str, limits: ModelLimits, field: str) -> None:
    """Refuse a text that cannot fit in the context whatever it tokenizes to (O(len) once)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_text_bytes:
        raise BadRequest(
            field,
            f"the {field} has {size} bytes of text: more than the model's context of"
            f" {limits.max_len} tokens can hold (at most {limits.max_token_bytes} bytes a token,"
            f" so {limits.max_text_bytes} bytes)",
        )


def _check_prompt_ids(ids: list, limits: ModelLimits, field: str) -> None:
    if not ids:
        raise BadRequest(field, f"the {field} is empty (it must hold at least one token)")
    for i in ids:
        if type(i) is not int or not 0 <= i < limits.vocab_size:
            raise BadRequest(
                field,
                f"token ids must be integers in [0, {limits.vocab_size - 1}] (the vocabulary),"
                f" got {show_value(i)}",
            )
    if len(ids) >= limits.max_len:
        raise BadRequest(
            field,
            f"the {field} has {len(ids)} tokens, the model's context {limits.max_len}: it must"
            f" leave room for at least one generated token",
        )
    if len(ids) >= limits.max_request:
        raise BadRequest(
            field,
            f"the {field} has {len(ids)} tokens, this server's KV cache budget"
            f" {limits.kv_budget} (tirl serve --kv-cache-tokens): it must leave room for at"
            f" least one generated token",
        )


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(
            "messages", f"messages must be a non-empty list, got {show_value(messages)}"
        )
    if len(messages) > MAX_MESSAGES:
        raise BadRequest("messages", f"at most {MAX_MESSAGES} messages, got {len(messages)}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(where, f"{where} must be an object, got {value_kind(m)}")
        role = m.get("role")
        allowed = {"role", "content", "name"}
        allowed |= {"tool_calls"} if role == "assistant" else set()
        allowed |= {"tool_call_id"} if role == "tool" else set()
        extra = set(m) - allowed
        if extra:
            name = sorted(extra)[0]
            raise BadRequest(f"{where}.{clip(name, 100)}", f"{where}: {name!r} is not supported")
        if role not in ROLES:
            raise BadRequest(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}")
        calls = m.get("tool_calls")
        content = m.get("content")
        if calls and content is None:  # an assistant that only calls: content null
            content = ""
        message: dict[str, Any] = {"role": role, "content": _content(content, f"{where}.content")}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise BadRequest(f"{where}.{key}", f"{where}.{key} must be a string")
                message[key] = _text(m[key], f"{where}.{key}")
        if calls is not None:
            message["tool_calls"] = tool_calls_of(calls, f"{where}.tool_calls")
        out.append(message)
    return out


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return _text(content, where)
    if isinstance(content, list) and all(
        isinstance(p, dict)
        and p.get("type") == "text"
        and isinstance(p.get("text"), str)
        and set(p) <= {"type", "text"}
        for p in content
    ):
        return _text("".join(p["text"] for p in content), where)
    raise BadRequest(
        where, f'{where} must be a string or a list of {{"type": "text", "text": ...}} parts'
    )


def _text(text: str, field: str) -> str:
    """`text`, if it is valid Unicode: JSON can carry lone surrogates ("\\ud800"), which no
    tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(field, f"{field} holds a lone surrogate (not valid Unicode)") from None
    return text
