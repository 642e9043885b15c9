"""A slot-based KV cache for `HFEngine`: decoding sequences keep their rows between steps.

One tensor per layer (keys, and one for values) holds `[slots, kv_heads, capacity, head_dim]`.
Each sequence that is decoding owns one slot for as long as it decodes; its tokens sit at
positions 0..length-1 of that slot, and a step writes its new tokens right after them.
Attention reads the slots as views of that tensor and masks out every position past a row's
own length, so rows of different lengths share a step without being padded to each other.

Why: the padded layout (`tirl.backends.hf`, `kv_cache="padded"`) re-pads every row's cache
into a new batch tensor whenever a row joins or leaves, O(rows x length) copies on ~40% of the
steps of a tool-calling rollout, and pads every row of a step to its longest fed chunk (a row
that joins with a 25-token tool output made the seven decoding rows compute 25 positions
each). Here:
- a leave sets the leaving row's tokens aside (a copy of that row only) and moves the last
  row into the hole, so the rows of a step stay slots 0..n-1 and attention reads them as one
  view;
- a join writes back the joining row's earlier tokens (O(its length)), and its chunk runs in
  the same forward pass as the decoding rows: the step's tokens are packed into one sequence
  (no padding in the linear layers); only attention, which reads each row's own slot, pads
  the chunk's queries;
- a decode step writes one token per row in place: nothing else is copied.

How the model is run: the packed tokens go through the model's own layers; its attention
calls are routed, for the duration of the pass, to `slot_attention` (registered with
transformers' `AttentionInterface` as "tirl_slots"; the model's config names it only while
the pass runs). Positions are explicit per token (`position_ids`), so rotary and learned
position embeddings see each row's own positions. A forward pass that is not ours and runs
meanwhile (another thread on the same model) gets the model's own attention and masks.

Memory: the tensor is dense, rows x capacity positions (each position holding every layer's
key and value: `position_bytes`), so its size is the rows in flight times the longest of them.
It grows by doubling (O(1) amortized copies) as rows join and sequences lengthen; when it is
reallocated, the dimension that need not grow is cut back to what is in use (the 64 rows of
a burst of short requests are not kept at the length of the long one after it; `_shape`), and,
with a budget (`max_positions`, which `HFEngine` admits requests against), the shape never
exceeds the budget. When no sequence holds a slot, `SlotRows.free` hands the whole tensor
back, so a server's memory returns to its idle level between bursts. Tokens set aside
(sequences waiting on a tool) are separate copies, outside the budget.

Limits: models whose attention is "sdpa" or "eager", with no sliding-window layers and no
logit soft-capping (`supports`); one long row makes every row that long (no paging): sized
for the small models this engine is for.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

if TYPE_CHECKING:
    from tirl.backends.fused import FusedSlotForward

ATTENTION_NAME = "tirl_slots"
PLAN_KWARG = "tirl_slot_plan"  # the forward pass's `_Plan`, passed down to `slot_attention`

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [H, L, D]


def supports(model) -> bool:
    """True if `slot_attention` computes what the model's own attention does: "sdpa" or
    "eager", every layer full attention, no soft-capped logits."""
    config = model.config
    return (
        own_implementation(config) in ("sdpa", "eager")
        and "sliding_attention" not in (getattr(config, "layer_types", None) or ())
        and getattr(config, "attn_logit_softcapping", None) is None
        and not getattr(config, "is_encoder_decoder", False)
    )


def position_bytes(model) -> int:
    """Bytes one KV position takes: a key and a value of every layer's KV heads, in the
    model's dtype (what a dense cache of rows x capacity costs per position)."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = next(model.parameters()).dtype
    return 2 * config.num_hidden_layers * heads * head_dim * dtype.itemsize


def causal_row_mask(past: torch.Tensor, width: int, kv_len: int) -> torch.Tensor:
    """The attention mask of rows that each append up to `width` tokens after their `past`.

    Query j of row i sits at position past[i] + j and may attend to key positions
    0..past[i] + j of its own slot: earlier tokens and the chunk's tokens up to itself. Every
    later position (unused capacity, or what another sequence left there) is masked.

    past: [B] long. Returns [B, 1, width, kv_len] bool, True = attend.
    """
    last = past[:, None] + torch.arange(width)[None, :]  # [B, width] last visible position
    return (torch.arange(kv_len)[None, None, :] <= last[:, :, None])[:, None]


@dataclass
class _Group:
    """Rows that one attention call serves: those feeding one token, or those feeding chunks."""

    tokens: slice  # their tokens in the packed sequence
    rows: torch.Tensor  # [G] long: their slots, ascending
    span: slice | None  # slots read as one view (no copy): these, when consecutive, or see below
    width: int  # the longest chunk: queries are padded to it inside attention
    mask: torch.Tensor  # [G, 1, width, kv_len] bool ([S, ...] with `in_span`)
    # Chunks of several rows: (row in group, column) per token, where each row's queries go
    # in the padded [G, H, width, D] queries. None for one token per row, or for one row's
    # chunk (its queries are already [1, H, width, D]).
    at: tuple[torch.Tensor, torch.Tensor] | None
    # One token per row, rows not consecutive (rows feeding chunks sit between them): `span`
    # covers the S slots from the first row to the last and this is [G] long, each row's
    # place in it. Attention runs over the whole span, the other slots' queries zero and
    # their outputs dropped, instead of copying every row's keys and values out (a copy of
    # the whole cache, each layer of each step, for as long as a long prompt is prefilled).
    in_span: torch.Tensor | None = None
    _bias: torch.Tensor | None = None

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """`mask` as the additive mask sdpa makes of it (0 where True, -inf elsewhere, in the
        query's dtype), built once per pass instead of once per layer: the same numbers."""
        if self._bias is None or self._bias.dtype != dtype:
            zeros = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            self._bias = zeros.masked_fill_(self.mask.logical_not(), float("-inf"))
        return self._bias


@dataclass
class _Plan:
    """Where one forward pass's packed tokens go and what each token attends to."""

    write_rows: torch.Tensor  # [T] long: the slot of each packed token
    write_positions: torch.Tensor  # [T] long: its position in that slot
    groups: list[_Group]


def one_query_attention(query, keys, values, group: _Group, **sdpa) -> torch.Tensor:
    """Attention of a group that feeds one token per row: query [G, H, D], keys and values
    [G or S, H_kv, kv_len, D] (`_keys`); returns [G, H, D]. A KV head's query heads are its
    queries (no key is repeated). `sdpa`: scale, dropout_p."""
    rows, heads, dim = query.shape
    q = query.reshape(rows, keys.shape[1], -1, dim)  # [G, H_kv, H / H_kv, D]
    if group.in_span is not None:  # the span's other slots: zero queries, outputs dropped
        q = q.new_zeros((keys.shape[0], *q.shape[1:])).index_copy_(0, group.in_span, q)
    mask = group.bias(q.dtype)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, **sdpa)
    if group.in_span is not None:
        out = out.index_select(0, group.in_span)
    return out.reshape(rows, heads, dim)


def _keys(buffer: torch.Tensor, group: _Group) -> torch.Tensor:
    kv_len = group.mask.shape[-1]
    if group.span is not None:
        return buffer[group.span, :, :kv_len]
    return buffer.index_select(0, group.rows)[:, :, :kv_len]


def slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """Attention of packed tokens over their own slots, in transformers' attention-function
    form: query [1, H, T, D]; key and value are the whole slot tensors [slots, H_kv, C, D]
    (what `SlotKVCache.update` returns). Returns ([1, T, H, D], None)."""
    plan: _Plan | None = kw.get(PLAN_KWARG)
    if plan is None:  # a forward pass that is not ours: the model's own attention
        own = _original_attention(module)
        return own(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kw
        )
    unsupported = kw.get("sliding_window") is not None or kw.get("softcap") is not None
    if unsupported or hasattr(module, "sinks"):
        raise NotImplementedError("slot attention has no sliding window, soft-capping or sinks")
    heads, dim = query.shape[1], query.shape[-1]
    sdpa = dict(scale=scaling, dropout_p=dropout)
    parts = []
    for group in plan.groups:
        q = query[0, :, group.tokens].transpose(0, 1)  # [Tg, H, D]
        keys, values = _keys(key, group), _keys(value, group)  # [G, H_kv, kv_len, D]
        if group.width == 1:
            parts.append(one_query_attention(q, keys, values, group, **sdpa))
            continue
        if group.at is None:  # one row's chunk: nothing to pad
            mask = group.bias(q.dtype)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], keys, values, attn_mask=mask, enable_gqa=True, **sdpa
            )
            parts.append(out[0].transpose(0, 1))
            continue
        padded = q.new_zeros((group.rows.shape[0], heads, group.width, dim))
        padded[group.at[0], :, group.at[1]] = q
        out = F.scaled_dot_product_attention(
            padded, keys, values, attn_mask=group.bias(q.dtype), enable_gqa=True, **sdpa
        )
        parts.append(out[group.at[0], :, group.at[1]])  # [Tg, H, D]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.unsqueeze(0), None


# The implementation a model had before a pass of ours named "tirl_slots", by id(config): what
# a concurrent forward pass of someone else gets, and the masks it is built.
_ORIGINALS: dict[int, str] = {}


_PASSES: dict[int, int] = {}  # slot passes running now, by id(config)
_PASSES_LOCK = threading.Lock()


def _enter_pass(config) -> None:
    """Name "tirl_slots" in the config while any slot pass on it runs (engines on one model in
    several threads overlap): the first pass records the model's own implementation, the last
    one to leave puts it back."""
    with _PASSES_LOCK:
        key = id(config)
        if not _PASSES.get(key):
            _ORIGINALS[key] = config._attn_implementation
            config._attn_implementation = ATTENTION_NAME
        _PASSES[key] = _PASSES.get(key, 0) + 1


def _leave_pass(config) -> None:
    with _PASSES_LOCK:
        key = id(config)
        _PASSES[key] -= 1
        if not _PASSES[key]:
            config._attn_implementation = _ORIGINALS[key]


def own_implementation(config) -> str | None:
    """The model's own attention implementation, also while a slot pass has it renamed."""
    name = getattr(config, "_attn_implementation", None)
    return _ORIGINALS.get(id(config), name) if name == ATTENTION_NAME else name


def _original_attention(module):
    name = _ORIGINALS.get(id(module.config), "sdpa")
    if name == "eager":  # each modeling file has its own eager attention
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def _original_mask(*args, **kwargs):
    name = _ORIGINALS.get(id(kwargs.get("config")), "sdpa")
    return ALL_MASK_ATTENTION_FUNCTIONS[name](*args, **kwargs)


AttentionInterface.register(ATTENTION_NAME, slot_attention)
AttentionMaskInterface.register(ATTENTION_NAME, _original_mask)


class _SlotLayer(CacheLayerMixin):
    """One decoder layer's keys and values for every slot: `[slots, heads, capacity, dim]`."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("slot layers are allocated by SlotKVCache")

    def allocate(self, like_keys: torch.Tensor, like_values: torch.Tensor, rows: int, cap: int):
        # Zeros, not empty: a masked position still enters attention as weight 0 x value, and
        # 0 x a NaN left in uninitialized memory would be NaN.
        heads = like_keys.shape[1]
        self.keys = like_keys.new_zeros((rows, heads, cap, like_keys.shape[-1]))
        self.values = like_values.new_zeros((rows, heads, cap, like_values.shape[-1]))
        self.device, self.is_initialized = like_keys.device, True

    def resize(self, rows: int, cap: int) -> None:
        """Reallocate to `rows` x `cap`, keeping the first rows and positions of what is stored
        (a rare full copy; the caller keeps the rows and positions in use within the new
        shape). Layer by layer, so a resize holds at most one layer twice."""
        old_keys, old_values = self.keys, self.values
        keep_rows, keep_cap = min(rows, old_keys.shape[0]), min(cap, old_keys.shape[2])
        self.allocate(old_keys, old_values, rows, cap)
        self.keys[:keep_rows, :, :keep_cap] = old_keys[:keep_rows, :, :keep_cap]
        self.values[:keep_rows, :, :keep_cap] = old_values[:keep_rows, :, :keep_cap]

    def update(self, key_states, value_states, *args, **kwargs):
        raise RuntimeError("slot layers are written through SlotKVCache.update")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.keys.shape[2] if self.is_initialized else 0), 0

    def get_seq_length(self) -> int:
        return 0  # rows differ in length; positions are always passed explicitly

    def get_max_length(self) -> int:
        return -1  # grows on demand

    get_max_cache_shape = get_max_length  # the same method's name in transformers < 5.11


class SlotKVCache(Cache):
    """The KV tensors of every slot, passed to the model as its cache on each forward pass.

    `update` writes a pass's packed tokens where its plan says and returns the whole tensors,
    which `slot_attention` reads per row. `save`, `load` and `move` copy one slot's tokens
    out, in, and between slots. Layers are allocated at the first pass, when the model's
    key/value shapes and dtype are known, and again at the first pass after `free`.

    `max_positions` (None: no bound) bounds rows x capacity whenever the tensor is
    reallocated, as long as what is in use fits it (`reserve`)."""

    def __init__(self, max_rows: int, max_len: int, max_positions: int | None = None) -> None:
        super().__init__(layer_class_to_replicate=_SlotLayer)
        self.max_rows, self.max_len = max_rows, max_len
        self.max_positions = max_positions
        self.rows = 0  # slots allocated (or to allocate at the first pass)
        self.capacity = 0  # positions per slot allocated (or to allocate)
        self.plan: _Plan | None = None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """key_states, value_states: [1, H_kv, T, D], the packed tokens of this pass."""
        while len(self.layers) <= layer_idx:
            self.layers.append(_SlotLayer())
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.allocate(key_states, value_states, self.rows, self.capacity)
        rows, positions = self.plan.write_rows, self.plan.write_positions
        layer.keys[rows, :, positions] = key_states[0].transpose(0, 1)  # [T, H_kv, D]
        layer.values[rows, :, positions] = value_states[0].transpose(0, 1)
        return layer.keys, layer.values

    def allocate(self, layers: int, like: torch.Tensor) -> None:
        """Allocate `layers` layers at once, as `like` ([1, H_kv, 1, D]: heads, dtype, device)
        says: the fused pass (`tirl.backends.fused`) writes into them without `update`."""
        while len(self.layers) < layers:
            self.layers.append(_SlotLayer())
        for layer in self.layers:
            if not layer.is_initialized:
                layer.allocate(like, like, self.rows, self.capacity)

    @property
    def positions(self) -> int:
        """Positions allocated (or to allocate at the next pass): rows x capacity."""
        return self.rows * self.capacity

    def reserve(self, rows: int, cap: int) -> None:
        """Make room for `rows` slots of `cap` positions, where slots `rows`.. and positions
        `cap`.. hold nothing in use. Only when one must grow (or the budget shrank) is the
        tensor reallocated: that dimension doubles (O(1) amortized), the other is cut back to
        what is in use, all within `max_positions` (`_shape`)."""
        over = self.max_positions is not None and self.positions > self.max_positions
        if rows <= self.rows and cap <= self.capacity and not over:
            return
        limits = (self.max_rows, self.max_len)
        rows, cap = _shape((self.rows, self.capacity), (rows, cap), limits, self.max_positions)
        for layer in self.layers:
            layer.resize(rows, cap)
        self.rows, self.capacity = rows, cap

    def free(self) -> None:
        """Drop every layer's tensors (nothing may be in use): the next pass allocates anew."""
        self.layers.clear()
        self.rows = self.capacity = 0
        self.plan = None  # its masks are sized like the last pass

    def save(self, row: int, length: int) -> LayerKV:
        """A copy of slot `row`'s first `length` positions, per layer ([H, length, D] each)."""
        return [
            (layer.keys[row, :, :length].clone(), layer.values[row, :, :length].clone())
            for layer in self.layers
        ]

    def load(self, row: int, saved: LayerKV) -> None:
        """Write a `save`d sequence back into slot `row` (positions 0..length-1), which must
        be within the reserved shape (`reserve`)."""
        length = saved[0][0].shape[1]
        if not self.layers:  # freed since it was saved: allocate as the saved tokens are
            self.allocate(len(saved), saved[0][0][None, :, :1])
        for layer, (keys, values) in zip(self.layers, saved):
            layer.keys[row, :, :length] = keys
            layer.values[row, :, :length] = values

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot `src`'s first `length` positions into slot `dst`."""
        for layer in self.layers:
            layer.keys[dst, :, :length] = layer.keys[src, :, :length]
            layer.values[dst, :, :length] = layer.values[src, :, :length]


def _grown(have: int, need: int, limit: int) -> int:
    """`have` grown to hold `need`: doubled (so growth costs O(1) copies per position, amortized)
    but not past `limit` unless `need` is."""
    return have if need <= have else max(need, min(max(2 * have, 16), limit))


def _shape(
    have: tuple[int, int], need: tuple[int, int], limits: tuple[int, int], budget: int | None
) -> tuple[int, int]:
    """The (rows, capacity) to reallocate a slot tensor of shape `have` to, so that it holds
    `need`. A dimension that must grow grows (`_grown`, within `limits`); one that need not is
    cut to what is in use: rows to `need` (rows once in flight, a burst of short requests, are
    not kept at the length of a long one), capacity to twice `need` (the rows keep growing a
    token a step). Then, over `budget` positions, rows are cut back towards `need`, then
    capacity. Over the budget only when `need` itself is (the engine admits nothing such)."""
    rows = _grown(have[0], need[0], limits[0]) if need[0] > have[0] else need[0]
    cap = _grown(have[1], need[1], limits[1]) if need[1] > have[1] else min(have[1], 2 * need[1])
    if budget is not None and rows * cap > budget:
        rows = max(need[0], budget // cap)
        if rows * cap > budget:
            cap = max(need[1], budget // rows)
    return rows, cap


def _span(rows: list[int]) -> slice | None:
    first = rows[0]
    return slice(first, first + len(rows)) if rows[-1] - first == len(rows) - 1 else None


class SlotRows:
    """The slot store of `HFEngine`: which decoding sequence owns which slot, the tokens of the
    sequences that are not decoding (waiting on a tool, or done but not released), and the
    forward pass over slots.

    `arrange` (between steps) gives every sequence about to step a slot: it sets aside the
    tokens of those that left, packs the remaining ones into slots 0..n-1, and writes back the
    tokens of those that rejoin. `forward` (the step) runs one pass over all of them: through
    the model's own modules, or through `fused` (a `tirl.backends.fused.FusedSlotForward` of
    the same model, which the caller makes: the fused pass is built on this store, not the
    store on it) when it is given and usable.
    """

    def __init__(
        self,
        model,
        max_rows: int,
        max_len: int,
        cache_arg: str = "cache",
        keeps_last_logits: bool = True,
        fused: FusedSlotForward | None = None,
    ) -> None:
        if not supports(model):
            impl = own_implementation(model.config)
            raise ValueError(
                f"kv_cache='slots' needs full attention by 'sdpa' or 'eager' (this model: {impl!r},"
                " or sliding-window / soft-capped layers); use kv_cache='padded'"
            )
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = SlotKVCache(max_rows, max_len)
        self.cache_arg, self.keeps_last_logits = cache_arg, keeps_last_logits
        self.row_keys: list = []  # slot i holds the tokens of row_keys[i]
        self.set_aside: dict[object, LayerKV] = {}
        # What the bookkeeping copied, in rows: set aside, written back, moved to fill a hole.
        self.saves = self.loads = self.moves = 0
        self.forwards = 0
        self.fused = fused

    def arrange(self, keys: list, past: list[int], stored: dict) -> None:
        """Give each of `keys` (those about to step, with `past` tokens already stored each) a
        slot. A key that left since the last step has its first `stored[key]` tokens set aside;
        one missing from `stored` was released, and its tokens are dropped."""
        stepping = dict(zip(keys, past))
        slots = list(self.row_keys)
        for row, key in enumerate(slots):
            if key not in stepping:
                length = stored.get(key)
                if length:
                    self.set_aside[key] = self.cache.save(row, length)
                    self.saves += 1
                slots[row] = None
        lo, hi = 0, len(slots) - 1  # fill the holes with the last rows: slots 0..n-1 in use
        while True:
            while lo < len(slots) and slots[lo] is not None:
                lo += 1
            while hi >= 0 and slots[hi] is None:
                hi -= 1
            if lo >= hi:
                break
            self.cache.move(hi, lo, stepping[slots[hi]])
            slots[lo], slots[hi] = slots[hi], None
            self.moves += 1
        slots = [key for key in slots if key is not None]
        # Room for every stepping row's stored tokens, before any is written back: a
        # reallocation keeps only the rows and positions asked for here.
        self.cache.reserve(len(keys), max(past, default=0))
        holding = set(slots)
        for key in keys:
            if key in holding:
                continue
            saved = self.set_aside.pop(key, None)
            if saved is not None:
                self.cache.load(len(slots), saved)
                self.loads += 1
            elif stepping[key]:
                raise RuntimeError(f"no stored tokens for key {key!r} ({stepping[key]} expected)")
            slots.append(key)
        self.row_keys = slots

    def release(self, key: object) -> None:
        """Drop the tokens set aside for `key` (a slot it holds is freed when it leaves)."""
        self.set_aside.pop(key, None)

    def holds(self, live: set | dict) -> bool:
        """True if a slot holds tokens of one of the `live` keys (those not released)."""
        return any(key in live for key in self.row_keys)

    def free(self) -> None:
        """Hand the slot tensor back (no slot may hold live tokens: `holds`); tokens set
        aside stay. The next pass allocates it again, as small as that pass needs."""
        self.row_keys = []
        self.cache.free()

    @property
    def allocated_positions(self) -> int:
        """Positions of the slot tensor (rows x capacity; 0 once freed)."""
        return self.cache.positions if self.cache.layers else 0

    def forward(self, keys: list, feeds: list[list[int]], past: list[int]) -> torch.Tensor:
        """Next-token logits [B, V] of each of `keys` (arranged), in the order given.

        The tokens are packed rows that feed one token first, then rows that feed a chunk,
        each group in slot order: [1, T] through the model (or the fused pass), with
        explicit positions."""
        self.forwards += 1
        row_of = {key: row for row, key in enumerate(self.row_keys)}
        rows = [row_of[key] for key in keys]
        by_slot = sorted(range(len(keys)), key=rows.__getitem__)
        if all(len(f) == 1 for f in feeds):  # a decode step: one group, one token per row
            single, chunked = by_slot, []
            ids = [feeds[i][0] for i in by_slot]
            positions = [past[i] for i in by_slot]
            write_rows = [rows[i] for i in by_slot]
            ends = torch.arange(len(keys))
        else:
            single = [i for i in by_slot if len(feeds[i]) == 1]
            chunked = [i for i in by_slot if len(feeds[i]) > 1]
            order = single + chunked
            ids = [t for i in order for t in feeds[i]]
            positions = [past[i] + j for i in order for j in range(len(feeds[i]))]
            write_rows = [rows[i] for i in order for _ in feeds[i]]
            ends = torch.tensor([len(feeds[i]) for i in order]).cumsum(0) - 1  # rows' last tokens
        order = single + chunked  # batch indices in packed order
        groups = []
        start = 0
        for members in (single, chunked):
            if members:
                groups.append(self._group(members, rows, feeds, past, start))
                start += sum(len(feeds[i]) for i in members)
        self.cache.reserve(max(rows) + 1, max(p + len(f) for p, f in zip(past, feeds)))
        dev = self.device
        positions_t = torch.tensor(positions, device=dev)
        self.cache.plan = _Plan(torch.tensor(write_rows, device=dev), positions_t, groups)
        ids_t, ends = torch.tensor(ids, device=dev), ends.to(dev)
        if self.fused is not None and self.fused.usable():
            logits = self.fused.forward(self.cache, ids_t, positions_t, ends)
        else:
            logits = self._model_forward(ids_t, positions_t, ends)
        if order == list(range(len(keys))):
            return logits
        back = torch.empty(len(order), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(order))
        return logits[back.to(dev)]

    def _model_forward(self, ids: torch.Tensor, positions: torch.Tensor, ends: torch.Tensor):
        """The pass through the model's own modules, its attention routed to `slot_attention`;
        logits [B, V] at the packed tokens `ends`."""
        plan = self.cache.plan
        kwargs = {self.cache_arg: self.cache, PLAN_KWARG: plan}
        if self.keeps_last_logits:
            kwargs["logits_to_keep"] = ends
        config = self.model.config
        _enter_pass(config)  # this pass's attention: slot_attention
        try:
            out = self.model(
                input_ids=ids[None],
                # 4D, so transformers builds no mask of its own; slot_attention uses the plan's
                attention_mask=plan.groups[0].mask[:1],
                position_ids=positions[None],
                use_cache=True,
                **kwargs,
            )
        finally:
            _leave_pass(config)
        return out.logits[0] if self.keeps_last_logits else out.logits[0, ends]

    def _group(self, members: list[int], rows, feeds, past, start: int) -> _Group:
        slots = [rows[i] for i in members]
        lengths = [len(feeds[i]) for i in members]
        width = max(lengths)
        member_past = [past[i] for i in members]
        kv_len = max(past[i] + len(feeds[i]) for i in members)
        span, in_span = _span(slots), None
        if span is None and width == 1:  # attend over the span, around the rows between
            span = slice(slots[0], slots[-1] + 1)
            in_span = torch.tensor(slots, device=self.device) - slots[0]
            span_past = [0] * (span.stop - span.start)  # the others: position 0 (finite)
            for slot, p in zip(slots, member_past):
                span_past[slot - span.start] = p
            member_past = span_past
        past_t = torch.tensor(member_past)
        at = None
        if width > 1 and len(members) > 1:
            at = (
                torch.tensor(
                    [g for g, k in enumerate(lengths) for _ in range(k)], device=self.device
                ),
                torch.tensor([j for k in lengths for j in range(k)], device=self.device),
            )
        return _Group(
            tokens=slice(start, start + sum(lengths)),
            rows=torch.tensor(slots, device=self.device),
            span=span,
            width=width,
            mask=causal_row_mask(past_t, width, kv_len).to(self.device),
            at=at,
            in_span=in_span,
        )
