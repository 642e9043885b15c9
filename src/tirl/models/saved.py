"""Saved policies: a transformers folder (`save_pretrained` of the model and its tokenizer),
written whole or not at all, and read back into a live model on resume.

A model trained with LoRA (`tirl.models.lora`) is saved as the plain model with its adapters
merged, so every reader (evaluation, `tirl serve`, vLLM, verl) loads an ordinary folder, and
its adapters beside it in `adapter/` (peft's `adapter_config.json` and
`adapter_model.safetensors`): a resumed run puts those back into its live adapted model
(`load_saved_weights`).
"""

from __future__ import annotations

import errno
from pathlib import Path

import torch

from tirl.files import replacing
from tirl.models.lora import is_lora, load_adapter_state_dict, merged_state_dict

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
ADAPTER_DIR = "adapter"


def is_saved_policy(path: Path) -> bool:
    """True if `path` holds a whole saved model: its config and its weights (a folder written
    by a tirl older than `save_policy`'s atomic save may hold a config without weights)."""
    path = Path(path)
    return (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHT_FILES)


def save_policy(model, tokenizer, path: Path, extra: dict[str, str] | None = None) -> None:
    """`save_pretrained` of the model and tokenizer into `path`, whole or not at all: they are
    written into a temporary sibling folder that replaces `path` once complete
    (`tirl.files.replacing`), so a crash or a full disk mid-save leaves no folder that looks
    saved, and an I/O error comes out as an OSError naming `path`. An existing folder that holds
    no saved model is not replaced (it is not ours to delete). A LoRA model is saved merged,
    its adapters in `adapter/` (module docstring). `extra` maps file names to texts written
    beside them."""
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        raise FileExistsError(
            errno.EEXIST, "not empty and not a saved model, refusing to replace it", str(path)
        )
    with replacing(path) as tmp:
        tmp.mkdir()
        if is_lora(model):
            base = model.get_base_model()
            base.save_pretrained(tmp, state_dict=merged_state_dict(model))
            model.save_pretrained(tmp / ADAPTER_DIR)  # peft: the adapters and their config
        else:
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")


def load_saved_weights(model: torch.nn.Module, path: Path) -> None:
    """Put the weights saved in `path` (by `save_policy`) into the live `model`: the adapters
    for a LoRA model, else the whole state dict."""
    path = Path(path)
    if is_lora(model):
        from safetensors.torch import load_file

        weights = path / ADAPTER_DIR / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(
                errno.ENOENT, "a LoRA run's checkpoint without its adapter/", str(weights)
            )
        load_adapter_state_dict(model, load_file(str(weights)))
        return
    from transformers import AutoModelForCausalLM

    model.load_state_dict(AutoModelForCausalLM.from_pretrained(str(path)).state_dict())
