"""A gateway session's recorded calls, turned into one token-faithful `Trajectory`.

An agent program that talks to tirl's training gateway (`tirl.apps.gateway`) makes a series of
OpenAI-style calls. For each the gateway records the exact prompt ids the policy was fed, the
ids it sampled, their log-probs and why it stopped (`RecordedCall`). This module holds the two
pure steps around that record:

- `splice_prompt` (token in): when the text of a call's prompt starts with the previous call's
  prompt text followed by the text the gateway returned for it, the new prompt's ids are the
  previous prompt ids + the sampled ids, exactly, followed by the rest of the text tokenized on
  its own (what the agent's own code added: the end of the turn as the template writes it,
  the tool or user messages, the next generation prompt). Nothing the model sampled is
  decoded and encoded again. If the previous completion ended with the end-of-sequence token,
  the rest must start with that token's spelling (the template's end of the turn *is* the
  sampled one): a template that ends the turn differently, re-renders an earlier turn, or an
  agent that edited the assistant's text (a dropped newline) leaves no splice, and says why.
- `assemble_trajectory`: the calls in order, each prompt checked to extend the history so far
  (the previous prompt ids + completion ids) exactly; the first prompt is the PROMPT segment,
  each completion a MODEL segment with its sampler log-probs, each stretch of ids between a
  completion and the next prompt a TOOL segment (loss mask 0, no log-probs: it is what the
  agent's code added). A prompt that does not extend the history refuses the whole session
  (`SessionRefused`) naming the call, the token position and the differing tokens, decoded;
  nothing is silently re-tokenized or repaired.

A session is one conversation. Calls that branch (a second conversation in the same session,
a retry from an earlier state, two calls in flight at once) are refused, not split: a split
would need to guess which prefix each branch shares, and a branch that merely lost a
separator token looks exactly like a new conversation. An agent with several conversations
opens a session for each.

Pure: no HTTP, no engine, no torch; the tokenizer comes in as `encode` / `decode` callables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tirl.protocol.segments import Segment, SegmentKind, Trajectory

Decode = Callable[[list[int]], str]
Encode = Callable[[str], list[int]]

CONTEXT_TOKENS = 3  # tokens shown on each side of a divergence


@dataclass(frozen=True)
class RecordedCall:
    """One generation call of a session, as the engine saw it.

    `prompt_text` is the text the prompt ids stand for (a chat request's rendered template,
    a completion's prompt text; None for a prompt given as token ids) and `returned_text` the
    completion's text as the agent got it (special tokens skipped, cut at a stop string):
    together they let the next call be spliced. `splice_note` says why this call's prompt could
    not reuse the previous call's sampled ids (None when it did, or for the first call)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_text: str | None = None
    returned_text: str = ""
    spliced: bool = False
    splice_note: str | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"a call has {len(self.completion_ids)} completion ids but"
                f" {len(self.logprobs)} log-probs"
            )

    @property
    def history(self) -> list[int]:
        """The ids the next call's prompt must start with."""
        return self.prompt_ids + self.completion_ids


class SessionRefused(ValueError):
    """A session that cannot become one trajectory. `call` is the 0-based index of the call at
    fault (None for the session as a whole), `position` the token index in that call's prompt
    where it left the history (None when not a divergence)."""

    def __init__(self, message: str, call: int | None = None, position: int | None = None):
        super().__init__(message)
        self.call = call
        self.position = position


@dataclass(frozen=True)
class Splice:
    """What `splice_prompt` found: the prompt ids (None: no splice, re-tokenize) and, when
    there is none, why."""

    ids: list[int] | None
    note: str | None = None


def splice_prompt(
    previous: RecordedCall | None,
    text: str,
    encode: Encode,
    eos_id: int | None,
    eos_text: str | None,
) -> Splice:
    """The ids of a prompt whose text is `text`, reusing `previous`'s sampled ids where `text`
    continues it (the module docstring); `eos_id` is the end-of-sequence id and `eos_text` its
    spelling. Splice(None, why) where it does not: the caller then tokenizes `text` whole, and
    `assemble_trajectory` refuses the session at that call."""
    if previous is None or previous.prompt_text is None:
        return Splice(None)
    head = previous.prompt_text + previous.returned_text
    if not text.startswith(head):
        at = _first_difference(head, text)
        return Splice(
            None,
            "its text leaves the previous call's prompt and returned text at character"
            f" {at}: expected {head[at : at + 24]!r}, got {text[at : at + 24]!r}",
        )
    rest = text[len(head) :]
    ended = bool(previous.completion_ids) and previous.completion_ids[-1] == eos_id
    if ended and eos_text:
        # The sampled end-of-sequence token must be the template's end of the turn.
        if not rest.startswith(eos_text):
            return Splice(
                None,
                f"the model ended its turn with {eos_text!r} but the template writes"
                f" {rest[: len(eos_text) + 8]!r} there",
            )
        rest = rest[len(eos_text) :]
    return Splice(previous.history + (encode(rest) if rest else []))


def assemble_trajectory(
    calls: Sequence[RecordedCall], decode: Decode, meta: dict | None = None
) -> Trajectory:
    """The session's calls as one trajectory (the module docstring), or SessionRefused.
    `decode` turns ids into text (segment texts and the refusal's tokens); the trajectory's
    finish reason is the last call's ("stop" or "length")."""
    if not calls:
        raise SessionRefused("the session made no generation call: nothing to train on")
    first = calls[0]
    segments = [Segment(SegmentKind.PROMPT, list(first.prompt_ids), decode(first.prompt_ids))]
    history = list(first.prompt_ids)
    for k, call in enumerate(calls):
        if k:
            _check_extends(k, call, history, decode)
            added = call.prompt_ids[len(history) :]
            if added:  # what the agent's code added: masked, no log-probs
                segments.append(Segment(SegmentKind.TOOL, list(added), decode(added)))
                history += added
        if call.completion_ids:
            ids = list(call.completion_ids)
            segments.append(Segment(SegmentKind.MODEL, ids, decode(ids), list(call.logprobs)))
            history += ids
    finish = calls[-1].finish_reason
    meta = dict(meta or {})
    meta["gateway_calls"] = len(calls)
    return Trajectory(
        segments=segments,
        finish_reason=finish if finish in ("stop", "length") else "stop",
        meta=meta,
    )


def _check_extends(k: int, call: RecordedCall, history: list[int], decode: Decode) -> None:
    prompt = call.prompt_ids
    n = len(history)
    at = next((i for i in range(min(n, len(prompt))) if prompt[i] != history[i]), None)
    if at is None and len(prompt) >= n:
        return
    if at is None:  # the prompt is a strict prefix of the history
        at = len(prompt)
        got = "its prompt ends there"
    else:
        got = f"the prompt has {_tokens(prompt, at, decode)}"
    expected = _tokens(history, at, decode)
    before = decode(history[max(0, at - CONTEXT_TOKENS) : at])
    why = (
        f"; the gateway could not reuse the sampled ids: {call.splice_note}"
        if (call.splice_note)
        else ""
    )
    raise SessionRefused(
        f"call {k + 1} of the session does not extend the conversation so far: at token {at}"
        f" (after {before!r}) the history has {expected}, {got}{why}. The trajectory would"
        " not be the ids the model was conditioned on; the session is refused",
        call=k,
        position=at,
    )


def _tokens(ids: list[int], at: int, decode: Decode) -> str:
    shown = ids[at : at + CONTEXT_TOKENS]
    return f"ids {shown} ({decode(shown)!r})" if shown else "nothing more"


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
