"""A tiny policy made from scratch: a BPE tokenizer trained with `tokenizers` and a small
decoder-only transformer built from a `transformers` config.

Nothing is downloaded. Both are saved with `save_pretrained` and loaded with
`from_pretrained` (`load_policy`), so the code that loads this tiny model also loads a real
one by hub name or path (e.g. ``Qwen/Qwen2.5-Math-1.5B``) wherever weights are available.

Digits are split one per token (as in Llama and Qwen tokenizers): a model that must copy
numbers into code does far better when every number is spelled the same way.
"""

from __future__ import annotations

import errno
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
from tirl.files import replacing

EOS = "<|endoftext|>"
PAD = "<|pad|>"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a from-scratch model. `arch` is a transformers architecture family."""

    arch: str = "qwen2"
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    max_positions: int = 256


def train_tokenizer(texts: Iterable[str], vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, digits split one per token."""
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
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)


def build_model(
    tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec, seed: int
) -> PreTrainedModel:
    """A randomly initialised model sized by `spec`, with the tokenizer's vocabulary."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    if spec.arch == "qwen2":
        config = Qwen2Config(
            hidden_size=spec.hidden_size,
            intermediate_size=4 * spec.hidden_size,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            num_key_value_heads=spec.heads,
            max_position_embeddings=spec.max_positions,
            **common,
        )
        return Qwen2ForCausalLM(config)
    if spec.arch == "gpt2":
        config = GPT2Config(
            n_embd=spec.hidden_size,
            n_layer=spec.layers,
            n_head=spec.heads,
            n_positions=spec.max_positions,
            **common,
        )
        return GPT2LMHeadModel(config)
    raise ValueError(f"unknown tiny-model arch {spec.arch!r}; expected 'qwen2' or 'gpt2'")


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def is_saved_policy(path: Path) -> bool:
    """True if `path` holds a whole saved model: its config and its weights (a folder written
    by a tirl older than `save_policy`'s atomic save may hold a config without weights)."""
    path = Path(path)
    return (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHT_FILES)


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """`save_pretrained` of the model and tokenizer into `path`, whole or not at all: they are
    written into a temporary sibling folder that replaces `path` once complete
    (`tirl.files.replacing`), so a crash or a full disk mid-save leaves no folder that looks
    saved, and an I/O error comes out as an OSError naming `path`. An existing folder that holds
    no saved model is not replaced (it is not ours to delete)."""
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        raise FileExistsError(
            errno.EEXIST, "not empty and not a saved model, refusing to replace it", str(path)
        )
    with replacing(path) as tmp:
        tmp.mkdir()
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def load_policy(name_or_path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer from a local folder or a hub name. One that cannot be
    loaded (no such folder or hub name, offline, no weights) is a ConfigError in one line."""
    tokenizer = loading(name_or_path, AutoTokenizer.from_pretrained)
    model = loading(name_or_path, AutoModelForCausalLM.from_pretrained)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def loading(name_or_path: str | Path, load):
    """`load(str(name_or_path))`, with transformers' many-line errors cut to one ConfigError line
    (a full disk or a permission error stays an OSError)."""
    try:
        return load(str(name_or_path))
    except OSError as e:
        if e.errno is not None:  # the machine's error, not the model's
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load model {str(name_or_path)!r}: {first}") from None
    except ValueError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load model {str(name_or_path)!r}: {first}") from None


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
