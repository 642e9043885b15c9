"""The written interface of a generation backend: what `tirl.rollout` asks of an engine.

Every engine (`HFEngine` in process, `OpenAIEngine` over HTTP to vLLM / SGLang / `tirl serve`,
`VLLMEngine` in process, and `tirl.rollout.router.Router` over several of them) continues
token sequences by key:

    out = await engine.generate(key, feed_ids, max_new_tokens=n, temperature=t, stop=fn, seed=s)

`feed_ids` are the tokens to append before sampling (the prompt on the first call, then the
interpreter's output); the engine keeps the rest of the sequence, so a trajectory that pauses
while its code runs resumes where it stopped. Sampling ends at end-of-sequence ("stop"), after
`max_new_tokens` or at the context's end ("length"), or when `stop(new_ids)` is true
("boundary": a code block closed). `release(key)` forgets the sequence. Token ids in, token ids
out: `GenOutput.ids` are exactly the sampled ids (architecture.md invariant 1).

Weights: `receives_weights` says whether the trainer can put new policy weights into the
engine; such an engine has `async load_weights(model)`, which the trainer awaits after every
update with the trained `torch.nn.Module` (`HFEngine` samples with that very model, or copies
it; `VLLMEngine` loads it through vLLM's own weight reload and drops its prefix cache). A push
that fails raises `WeightPushError`: the run stops rather than sample from stale weights.
Servers reached over HTTP do not receive weights (at scale, verl owns weight sync).

Closing differs by engine, so it is not part of the protocol: in-process engines have a
synchronous `close()`, HTTP clients an `async aclose()`; `close_engine` calls whichever exists.

Engines are made by name (`rollout.engine`) through the registry in `tirl.rollout.engines`.

This module imports neither torch nor an HTTP library, so a rollout over servers does not
pull torch in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# A boundary test over the ids sampled so far in this call (e.g. CIR's exact match on the
# closing fence). A server cannot run it, so it may carry `server_stop`: the stop strings a
# server is asked to stop at before the function is consulted (`tirl.backends.server_stops`).
StopFn = Callable[[list[int]], bool]


@dataclass
class GenOutput:
    """What one `generate` call sampled: the ids, their log-probabilities under the unscaled
    policy (0.0 where a server gives none), and why it ended: "stop" (end-of-sequence),
    "boundary" (the stop function said so) or "length"."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str


@runtime_checkable
class Engine(Protocol):
    """A generation backend: continue sequences by key, forget them on release."""

    receives_weights: bool

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
        """Feed `feed_ids` to sequence `key` and sample at most `max_new_tokens`. With `seed`,
        the call samples from its own random stream (the same draws whichever other requests
        share its batch)."""
        ...

    def release(self, key: object) -> None:
        """Forget sequence `key` (its cache, its ids). Unknown keys are ignored."""
        ...


class PromptTooLongError(ValueError):
    """A sequence's prompt leaves no room in the context for a single generated token: the
    sample cannot run (a failure, reported as such), unlike a sequence that fills the context
    while it runs (finish "length", a truncation)."""

    def __init__(self, prompt_tokens: int, context: int) -> None:
        super().__init__(
            f"the prompt has {prompt_tokens} tokens and the model's context {context}:"
            " no room to generate"
        )


def check_prompt_fits(prompt_tokens: int, context: int | None) -> None:
    """PromptTooLongError unless a prompt of `prompt_tokens` leaves room in `context`."""
    if context is not None and prompt_tokens >= context:
        raise PromptTooLongError(prompt_tokens, context)


class WeightPushError(RuntimeError):
    """The trained weights could not be put into the rollout engine: sampling on would use
    stale ones, so the run stops (its last checkpoint is left as it was)."""


async def close_engine(engine: object) -> None:
    """Close `engine` the way it closes: `await aclose()` if it has one, else `close()`."""
    aclose = getattr(engine, "aclose", None)
    if aclose is not None:
        await aclose()
        return
    close = getattr(engine, "close", None)
    if close is not None:
        close()
