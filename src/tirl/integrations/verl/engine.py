"""tirl's engine interface (`tirl.backends.engine.Engine`) over verl's LLM server client.

Inside verl, an agent loop samples through `server_manager.generate(request_id, prompt_ids=,
sampling_params=) -> TokenOutput(token_ids, log_probs, stop_reason, extra_fields)` (verl 0.9.1
`verl.workers.rollout.llm_server.LLMServerClient`; `TokenOutput` is
`verl.workers.rollout.replica`). Token ids in, token ids out, so tirl's rollout runs on it
unchanged (architecture.md invariant 1):

- per key, the engine keeps the sequence's whole history and sends it as `prompt_ids` with
  every request (vLLM's prefix cache makes the re-prefill cheap), with `max_tokens`,
  `temperature`, the rollout's `stop` strings and `include_stop_str_in_output` (SGLang:
  `no_stop_trim`), so the ids that come back are exactly the ids sampled;
- code boundaries: a server cannot run the rollout's stop function (CIR's exact match on the
  closing fence), so it is asked to stop at the protocol's `server_stop` strings and the
  function decides (`tirl.backends.server_stops.generate_with_server_stops`, shared with
  `OpenAIEngine`): a fence that opens a block is no boundary, and generation goes on;
- one request id per key, so one per trajectory: verl's load balancer pins a request id to one
  server replica (a sticky session, so the prefix cache holds the trajectory);
- the finish reason is inferred: verl's vLLM server folds stop, length and end-of-sequence into
  `stop_reason="completed"` (`vllm_async_server.py`), so a request ended at an end-of-sequence
  id ("stop") when its last id is one of `eos_ids`; at a stop string when that string ends in
  its last token (the stop function then decides "boundary"); and otherwise it ran out of room
  ("length": `max_tokens`, or the server's context). "aborted" (verl pauses a server for weight
  sync and the client does not resume) is an error: the rollout ends the trajectory with
  finish_reason "error" and the agent loop reports it;
- `max_response_tokens`: verl's response tensor holds at most `rollout.response_length` ids
  after the prompt, model and interpreter tokens together. No request asks for more than is
  left of it, and a sequence with no room left ends with "length" and no request (as
  `HFEngine` does at its context's end), so a trajectory never samples a model token that verl
  would cut off (only the tail of a tool output can overflow; the loop cuts it);
- log-probabilities are passed through as the server computed them (verl's vLLM is started
  with `logprobs_mode: processed_logprobs`, so they are under the same temperature the actor
  divides its logits by); 0.0 when the request asked for none.

`receives_weights` is True: verl pushes every step's weights into its servers (the trainer's
`checkpoint_manager.update_weights(global_steps)`), and every response carries the version it
was sampled with (`extra_fields["global_steps"]`, which `LLMServerClient` also copies to
`min_global_steps` / `max_global_steps`). The engine keeps the versions it saw (`versions`,
`policy_version`) and calls `on_version` with each one, so the rollout can record them and the
agent loop can apply CIR's budget schedule by policy version.

Not covered: multimodal requests; verl's fully-async client (`FullyAsyncLLMServerClient`)
resumes aborted requests itself and works here unchanged; SGLang's parameter names are mapped
but untested on a real SGLang server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tirl.backends.engine import GenOutput, StopFn
from tirl.backends.server_stops import generate_with_server_stops

ABORTED = ("aborted", "abort")  # verl's vLLM server says "aborted"; SGLang's finish type "abort"

# Server-specific names of the two sampling parameters the engine relies on; the rest
# (max_tokens, temperature, stop, logprobs) are read by both of verl's servers.
PARAM_NAMES: Mapping[str, Mapping[str, str]] = {
    "vllm": {"keep_stop": "include_stop_str_in_output", "seed": "seed"},
    "sglang": {"keep_stop": "no_stop_trim", "seed": "sampling_seed"},
}


def new_request_id() -> str:
    """A fresh request id (as verl's own agent loops make them)."""
    return uuid.uuid4().hex


@dataclass
class _Sequence:
    """One key's sequence: everything the server has seen and sampled for it so far."""

    request_id: str
    history: list[int]
    prompt_len: int  # ids of the first feed: the prompt (what verl does not count as response)


class VerlServerEngine:
    """The engine interface over a verl `LLMServerClient` (or anything with its `generate`)."""

    receives_weights = True  # verl syncs each step's weights into its servers (module docstring)

    def __init__(
        self,
        client: Any,
        tokenizer: Any,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        eos_ids: Iterable[int] = (),
        max_response_tokens: int | None = None,
        backend: str = "vllm",
        request_id: Callable[[], str] = new_request_id,
        request_kwargs: Mapping[str, Any] | None = None,
        on_version: Callable[[int], None] | None = None,
    ) -> None:
        """`sampling_params`: verl's own for this sample (top_p, top_k, logprobs, ...); the
        engine sets max_tokens, temperature, stop and seed on top of them. `eos_ids`: the ids
        a server ends a sequence at (the tokenizer's and the generation config's end tokens,
        the chat template's end of turn). `max_response_tokens`: verl's `response_length`.
        `request_id` makes the one id of each new key; `request_kwargs` go with every request
        (verl's `priority`)."""
        if backend not in PARAM_NAMES:
            raise ValueError(f"backend must be one of {', '.join(PARAM_NAMES)}, not {backend!r}")
        self.client = client
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params or {})
        self.eos_ids = frozenset(int(i) for i in eos_ids if i is not None)
        self.max_response_tokens = max_response_tokens
        self.names = PARAM_NAMES[backend]
        self.make_request_id = request_id
        self.request_kwargs = dict(request_kwargs or {})
        self.on_version = on_version
        self.versions: list[int] = []  # every policy version reported, in order
        self.min_version: int | None = None  # the oldest, resumed requests' starts included
        self.requests = 0
        self.generate_s = 0.0  # time spent waiting on the server
        self.num_preempted: int | None = None
        self._sequences: dict[object, _Sequence] = {}

    # ------------------------------------------------------------------ the Engine protocol
    async def generate(
        self,
        key: object,
        feed_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        stop: StopFn | None = None,
        seed: int | None = None,
    ) -> GenOutput:
        seq = self._sequences.get(key)
        if seq is None:
            if not feed_ids:
                raise ValueError("the first generate of a key needs the prompt's ids")
            seq = _Sequence(self.make_request_id(), [], len(feed_ids))
            self._sequences[key] = seq
        seq.history.extend(int(i) for i in feed_ids)

        async def complete(ids, max_tokens, stops, request_seed):
            return await self._request(seq, ids, max_tokens, temperature, stops, request_seed)

        return await generate_with_server_stops(complete, seq.history, max_new_tokens, stop, seed)

    def release(self, key: object) -> None:
        self._sequences.pop(key, None)

    # ------------------------------------------------------------------ what it saw
    def request_id_of(self, key: object) -> str | None:
        seq = self._sequences.get(key)
        return None if seq is None else seq.request_id

    @property
    def policy_version(self) -> int | None:
        """The version of the weights that sampled the latest response (None: none reported)."""
        return self.versions[-1] if self.versions else None

    # ------------------------------------------------------------------ one request
    async def _request(
        self,
        seq: _Sequence,
        ids: list[int],
        max_tokens: int,
        temperature: float,
        stops: tuple[str, ...],
        seed: int | None,
    ) -> tuple[list[int], list[float], str, str | None]:
        if self.max_response_tokens is not None:
            room = self.max_response_tokens - (len(ids) - seq.prompt_len)
            if room <= 0:  # verl's response tensor is full: no request, as at a context's end
                return [], [], "length", None
            max_tokens = min(max_tokens, room)
        params = {**self.sampling_params, "temperature": temperature, "max_tokens": max_tokens}
        if stops:
            params["stop"] = list(stops)
            params[self.names["keep_stop"]] = True
        if seed is not None:
            params[self.names["seed"]] = seed
        start = time.perf_counter()
        out = await self.client.generate(
            request_id=seq.request_id,
            prompt_ids=list(ids),
            sampling_params=params,
            **self.request_kwargs,
        )
        self.generate_s += time.perf_counter() - start
        self.requests += 1
        if out.num_preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + out.num_preempted
        if out.stop_reason in ABORTED:
            raise RuntimeError(
                f"verl's server aborted request {seq.request_id} (stop_reason {out.stop_reason!r});"
                " use verl's fully-async client to resume aborted requests"
            )
        self._note_versions(out.extra_fields or {})
        new_ids = [int(i) for i in out.token_ids]
        logprobs = [float(x) for x in out.log_probs or []]
        if len(logprobs) != len(new_ids):
            logprobs = [0.0] * len(new_ids)
        finish, stop_string = self.finish_of(new_ids, stops, out.stop_reason)
        return new_ids, logprobs, finish, stop_string

    def finish_of(
        self, ids: list[int], stops: tuple[str, ...], server_reason: str | None = None
    ) -> tuple[str, str | None]:
        """Why a request ended, as (finish_reason, stop string): ("stop", None) at an
        end-of-sequence id, ("stop", s) when stop string `s` ends in the last token, else
        ("length", None). A server that does say "length" (SGLang) is believed."""
        if not ids or server_reason == "length":
            return "length", None
        if ids[-1] in self.eos_ids:
            return "stop", None
        matched = self._stop_in_last_token(ids, stops)
        return ("stop", matched) if matched is not None else ("length", None)

    def _stop_in_last_token(self, ids: list[int], stops: tuple[str, ...]) -> str | None:
        """The stop string that the last token completes, if any. A server stops at the first
        stop string in its output's text, so that one ends in the output's last token."""
        if not stops:
            return None
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        before = len(self.tokenizer.decode(ids[:-1], skip_special_tokens=True))
        for s in stops:
            if text.find(s, max(0, before - len(s) + 1)) != -1:
                return s
        return None

    def _note_versions(self, extra_fields: Mapping[str, Any]) -> None:
        """Record the response's policy version (`global_steps`: the weights that sampled its
        end) and the oldest one it spans (`min_global_steps`: verl's fully-async client
        resumes an aborted request under newer weights)."""
        oldest = [extra_fields.get(k) for k in ("min_global_steps", "global_steps")]
        oldest = [int(v) for v in oldest if v is not None]
        if oldest:
            low = min(oldest)
            self.min_version = low if self.min_version is None else min(self.min_version, low)
        version = extra_fields.get("global_steps")
        if version is None:
            return
        self.versions.append(int(version))
        if self.on_version is not None:
            self.on_version(int(version))
