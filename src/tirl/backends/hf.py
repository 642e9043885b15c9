"""Batched sampling with a KV cache on a Hugging Face causal LM, many sequences in flight.

`HFEngine.generate(key, feed_ids, ...)` continues the sequence named `key`: it feeds
`feed_ids` (the prompt, or the tokens of a tool output) and samples until end-of-sequence,
`max_new_tokens`, or until `stop(new_ids)` says a boundary was reached (a code block closed).
Each sequence keeps its own KV cache between calls, so a trajectory that pauses while its code
runs resumes without recomputing its prefix, and its slot in the batch goes to others
meanwhile.

One background task runs the step loop. Every step takes each active sequence's next input
(a whole chunk of fed tokens, or the one token it sampled last), left-pads the per-sequence
caches into one batch, places each chunk right after its cache, runs one forward pass with
an attention mask and explicit position ids, and samples one token per sequence from its
last real position. Requests join and leave between steps.

Admission: "continuous" (default) lets any waiting request take a free row at any step.
"static" is the batch-synchronous baseline (ToRL-style rounds, `bench/rollout.py` part b): up
to `max_batch` keys are admitted together as one batch; a round decodes until every member
has stopped, the next round starts only when every member still alive has sent its next
request (members wait for each other's tool calls in lockstep), and no new key is admitted
until every member has been released.

Cancellation: a request whose caller was cancelled leaves the batch at the next step and its
key's cache is dropped, so a cancelled trajectory never keeps decoding or holds memory.

Limits: the per-step re-padding of caches costs O(batch x length) copies, cheap for the
small models this backend is for (tests, the quickstart, debugging). Large models belong on
vLLM / SGLang servers. Log-probabilities are those of the unscaled policy (temperature 1),
which is what a trainer recomputes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from tirl.backends.engine import GenOutput, StopFn

__all__ = ["GenOutput", "HFEngine", "StopFn"]  # GenOutput, StopFn: tirl.backends.engine

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [L, H, D]


class _GrowingLayer(DynamicLayer):
    """A KV cache layer that appends into a preallocated buffer, doubling it when full.

    transformers' DynamicLayer concatenates on every update, copying the whole cache each
    decode step (quadratic in length, and linear in batch size per step). Appending in place
    costs only the new tokens. Earlier `keys` views stay valid: later writes land past them,
    and a full buffer is replaced, not overwritten.
    """

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._filled, self._kbuf, self._vbuf = 0, None, None
        end = self._filled + key_states.shape[-2]
        if self._kbuf is None or end > self._kbuf.shape[-2]:
            capacity = max(end + 64, 2 * end)
            self._kbuf = self._grown(self._kbuf, key_states, capacity)
            self._vbuf = self._grown(self._vbuf, value_states, capacity)
        self._kbuf[..., self._filled : end, :] = key_states
        self._vbuf[..., self._filled : end, :] = value_states
        self._filled = end
        self.keys, self.values = self._kbuf[..., :end, :], self._vbuf[..., :end, :]
        return self.keys, self.values

    def _grown(self, old, like, capacity: int):
        buf = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
        if old is not None:
            buf[..., : self._filled, :] = old[..., : self._filled, :]
        return buf


class _GrowingCache(DynamicCache):
    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=_GrowingLayer)


@dataclass
class _Request:
    key: object
    feed: list[int]
    max_new_tokens: int
    temperature: float
    stop: StopFn | None
    future: asyncio.Future
    generator: torch.Generator | None = None  # this call's own sampling stream (`seed`)
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)


class HFEngine:
    """A continuous-batching sampler over one in-process model."""

    receives_weights = True  # it samples with the trainer's model (or a copy it overwrites)

    def __init__(
        self,
        model: PreTrainedModel,
        eos_id: int,
        max_batch: int = 64,
        max_len: int | None = None,
        seed: int = 0,
        admission: str = "continuous",
        reuse_batch_cache: bool = True,
    ) -> None:
        if admission not in ("continuous", "static"):
            raise ValueError(f'admission is "continuous" or "static", not {admission!r}')
        self.admission = admission
        self._members: set[object] = set()  # static admission: the keys of the current batch
        self.model = model
        self.eos_id = eos_id
        self.max_batch = max_batch
        self.max_len = max_len or getattr(model.config, "max_position_embeddings", 2048)
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._caches: dict[object, LayerKV] = {}
        self._lengths: dict[object, int] = {}
        self._unfed: dict[object, list[int]] = {}
        self._waiting: list[_Request] = []
        self._active: list[_Request] = []
        self._loop_task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; older releases know only the first.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keeps_last_logits = "logits_to_keep" in params
        self.reuse_batch_cache = reuse_batch_cache  # the decode fast path of `_forward`
        self.reused_steps = 0
        self._last_decode: tuple | None = None  # (keys, cache, mask, lengths) after a decode step
        self.steps = 0
        self.rows_stepped = 0  # sum of batch sizes over steps: rows_stepped / steps = occupancy

    # ------------------------------------------------------------------ public API
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
        """Continue sequence `key`. With `seed`, this call samples from its own random stream,
        so what it draws does not depend on which other requests share its batch steps."""
        if not feed_ids:
            raise ValueError("generate needs at least one token to feed")
        # The token sampled last in the previous call is not in the cache yet: feed it first.
        feed_ids = self._unfed.pop(key, []) + list(feed_ids)
        length = self._lengths.get(key, 0) + len(feed_ids)
        room = self.max_len - length
        if room <= 0 or max_new_tokens <= 0:
            return GenOutput([], [], "length")
        future = asyncio.get_running_loop().create_future()
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        self._waiting.append(
            _Request(
                key, list(feed_ids), min(max_new_tokens, room), temperature, stop, future, generator
            )
        )
        self._kick()
        return await future

    def release(self, key: object) -> None:
        """Forget a finished sequence's cache."""
        self._caches.pop(key, None)
        self._lengths.pop(key, None)
        self._unfed.pop(key, None)
        if key in self._members:
            self._members.discard(key)
            self._kick()  # the rest of a static batch may have been waiting for this one

    def _kick(self) -> None:
        """Start the step loop if it is idle and there is work it may admit."""
        if self._waiting and (self._loop_task is None or self._loop_task.done()):
            with contextlib.suppress(RuntimeError):  # no running loop: the next generate starts it
                self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def close(self) -> None:
        self._executor.shutdown(wait=False)

    # ------------------------------------------------------------------ step loop
    def loop_alive(self) -> bool:
        """False when requests are in flight but no step loop runs to serve them: the loop
        died of an exception it could not pin on requests (only a BaseException can do that)."""
        waiting = bool(self._waiting) and self.admission == "continuous"
        if not (self._active or waiting):
            return True
        return self._loop_task is not None and not self._loop_task.done()

    async def _run(self) -> None:
        try:
            await self._steps()
        except Exception as exc:  # a fault no request can be blamed for: fail all, hang none
            for req in self._waiting + self._active:
                self.release(req.key)
                if not req.future.done():
                    req.future.set_exception(exc)
            self._waiting, self._active = [], []

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            self._admit()
            if not self._active:
                return
            batch = list(self._active)
            try:
                sampled = await loop.run_in_executor(self._executor, self._step, batch)
            except Exception as exc:  # a failed forward fails its requests, never hangs them
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(exc)
                self._active = [r for r in self._active if r not in batch]
                continue
            for req, (token, logprob) in zip(batch, sampled):
                try:
                    self._advance(req, token, logprob)
                except Exception as exc:  # its stop function raised: that request fails alone
                    if req in self._active:
                        self._active.remove(req)
                    if not req.future.done():
                        req.future.set_exception(exc)
            await asyncio.sleep(0)  # let sandbox results and new requests in

    def _admit(self) -> None:
        if self.admission == "continuous":
            while self._waiting and len(self._active) < self.max_batch:
                self._active.append(self._waiting.pop(0))
            return
        if self._active:  # static: the round is still decoding
            return
        if not self._members:  # the last batch is done: the next keys in line form a new one
            self._members = {r.key for r in self._waiting[: self.max_batch]}
        if self._members <= {r.key for r in self._waiting}:  # every member is back
            self._active = [r for r in self._waiting if r.key in self._members]
            self._waiting = [r for r in self._waiting if r.key not in self._members]

    def _drop_cancelled(self) -> None:
        """Requests whose caller gave up leave the batch, and their caches go."""
        for queue in (self._waiting, self._active):
            for req in [r for r in queue if r.future.cancelled()]:
                queue.remove(req)
                self.release(req.key)

    def _advance(self, req: _Request, token: int, logprob: float) -> None:
        if req.future.cancelled():  # its caller gave up: `_drop_cancelled` removes it
            return
        req.out_ids.append(token)
        req.out_logprobs.append(logprob)
        req.feed = [token]
        if token == self.eos_id:
            reason = "stop"
        elif req.stop is not None and req.stop(req.out_ids):
            reason = "boundary"
        elif len(req.out_ids) >= req.max_new_tokens:
            reason = "length"
        else:
            return
        self._active.remove(req)
        self._unfed[req.key] = [token]  # fed at the start of this key's next call
        if not req.future.done():
            req.future.set_result(GenOutput(req.out_ids, req.out_logprobs, reason))

    @torch.no_grad()
    def _step(self, batch: list[_Request]) -> list[tuple[int, float]]:
        """One forward pass over every active sequence; returns (token, logprob) each."""
        self.steps += 1
        self.rows_stepped += len(batch)
        feeds = [req.feed for req in batch]
        caches = [self._caches.get(req.key) for req in batch]
        past = [self._lengths.get(req.key, 0) for req in batch]
        keys = tuple(req.key for req in batch)
        logits, new_caches = self._forward(feeds, caches, past, keys)  # [B, V]
        for req, cache, n_past, feed in zip(batch, new_caches, past, feeds):
            self._caches[req.key] = cache
            self._lengths[req.key] = n_past + len(feed)
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
        temps = torch.tensor([r.temperature for r in batch], device=logits.device)
        greedy = logprobs.argmax(-1)
        probs = torch.softmax(logprobs / temps.clamp_min(1e-6).unsqueeze(-1), -1)
        sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        for i, req in enumerate(batch):  # seeded calls draw from their own streams
            if req.generator is not None and req.temperature > 0:
                sampled[i] = torch.multinomial(probs[i], 1, generator=req.generator)[0]
        tokens = torch.where(temps > 0, sampled, greedy)
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return list(zip(tokens.tolist(), chosen.tolist()))

    def _forward(
        self,
        feeds: list[list[int]],
        caches: list[LayerKV | None],
        past: list[int],
        keys: tuple = (),
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        """Run the model on ragged chunks over ragged caches.

        Row i is laid out as [pad, cache_i, feed_i, pad]: caches left-padded to the longest,
        each feed right after its cache. Row i's real tokens are then one contiguous span,
        so its new cache is a view of the batch's, and its next-token logits sit at column
        p_max + k_i - 1.

        Decode fast path: when the same `keys` as in the last step each feed one token after a
        step in which each fed one token, the last step's batch cache already has this layout,
        so it is passed on as it is (no re-padding) with one more mask column. That is the
        steady state of continuous batching between joins and leaves; the inputs to the
        model, hence its outputs, are the same as with re-padding.
        """
        n, dev = len(feeds), self.device
        p_max, k_max = max(past), max(len(f) for f in feeds)
        ids = torch.zeros((n, k_max), dtype=torch.long)  # padding ids are masked out
        positions = torch.zeros((n, k_max), dtype=torch.long)
        last = self._last_decode
        reuse = last is not None and k_max == 1 and keys == last[0] and list(past) == last[3]
        self.reused_steps += reuse
        if reuse:
            mask = torch.cat([last[2], torch.ones((n, 1), dtype=torch.long)], dim=1)
        else:
            mask = torch.zeros((n, p_max + k_max), dtype=torch.long)
        for i, (feed, p) in enumerate(zip(feeds, past)):
            k = len(feed)
            ids[i, :k] = torch.tensor(feed)
            positions[i, :k] = torch.arange(p, p + k)
            if not reuse:
                mask[i, p_max - p : p_max + k] = 1
        kwargs = {"logits_to_keep": 1} if self._keeps_last_logits and k_max == 1 else {}
        if reuse:
            kwargs[self._cache_arg] = last[1]
        elif p_max > 0:
            kwargs[self._cache_arg] = self._pad_caches(caches, p_max)
        else:
            kwargs[self._cache_arg] = _GrowingCache()
        out = self.model(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            use_cache=True,
            **kwargs,
        )
        cache = out[self._cache_arg] if self._cache_arg in out else out.past_key_values
        # Reusable next step only if no row has right padding (every feed was one token).
        lengths = [p + 1 for p in past]
        keep = self.reuse_batch_cache and k_max == 1 and keys
        self._last_decode = (keys, cache, mask, lengths) if keep else None
        # [B, H, T, D] -> [B, T, H, D] views, so that one row's span is a cheap slice.
        layers = [
            (layer.keys.transpose(1, 2), layer.values.transpose(1, 2)) for layer in cache.layers
        ]
        new_caches = []
        for i, (feed, p) in enumerate(zip(feeds, past)):
            span = slice(p_max - p, p_max + len(feed))
            new_caches.append([(keys[i, span], values[i, span]) for keys, values in layers])
        last = torch.tensor([len(f) - 1 for f in feeds], device=dev)
        return out.logits[torch.arange(n, device=dev), last], new_caches

    def _pad_caches(self, caches: list[LayerKV | None], p_max: int) -> DynamicCache:
        """Left-pad every sequence's cache to `p_max` (the longest) and stack them per layer."""
        template = next(c for c in caches if c is not None)
        empty = template[0][0][:0]  # [0, H, D]
        cache = _GrowingCache()
        for layer_idx in range(len(template)):
            for_keys = [c[layer_idx][0] if c is not None else empty for c in caches]
            for_values = [c[layer_idx][1] if c is not None else empty for c in caches]
            keys = pad_sequence(for_keys, batch_first=True, padding_side="left")  # [B, P, H, D]
            values = pad_sequence(for_values, batch_first=True, padding_side="left")
            cache.update(keys.transpose(1, 2), values.transpose(1, 2), layer_idx)
        return cache
