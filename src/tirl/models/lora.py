"""LoRA adapters (peft) on a policy: the small-budget way to fine-tune a pretrained model
(Hu et al. 2021; how ART, TRL and verl users train on one GPU or, here, on a CPU).

`add_lora(model, rank, alpha, dropout, targets)` freezes every weight of `model` and adds a
trainable low-rank update to each targeted linear layer: W x + (alpha / rank) B A x, B = 0 at
the start, so the adapted model starts exactly where the base model is. SFT and RL train the
adapters only (their optimizers take the parameters that require a gradient).

What leaves the trainer is always a plain model: `merged_state_dict` gives the base model's
own state dict with every adapter merged in (W + (alpha / rank) B A, computed fresh from the
frozen W each time, so nothing drifts over thousands of pushes), under the names the base
model's class uses. It is what an engine sampling beside the trainer receives after each
update (`tirl.backends.hf`, `tirl.backends.vllm`), what `plain_copy` builds that engine's
model from, and what `tirl.models.saved.save_policy` writes, so evaluation, `tirl serve`,
vLLM and verl read an ordinary transformers folder; the adapter itself is saved beside it
(`adapter/`, peft's format) for resuming and for users who want it.

peft is optional (`pip install 'tirl[lora]'`); it is imported only where a model has or gets
adapters.
"""

from __future__ import annotations

import copy
import warnings

import torch

ADAPTER = "default"  # peft's name for the one adapter tirl adds
BASE_PREFIX = "base_layer."  # peft keeps a wrapped linear's own weight under this name


def add_lora(
    model: torch.nn.Module, rank: int, alpha: float, dropout: float, targets: list[str]
) -> torch.nn.Module:
    """`model` with LoRA adapters of `rank` on the modules `targets` names (peft's
    `target_modules`; ["all-linear"]: every linear layer but the output head), every other
    weight frozen. A target the model lacks is a ValueError naming it."""
    from peft import LoraConfig, get_peft_model

    modules: str | list[str] = "all-linear" if targets == ["all-linear"] else list(targets)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=modules, bias="none"
    )
    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing`: a FutureWarning on
        # every run that the user can do nothing about
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
        )
        return get_peft_model(model, config)


def is_lora(model: object) -> bool:
    """Whether `model` carries peft adapters (without importing peft when it cannot)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer updates: all of them, or only the adapters under LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict, adapters merged: each adapted linear's weight is
    W + (alpha / rank) B A (peft's `get_delta_weight`, which also handles fan-in/fan-out
    layouts), under the base class's own names. W itself is not changed."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {
        f"{name}.{BASE_PREFIX}weight": module.get_delta_weight(ADAPTER)
        for name, module in base.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }
    merged = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        if key in deltas:
            tensor = tensor + deltas[key].to(tensor.dtype)
        merged[key.replace(f".{BASE_PREFIX}", ".")] = tensor
    return merged


def plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A model of the base class without adapters, holding `model`'s merged weights: what an
    engine samples from beside a LoRA trainer (it then takes `merged_state_dict` after every
    update). `model` itself is not changed."""
    return copy.deepcopy(model).merge_and_unload().eval()


def load_adapter_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put saved adapter weights (peft's `adapter_model.safetensors`) back into `model`; a mismatch (another
    rank or targets) is a ValueError naming the first missing weight."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing:
        raise ValueError(
            f"the saved adapter lacks {missing[0]} (saved with another rank or targets?)"
        )
