"""A fused forward pass over the slot KV cache for Qwen2- and Llama-style decoders.

`HFEngine`'s step on the small models it is for is dominated by fixed per-layer Python cost,
not arithmetic: a one-row decode pass through transformers' modules spent about half its time
in Python outside torch ops (module calls, keyword plumbing, the cache and attention
interfaces, mask bookkeeping) and another third in small ops (`BENCHMARKS.md`, issue 17), so a
step cost nearly as much for one row as for eight. `FusedSlotForward` runs the same
computation straight from the model's weights: no module calls, one matrix product for q/k/v
and one for gate/up (their weights concatenated, and rebuilt when a parameter is changed or
replaced), rotary embedding on q and k together, keys and values written into the slot cache
(`tirl.backends.kv_slots`) and read by the same attention calls as `slot_attention` makes.
About half the cost of a decode pass on the tiny CPU models (`bench/rollout.py --profile`).

What it computes is what the model's own forward computes: the same ops in the same order
(the one difference, matrix products over concatenated weights, could round differently in
the last bit on some BLAS; on the CPU it was tested on, logits were bitwise equal in float32,
bf16 and fp16). `tests/test_engine.py` holds it to the modules' slot pass (greedy and sampled
ids, log-probs, rows joining mid-decode, tool trajectories) and to plain full forward passes.

Why not `torch.compile`: on the 2-core CPU it was tried on (torch 2.13), compiling the layer's
pieces with dynamic shapes took about 40 s and the compiled calls were slower than eager ones
at these sizes (guards and wrappers cost more than the fusion saves); a rollout of a few
seconds cannot pay that. TorchScript (faster by about a fifth) is deprecated.

Limits (`fused_supports`; anything else runs through the model's own modules): the
`Qwen2ForCausalLM` and `LlamaForCausalLM` classes themselves, plain `nn.Linear` projections
(no LoRA or quantized layers), SiLU MLP, full rotary attention (no sliding window), no
attention dropout while training, no hooks on the model's modules when the engine is made,
parameters that are plain tensors (not DTensors of a sharded model). The concatenated weights
are a second copy of q/k/v and gate/up (about 60% of a layer's weights): sized for the small
models this engine is for.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tirl.backends.kv_slots import _keys, one_query_attention

__all__ = ["FusedSlotForward", "fused_supports"]

# Causal LM classes whose decoder layer is exactly: RMSNorm -> q/k/v (+bias) -> rotary -> GQA
# attention -> o_proj -> residual -> RMSNorm -> down(silu(gate) * up) -> residual.
FUSED_CLASSES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def fused_supports(model) -> str | None:
    """None if `FusedSlotForward` computes what `model`'s own forward does, else why not."""
    name = type(model).__name__
    if name not in FUSED_CLASSES:
        return f"{name} is not one of {FUSED_CLASSES}"
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1.0):
        return "rotary embedding on part of each head"
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "rotary_emb") or not hasattr(base, "norm"):
        return "not the expected module layout"
    linears = [model.lm_head]
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
        linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if any(type(m) is not nn.Linear for m in linears):
        return "a projection that is not a plain nn.Linear (LoRA, quantized)"
    for module in model.modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return f"forward hooks on {type(module).__name__}"
    if any(type(p) not in (torch.Tensor, nn.Parameter) for p in model.parameters()):
        return "parameters that are not plain tensors (a sharded model)"
    return None


class _Layer:
    """One decoder layer's weights as the fused pass uses them."""

    __slots__ = ("in_norm", "qkv_w", "qkv_b", "o_w", "o_b", "post_norm", "gu_w", "gu_b")
    __slots__ += ("down_w", "down_b", "eps_in", "eps_post", "inner")


class FusedSlotForward:
    """The forward pass of `SlotRows` (`tirl.backends.kv_slots`) for a supported model, run
    from its weights. Concatenated q/k/v and gate/up weights are rebuilt whenever one of
    their parameters was replaced or changed in place (a weight update or `load_state_dict`:
    their version counters move), so the pass always computes with the current weights."""

    def __init__(self, model) -> None:
        why = fused_supports(model)
        if why is not None:
            raise ValueError(f"no fused slot pass for this model: {why}")
        self.model = model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.dropout = getattr(config, "attention_dropout", 0.0) or 0.0
        base = model.model
        self._base = base
        # The linear modules whose weights are concatenated: (q, k, v), (gate, up) per layer.
        self._modules = [
            (
                layer,
                (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                (layer.mlp.gate_proj, layer.mlp.up_proj),
            )
            for layer in base.layers
        ]
        # Every parameter a `_Layer` holds, as (its module's parameter dict, its name): read
        # from the dict at each pass, so a replaced parameter is seen too, not only one
        # changed in place.
        self._watched = [
            (module._parameters, name)
            for layer, qkv, gate_up in self._modules
            for module in (
                *qkv,
                *gate_up,
                layer.self_attn.o_proj,
                layer.mlp.down_proj,
                layer.input_layernorm,
                layer.post_attention_layernorm,
            )
            for name in ("weight", "bias")
            if module._parameters.get(name) is not None
        ]
        self._stamp: list | None = None  # (dict, name, parameter, version) at the last build
        self._layers: list[_Layer] = []

    def usable(self) -> bool:
        """False while the model trains with attention dropout (the fused pass has none)."""
        return not (self.model.training and self.dropout > 0)

    # ------------------------------------------------------------------ weights
    def _current(self) -> list[_Layer]:
        """The layers' weights, rebuilt if any parameter was replaced or changed in place
        since the last build (their version counters move with every in-place write)."""
        if self._stamp is not None:
            for params, name, param, version in self._stamp:
                now = params.get(name)
                if now is not param or now._version != version:
                    break
            else:
                return self._layers
        with torch.no_grad():
            self._layers = [self._build(*parts) for parts in self._modules]
        self._stamp = [
            (params, name, params[name], params[name]._version) for params, name in self._watched
        ]
        return self._layers

    @staticmethod
    def _build(layer, qkv, gate_up) -> _Layer:
        out = _Layer()
        out.in_norm = layer.input_layernorm.weight
        out.eps_in = layer.input_layernorm.variance_epsilon
        out.post_norm = layer.post_attention_layernorm.weight
        out.eps_post = layer.post_attention_layernorm.variance_epsilon
        out.qkv_w = torch.cat([m.weight for m in qkv]).detach()
        out.qkv_b = _cat_bias(qkv)
        out.o_w, out.o_b = layer.self_attn.o_proj.weight, layer.self_attn.o_proj.bias
        out.gu_w = torch.cat([m.weight for m in gate_up]).detach()
        out.inner = gate_up[0].out_features
        out.gu_b = _cat_bias(gate_up)
        out.down_w, out.down_b = layer.mlp.down_proj.weight, layer.mlp.down_proj.bias
        return out

    # ------------------------------------------------------------------ the pass
    def forward(self, cache, ids: torch.Tensor, positions: torch.Tensor, ends: torch.Tensor):
        """Logits [B, V] at the packed tokens `ends` (each row's last).

        cache: a `SlotKVCache` whose `plan` is this pass's; ids, positions: [T] long, the
        packed tokens and their positions in their own rows."""
        layers = self._current()
        base, plan = self._base, cache.plan
        hidden = F.embedding(ids, base.embed_tokens.weight)  # [T, D]
        cos, sin = base.rotary_emb(hidden, positions[None])  # [1, T, Dh]
        half = self.head_dim // 2
        cos = cos[0, :, None]  # [T, 1, Dh]
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2] exactly (a sign flip)
        sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)[:, None]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qk_heads = heads + kv_heads
        n = ids.shape[0]
        if not cache.layers or not cache.layers[0].is_initialized:
            like = hidden.new_empty((1, kv_heads, 1, dim))
            cache.allocate(len(layers), like)
        rows, where = plan.write_rows, plan.write_positions
        for index, w in enumerate(layers):
            slot = cache.layers[index]
            x = _rms_norm(hidden, w.in_norm, w.eps_in)
            qkv = F.linear(x, w.qkv_w, w.qkv_b).view(n, -1, dim)  # [T, H + 2 H_kv, Dh]
            qk = qkv[:, :qk_heads]
            qk = qk * cos + qk.roll(half, -1) * sin
            slot.keys[rows, :, where] = qk[:, heads:]
            slot.values[rows, :, where] = qkv[:, qk_heads:]
            attn = _attention(qk[:, :heads], slot.keys, slot.values, plan, self.scaling)
            hidden = hidden + F.linear(attn.view(n, -1), w.o_w, w.o_b)
            x = _rms_norm(hidden, w.post_norm, w.eps_post)
            gate_up = F.linear(x, w.gu_w, w.gu_b)
            gate, up = gate_up[:, : w.inner], gate_up[:, w.inner :]
            hidden = hidden + F.linear(F.silu(gate) * up, w.down_w, w.down_b)
        norm = base.norm
        last = _rms_norm(hidden[ends], norm.weight, norm.variance_epsilon)
        return F.linear(last, self.model.lm_head.weight, self.model.lm_head.bias)


def _cat_bias(modules) -> torch.Tensor | None:
    biases = [m.bias for m in modules]
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [
            b if b is not None else m.weight.new_zeros(m.out_features)
            for m, b in zip(modules, biases)
        ]
    ).detach()


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm / LlamaRMSNorm, op for op (the casts are no-ops in float32,
    and skipped there: a call costs more than the arithmetic at these sizes)."""
    if x.dtype is torch.float32:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _attention(query, keys, values, plan, scaling: float) -> torch.Tensor:
    """What `slot_attention` computes for packed queries [T, H, Dh]; returns [T, H, Dh]."""
    heads, dim = query.shape[1], query.shape[2]
    parts = []
    for group in plan.groups:
        q = query[group.tokens]  # [Tg, H, Dh]
        k, v = _keys(keys, group), _keys(values, group)  # [G, H_kv, kv_len, Dh]
        if group.width == 1:
            parts.append(one_query_attention(q, k, v, group, scale=scaling))
            continue
        if group.at is None:  # one row's chunk: nothing to pad
            mask = group.bias(q.dtype)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k, v, attn_mask=mask, enable_gqa=True, scale=scaling
            )
            parts.append(out[0].transpose(0, 1))
            continue
        padded = q.new_zeros((group.rows.shape[0], heads, group.width, dim))
        padded[group.at[0], :, group.at[1]] = q
        out = F.scaled_dot_product_attention(
            padded, k, v, attn_mask=group.bias(q.dtype), enable_gqa=True, scale=scaling
        )
        parts.append(out[group.at[0], :, group.at[1]])
    return parts[0] if len(parts) == 1 else torch.cat(parts)
