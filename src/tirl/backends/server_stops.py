"""Generation through engines that cannot run the rollout's stop function (servers, vLLM).

Such an engine is asked to stop at the protocol's `server_stop` strings instead ("```" for
CIR's fences). The stop function then decides: a real boundary (a closed code block) ends
the call; a stop that is not one (a fence that opens a block) continues with one more
request from where the text stopped.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

from tirl.backends.engine import GenOutput, StopFn


class RequestSeeds:
    """The seed of each request to a server-like engine. A request that carries one keeps it;
    one that carries none gets the next of a stream drawn from the engine's `seed`. Sending
    the engine's seed itself with every unseeded request would give every request the same
    random draws: k samples of one prompt would be identical, and samples of different prompts
    correlated (avg@k measured on one draw). None: the server's own randomness."""

    def __init__(self, seed: int | None) -> None:
        self._stream = None if seed is None else random.Random(seed)

    def __call__(self, seed: int | None) -> int | None:
        if seed is not None or self._stream is None:
            return seed
        return self._stream.getrandbits(62)


# (ids, logprobs, finish_reason, stop_reason) of one completion request
Completion = tuple[list[int], list[float], str | None, object]
Complete = Callable[[list[int], int, tuple[str, ...], int | None], Awaitable[Completion]]


async def generate_with_server_stops(
    complete: Complete,
    history: list[int],
    max_new_tokens: int,
    stop: StopFn | None,
    seed: int | None,
    default_stops: tuple[str, ...] = (),
) -> GenOutput:
    """Continue `history` (extended in place) through `complete(ids, max_tokens, stops, seed)`
    until end-of-sequence, `max_new_tokens`, or a boundary the stop function confirms. Each
    request gets its own seed (`seed` + tokens so far), so continuations are not replays."""
    stops = tuple(getattr(stop, "server_stop", default_stops)) if stop is not None else ()
    new_ids: list[int] = []
    new_logprobs: list[float] = []
    reason = "length"
    while len(new_ids) < max_new_tokens:
        ids, logprobs, finish, stop_reason = await complete(
            history + new_ids,
            max_new_tokens - len(new_ids),
            stops,
            None if seed is None else seed + len(new_ids),
        )
        new_ids += ids
        new_logprobs += logprobs
        if finish == "length" or not ids:
            break
        if finish == "stop" and stop_reason in stops:
            if stop(new_ids):
                reason = "boundary"
                break
            continue  # the fence opened a block: keep generating
        reason = "stop"
        break
    history.extend(new_ids)
    return GenOutput(new_ids, new_logprobs, reason)
