"""Batched sampling with a KV cache on a Hugging Face causal LM, many sequences in flight.

`HFEngine.generate(key, feed_ids, ...)` continues the sequence named `key`: it feeds
`feed_ids` (the prompt, or the tokens of a tool output) and samples until end-of-sequence,
`max_new_tokens`, or until `stop(new_ids)` says a boundary was reached (a code block closed).
Each sequence keeps its own KV cache between calls, so a trajectory that pauses while its code
runs resumes without recomputing its prefix, and its row in the batch goes to others
meanwhile.

One background task runs the step loop. Every step takes each active sequence's next input
(a whole chunk of fed tokens, or the one token it sampled last), runs the model on all of
them with explicit position ids, and samples one token per sequence from its last fed
position. Requests join and leave between steps. Where the KV cache lives (`kv_cache`):

- "slots" (the default where `tirl.backends.kv_slots.supports` the model: "sdpa" or "eager"
  full attention): one preallocated tensor per layer, a slot per decoding sequence, kept
  while it decodes; a leave sets aside only the leaving row, a join writes back only the
  joining row, and its chunk runs in the same pass as the decoding rows (one forward pass
  per step, no padding in the linear layers);
- "padded": each sequence keeps its own cache; a step left-pads them into one batch cache
  (reusing the last step's when the rows are the same) and pads every fed chunk to the
  longest. The reference the slot cache is tested against, and the fallback for other
  attention (flash, flex, sliding windows, soft-capping).

The slot cache's forward pass (`fused`): for Qwen2- and Llama-style models
(`tirl.backends.fused.fused_supports`) it runs by default straight from the model's weights,
without transformers' per-layer modules (`tirl.backends.fused`: the same ids, log-probs within
float rounding). On the small CPU models this engine is for, a step's cost is mostly fixed
per-layer Python and small ops, whatever its rows; the fused pass about halves it. Other
models, and `fused=False` (`rollout.engine_options: {fused: false}`), run the modules.

Admission: "continuous" (default) lets any waiting request take a free row at any step.
"static" is the batch-synchronous baseline (ToRL-style rounds, `bench/rollout.py` part b): up
to `max_batch` keys are admitted together as one batch; a round decodes until every member
has stopped, the next round starts only when every member still alive has sent its next
request (members wait for each other's tool calls in lockstep), and no new key is admitted
until every member has been released.

Serving limits (`set_limits`, what `tirl serve` sets; unset, nothing changes for a rollout):
- `kv_budget`: KV positions the engine may hold in flight. The cache is dense (rows x the
  longest row, `tirl.backends.kv_slots`), so a request is admitted only when the rows in
  flight and it, each as long as the longest of them will grow (prompt + max_new_tokens),
  fit the budget; until then it waits, first come first served (a big request is never
  overtaken by small ones); one that could never fit is refused (`KVBudgetError`).
- `prefill_chunk` and `step_tokens`: a prompt (or tool output) is fed at most
  `prefill_chunk` tokens a step, and a step holds at most `step_tokens` tokens (each row
  feeds at least one; a request joins while rows are feeding prompts only if its first
  chunk fits the next step), so the rows decoding beside a long prompt get a token every
  step while it is prefilled, and a cancelled request stops within a step.

Memory: when nothing is in flight and no slot holds a sequence not yet released, the KV
tensors are handed back (`SlotRows.free`, and the heap trimmed), so an idle engine holds
no cache; the next request allocates what it needs.

Cancellation: a request whose caller was cancelled leaves the batch at the next step and its
key's cache is dropped, so a cancelled trajectory never keeps decoding or holds memory (nor
its share of the budget).

Limits: for the small models this backend is for (tests, the quickstart, debugging); large
models belong on vLLM / SGLang servers. Log-probabilities are those of the unscaled policy
(temperature 1), which is what a trainer recomputes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from tirl.backends.engine import GenOutput, StopFn, check_prompt_fits
from tirl.backends.fused import FusedSlotForward, fused_supports
from tirl.backends.kv_slots import SlotRows, position_bytes, supports
from tirl.cpu import pace
from tirl.models.lora import is_lora, merged_state_dict

__all__ = ["GenOutput", "HFEngine", "KVBudgetError", "StopFn", "position_bytes"]
# GenOutput, StopFn: tirl.backends.engine; position_bytes: tirl.backends.kv_slots

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [L, H, D]
KV_CACHES = ("auto", "slots", "padded")


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


class KVBudgetError(ValueError):
    """A request that needs more KV positions than the engine's whole budget: it could never
    be admitted, so it is refused instead of waiting forever."""


@dataclass
class _Request:
    key: object
    feed: list[int]  # tokens still to feed (the prompt or tool output, then the last sample)
    max_new_tokens: int
    temperature: float
    stop: StopFn | None
    future: asyncio.Future
    generator: torch.Generator | None = None  # this call's own sampling stream (`seed`)
    past: int = 0  # tokens of this key already in its cache (before `feed`)
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)

    @property
    def need(self) -> int:
        """The most positions its row can reach: what it holds, is fed and may generate."""
        return self.past + len(self.feed) + self.max_new_tokens - len(self.out_ids)


class HFEngine:
    """A continuous-batching sampler over one in-process model."""

    receives_weights = True  # it samples with the trainer's model (or a copy it overwrites)
    # Its log-probs are the trainer's own (same weights and dtype, temperature 1), up to float
    # rounding: `rl.old_logprobs: auto` takes them as pi_old (tirl.train.learner).
    logprobs_match_trainer = True

    def __init__(
        self,
        model: PreTrainedModel,
        eos_id: int,
        max_batch: int = 64,
        max_len: int | None = None,
        seed: int = 0,
        admission: str = "continuous",
        reuse_batch_cache: bool = True,
        kv_cache: str = "auto",
        fused: bool | None = None,
        threads: int = 0,
    ) -> None:
        """`kv_cache`: "slots", "padded", or "auto" (slots where `kv_slots.supports` the
        model, else padded); see the module docstring. `reuse_batch_cache` is the padded
        cache's decode fast path. `fused`: run the slot cache's forward pass from the model's
        weights (`tirl.backends.fused`) instead of through its modules: None (the default)
        where `fused_supports` the model, True to require it, False for the modules.
        `threads` > 0: at most that many torch threads for the engine's steps (0: as many as
        the run uses, `tirl.cpu`); on a tiny model one is faster than two."""
        if threads < 0:
            raise ValueError(f"threads is >= 0 (0: the run's), not {threads}")
        self.threads = threads
        if admission not in ("continuous", "static"):
            raise ValueError(f'admission is "continuous" or "static", not {admission!r}')
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache is one of {KV_CACHES}, not {kv_cache!r}")
        self.admission = admission
        self._members: set[object] = set()  # static admission: the keys of the current batch
        self.model = model
        self.eos_id = eos_id
        self.max_batch = max_batch
        self.max_len = max_len or getattr(model.config, "max_position_embeddings", 2048)
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lengths: dict[object, int] = {}  # tokens cached per key between calls
        self._unfed: dict[object, list[int]] = {}
        self._in_flight: set[object] = set()
        self._waiting: list[_Request] = []
        self._active: list[_Request] = []
        self._loop_task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; older releases know only the first.
        cache_arg = "cache" if "cache" in params else "past_key_values"
        keeps_last_logits = "logits_to_keep" in params
        if kv_cache == "auto":
            kv_cache = "slots" if supports(model) else "padded"
        self.kv_cache = kv_cache
        if fused and kv_cache != "slots":
            raise ValueError(f"fused=True needs kv_cache='slots' (this engine: {kv_cache!r})")
        if kv_cache == "slots":
            why = fused_supports(model)
            if fused and why is not None:
                raise ValueError(f"fused=True, but no fused pass for this model: {why}")
            self.fused = why is None if fused is None else fused
            fused_pass = FusedSlotForward(model) if self.fused else None
            self.kv = SlotRows(
                model, max_batch, self.max_len, cache_arg, keeps_last_logits, fused=fused_pass
            )
        else:
            self.fused = False
            self.kv = PaddedRows(model, cache_arg, keeps_last_logits, reuse_batch_cache)
        self.steps = 0
        self.rows_stepped = 0  # sum of batch sizes over steps: rows_stepped / steps = occupancy
        self.kv_budget: int | None = None  # `set_limits`
        self.prefill_chunk = self.max_len
        self.step_tokens = sys.maxsize

    def set_limits(
        self,
        kv_budget: int | None = None,
        prefill_chunk: int | None = None,
        step_tokens: int | None = None,
    ) -> None:
        """Bound what requests in flight may hold and what one step may feed (module
        docstring, "Serving limits"); None: no bound. Continuous admission only."""
        if kv_budget is not None and self.admission != "continuous":
            raise ValueError("kv_budget needs continuous admission")
        for name, value in (("kv_budget", kv_budget), ("prefill_chunk", prefill_chunk)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.kv_budget = kv_budget
        self.prefill_chunk = prefill_chunk or self.max_len
        self.step_tokens = step_tokens or sys.maxsize
        if isinstance(self.kv, SlotRows):
            self.kv.cache.max_positions = kv_budget

    @property
    def running(self) -> int:
        """Requests in the batch (admitted, prefilling or decoding)."""
        return len(self._active)

    @property
    def queued(self) -> int:
        """Requests waiting to be admitted (for a row, or for room in the budget)."""
        return len(self._waiting)

    @property
    def kv_reserved(self) -> int:
        """KV positions the requests in the batch may come to need: rows x the longest row's
        `need` (the dense cache's shape at their end); what admission holds to `kv_budget`."""
        return _dense(self._active)

    @property
    def kv_allocated(self) -> int:
        """KV positions allocated now: the slot tensor's rows x capacity (0 when freed)."""
        return self.kv.allocated_positions

    def held_keys(self) -> set[object]:
        """The keys whose tokens this engine still keeps (in a slot, set aside, or in their own
        cache): those with a call in flight, and finished ones not yet released."""
        if isinstance(self.kv, PaddedRows):
            return set(self.kv.caches)
        live = set(self._lengths) | {r.key for r in self._active}
        return set(self.kv.set_aside) | (set(self.kv.row_keys) & live)

    @property
    def _caches(self) -> dict[object, None]:
        """`held_keys` under the name the padded cache's dict had (tests read it)."""
        return dict.fromkeys(self.held_keys())

    @property
    def reused_steps(self) -> int:
        """Padded cache: decode steps that reused the last step's batch cache as it was."""
        return getattr(self.kv, "reused_steps", 0)

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
        if key in self._in_flight:
            raise ValueError(f"generate: key {key!r} already has a call in flight")
        # The token sampled last in the previous call is not in the cache yet: feed it first.
        feed_ids = self._unfed.pop(key, []) + list(feed_ids)
        past = self._lengths.get(key, 0)
        if not past:  # the key's prompt: one that cannot fit is a failed sample
            check_prompt_fits(len(feed_ids), self.max_len)
        room = self.max_len - past - len(feed_ids)
        if room <= 0 or max_new_tokens <= 0:
            return GenOutput([], [], "length")
        need = past + len(feed_ids) + min(max_new_tokens, room)
        if self.kv_budget is not None and need > self.kv_budget:
            raise KVBudgetError(
                f"this call needs {need} KV positions ({past + len(feed_ids)} fed,"
                f" {min(max_new_tokens, room)} to generate): more than the engine's budget of"
                f" {self.kv_budget}"
            )
        future = asyncio.get_running_loop().create_future()
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        self._waiting.append(
            _Request(
                key,
                list(feed_ids),
                min(max_new_tokens, room),
                temperature,
                stop,
                future,
                generator,
                past,
            )
        )
        self._in_flight.add(key)
        self._kick()
        try:
            return await future
        finally:
            self._in_flight.discard(key)

    def release(self, key: object) -> None:
        """Forget a finished sequence's cache."""
        self._lengths.pop(key, None)
        self._unfed.pop(key, None)
        self.kv.release(key)
        if key in self._members:
            self._members.discard(key)
            self._kick()  # the rest of a static batch may have been waiting for this one
        self._free_if_idle()

    def _free_if_idle(self) -> None:
        """Hand the KV tensors back once nothing is in flight and no slot holds a sequence
        that may continue: an idle engine holds no cache."""
        if self._active or self._waiting or self.kv.holds(self._lengths):
            return
        if self.kv.allocated_positions:
            self.kv.free()
            with contextlib.suppress(RuntimeError):  # RuntimeError: the engine was closed
                self._executor.submit(_trim_heap)  # off the event loop: a trim takes ~25 ms

    def _kick(self) -> None:
        """Start the step loop if it is idle and there is work it may admit."""
        if self._waiting and (self._loop_task is None or self._loop_task.done()):
            with contextlib.suppress(RuntimeError):  # no running loop: the next generate starts it
                self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def load_weights(self, model: torch.nn.Module) -> None:
        """Sample from `model`'s weights from now on: nothing to do when this engine samples
        `model` itself; else they are copied into this engine's model (from a model sharded
        with FSDP the shards are gathered: a collective every rank must call)."""
        if model is self.model:
            return
        if is_lora(model):  # the adapters merged into the base weights (tirl.models.lora)
            self.model.load_state_dict(merged_state_dict(model))
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True)
        self.model.load_state_dict(get_model_state_dict(model, options=options))

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
            failed, self._waiting, self._active = self._waiting + self._active, [], []
            for req in failed:
                self.release(req.key)
                if not req.future.done():
                    req.future.set_exception(exc)
        self._free_if_idle()

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            self._admit()
            if not self._active:
                return
            batch = list(self._active)
            feeds = self._feeds(batch)
            try:
                # Between steps, on this thread: the cache bookkeeping of joins and leaves.
                self.kv.arrange([r.key for r in batch], [r.past for r in batch], self._lengths)
                sampled = await loop.run_in_executor(self._executor, self._step, batch, feeds)
            except Exception as exc:  # a failed forward fails its requests, never hangs them
                for req in batch:
                    self._fail(req, exc)
                continue
            for req, feed, (token, logprob) in zip(batch, feeds, sampled):
                try:
                    self._advance(req, len(feed), token, logprob)
                except Exception as exc:  # its stop function raised: that request fails alone
                    self._fail(req, exc)
            await asyncio.sleep(0)  # let sandbox results and new requests in

    def _feeds(self, batch: list[_Request]) -> list[list[int]]:
        """What each row feeds this step. Every row feeds at least one token (so it steps and
        keeps its slot); a row with a prompt or tool output to feed takes a chunk of up to
        `prefill_chunk` tokens, in arrival order, while the step stays within `step_tokens`."""
        left = self.step_tokens - len(batch)
        feeds = []
        for req in batch:
            extra = max(0, min(min(len(req.feed), self.prefill_chunk) - 1, left))
            left -= extra
            feeds.append(req.feed[: 1 + extra])
        return feeds

    def _fail(self, req: _Request, exc: Exception) -> None:
        """End a request with `exc`. Its key keeps what its cache holds (`req.past` tokens)."""
        if req in self._active:
            self._active.remove(req)
            self._lengths[req.key] = req.past
        if not req.future.done():
            req.future.set_exception(exc)

    def _admit(self) -> None:
        if self.admission == "continuous":  # in arrival order: the first waits for room
            while (
                self._waiting
                and len(self._active) < self.max_batch
                and self._fits(self._waiting[0])
            ):
                self._active.append(self._waiting.pop(0))
            return
        if self._active:  # static: the round is still decoding
            return
        if not self._members:  # the last batch is done: the next keys in line form a new one
            self._members = {r.key for r in self._waiting[: self.max_batch]}
        if self._members <= {r.key for r in self._waiting}:  # every member is back
            self._active = [r for r in self._waiting if r.key in self._members]
            self._waiting = [r for r in self._waiting if r.key not in self._members]

    def _fits(self, req: _Request) -> bool:
        """Whether `req` may join the batch now: within `kv_budget`, and, while rows are still
        feeding their prompts, only if the next step has room for its first chunk too (one
        admitted sooner would hold a row and its memory while it fed a token a step)."""
        if self.kv_budget is not None and _dense([*self._active, req]) > self.kv_budget:
            return False
        if all(len(r.feed) == 1 for r in self._active):
            return True
        chunks = sum(min(len(r.feed), self.prefill_chunk) for r in [*self._active, req])
        return chunks <= self.step_tokens

    def _drop_cancelled(self) -> None:
        """Requests whose caller gave up leave the batch, and their caches go."""
        for queue in (self._waiting, self._active):
            for req in [r for r in queue if r.future.cancelled()]:
                queue.remove(req)
                self.release(req.key)

    def _advance(self, req: _Request, fed: int, token: int | None, logprob: float | None) -> None:
        """After a step that fed `fed` of `req`'s tokens and sampled `token` (None while it has
        more to feed: a chunk's last position is not where its next token comes from)."""
        req.past += fed  # the step cached what it was fed
        req.feed = req.feed[fed:]
        if req.future.cancelled() or token is None:  # cancelled: `_drop_cancelled` removes it
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
        self._lengths[req.key] = req.past
        self._unfed[req.key] = [token]  # fed at the start of this key's next call
        if not req.future.done():
            req.future.set_result(GenOutput(req.out_ids, req.out_logprobs, reason))

    @torch.no_grad()
    def _step(self, batch: list[_Request], feeds: list[list[int]]) -> list[tuple]:
        """One step over every active sequence, each fed its `feeds` entry; returns (token,
        logprob) each, (None, None) for a row with more to feed (nothing is drawn for it, so
        a seeded request's draws do not depend on how its prompt was chunked)."""
        pace(self.threads)  # on the engine's own thread: torch's count is per thread (tirl.cpu)
        self.steps += 1
        self.rows_stepped += len(batch)
        keys = [req.key for req in batch]
        logits = self.kv.forward(keys, feeds, [r.past for r in batch])  # [B, V]
        done = [i for i, (r, f) in enumerate(zip(batch, feeds)) if len(f) == len(r.feed)]
        if len(done) < len(batch):
            drawn = self._sample([batch[i] for i in done], logits[done]) if done else []
            out: list[tuple] = [(None, None)] * len(batch)
            for i, pair in zip(done, drawn):
                out[i] = pair
            return out
        return self._sample(batch, logits)

    def _sample(self, batch: list[_Request], logits: torch.Tensor) -> list[tuple[int, float]]:
        """A token and its log-prob for each row of `logits` [B, V]."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
        temperatures = [r.temperature for r in batch]
        # Only the ops a step needs (a step costs its op count on a CPU): at temperature 1,
        # logprobs / 1 is logprobs exactly; with no greedy row nothing is taken from argmax.
        # Every step draws from the engine's stream for all rows, as it always did.
        if all(t == 1.0 for t in temperatures):
            probs = torch.softmax(logprobs, -1)
        else:
            temps = torch.tensor(temperatures, device=logits.device)
            probs = torch.softmax(logprobs / temps.clamp_min(1e-6).unsqueeze(-1), -1)
        sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        for i, req in enumerate(batch):  # seeded calls draw from their own streams
            if req.generator is not None and req.temperature > 0:
                sampled[i] = torch.multinomial(probs[i], 1, generator=req.generator)[0]
        if all(t > 0 for t in temperatures):
            tokens = sampled
        else:
            drawn = torch.tensor([t > 0 for t in temperatures], device=logits.device)
            tokens = torch.where(drawn, sampled, logprobs.argmax(-1))
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return list(zip(tokens.tolist(), chosen.tolist()))


def _dense(rows: list[_Request]) -> int:
    """KV positions a dense cache of `rows` reaches: rows x the longest `need`."""
    return len(rows) * max((r.need for r in rows), default=0)


def _trim_heap() -> None:
    """Hand the heap's free memory back to the OS (glibc's malloc_trim): freed tensors below
    glibc's mmap threshold stay in the heap otherwise, and the process's RSS with them."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PaddedRows:
    """The padded cache: each key keeps its own cache (views of a batch cache), and a step
    left-pads them into one batch cache (`kv_cache="padded"`)."""

    def __init__(self, model, cache_arg: str, keeps_last_logits: bool, reuse: bool) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache_arg, self.keeps_last_logits = cache_arg, keeps_last_logits
        self.reuse_batch_cache = reuse  # the decode fast path of `forward`
        self.caches: dict[object, LayerKV] = {}
        self.reused_steps = 0
        self.repads = 0  # steps that re-padded every row's cache into a new batch cache
        self._last_decode: tuple | None = None  # (keys, cache, mask, lengths) after a decode step

    def arrange(self, keys: list, past: list[int], stored: dict) -> None:
        """Nothing to do between steps: `forward` lays the batch out."""

    def release(self, key: object) -> None:
        self.caches.pop(key, None)

    def holds(self, live: set | dict) -> bool:
        return any(key in live for key in self.caches)

    def free(self) -> None:
        """Drop the last decode step's batch cache (released keys' caches are gone already)."""
        self._last_decode = None

    @property
    def allocated_positions(self) -> int:
        """Positions of the last step's batch cache, while it is kept (rows x length)."""
        if self._last_decode is None:
            return 0
        keys = self._last_decode[1].layers[0].keys  # [B, H, T, D]
        return keys.shape[0] * keys.shape[2]

    def forward(self, keys: list, feeds: list[list[int]], past: list[int]) -> torch.Tensor:
        """Run the model on ragged chunks over ragged caches; next-token logits [B, V].

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
        keys = tuple(keys)
        # A key's cache may hold more than `past` tokens after a step that failed past the
        # forward pass (its request failed, its length stayed): only `past` of them count.
        caches = [_first(self.caches.get(key), p) for key, p in zip(keys, past)]
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
        kwargs = {"logits_to_keep": 1} if self.keeps_last_logits and k_max == 1 else {}
        if reuse:
            kwargs[self.cache_arg] = last[1]
        elif p_max > 0:
            self.repads += 1
            kwargs[self.cache_arg] = self._pad_caches(caches, p_max)
        else:
            kwargs[self.cache_arg] = _GrowingCache()
        out = self.model(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            use_cache=True,
            **kwargs,
        )
        cache = out[self.cache_arg] if self.cache_arg in out else out.past_key_values
        # Reusable next step only if no row has right padding (every feed was one token).
        lengths = [p + 1 for p in past]
        keep = self.reuse_batch_cache and k_max == 1 and keys
        self._last_decode = (keys, cache, mask, lengths) if keep else None
        # [B, H, T, D] -> [B, T, H, D] views, so that one row's span is a cheap slice.
        layers = [
            (layer.keys.transpose(1, 2), layer.values.transpose(1, 2)) for layer in cache.layers
        ]
        for i, (key, feed, p) in enumerate(zip(keys, feeds, past)):
            span = slice(p_max - p, p_max + len(feed))
            self.caches[key] = [(k[i, span], v[i, span]) for k, v in layers]
        last = torch.tensor([len(f) - 1 for f in feeds], device=dev)
        return out.logits[torch.arange(n, device=dev), last]

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


def _first(cache: LayerKV | None, length: int) -> LayerKV | None:
    """The first `length` positions of a per-key cache ([L, H, D] views per layer)."""
    if cache is None or length == 0:
        return None
    if cache[0][0].shape[0] == length:
        return cache
    return [(keys[:length], values[:length]) for keys, values in cache]
