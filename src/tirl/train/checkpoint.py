"""The RL trainer's checkpoint: one file, `trainer.pt`, from which a resumed run continues
exactly where the saved one would have.

It holds the trained weights, the optimizer's and the learning-rate schedule's state, torch's
and Python's global RNG state (the update draws its minibatch order from torch's), and the
sections the trainer adds: its counters, the rollout feed's state (`RolloutFeed.state_dict`)
and the config. The weights and the optimizer go through torch.distributed.checkpoint's full
state dicts, so one file serves one process and FSDP ranks alike (gathering them is a
collective every rank calls; rank 0 alone writes). Under LoRA only the adapters are saved: the
frozen base is the SFT start's, saved already. The file is replaced whole or not at all
(`tirl.files.open_replacing`), so a crash while saving keeps the previous one.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tirl.files import open_replacing, read_whole
from tirl.models.lora import is_lora
from tirl.train.optim import PolicyOptimizer

FILE = "trainer.pt"


def save(
    directory: Path,
    model: torch.nn.Module,
    optim: PolicyOptimizer,
    sections: dict,
    *,
    write: bool = True,
) -> Path:
    """Write `model`, `optim` and the RNG state with `sections` into `directory`/trainer.pt
    (every rank calls it; only the one with `write` writes); the file's path."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    model_sd, optim_sd = get_state_dict(model, optim.optimizer, options=options)
    if is_lora(model):  # a head tied to the frozen embedding is listed all the same
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trained}
    path = Path(directory) / FILE
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "model": model_sd,
            "optimizer": optim_sd,
            "schedule": optim.schedule.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            **sections,
        }
        with open_replacing(path) as f:  # ENOSPC as OSError, the previous file kept
            torch.save(payload, f)
    return path


def restore(directory: Path, model: torch.nn.Module, optim: PolicyOptimizer) -> dict:
    """Load `directory`/trainer.pt into `model`, `optim` and the global RNGs; the whole
    payload, for the sections `save` was given. FileNotFoundError without one."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    path = Path(directory) / FILE
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    payload = read_whole(  # a damaged checkpoint: one line that says so
        path,
        lambda f: torch.load(f, map_location="cpu", weights_only=False),
        f"delete {path.parent} to start RL over from the SFT model",
    )
    # set_state_dict builds the optimizer's state by a zero step, which it skips when
    # gradients are present (e.g. left by an earlier run of the same model object).
    model.zero_grad(set_to_none=True)
    frozen = is_lora(model)  # the checkpoint holds the adapters, not the frozen base
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False, strict=not frozen)
    set_state_dict(
        model,
        optim.optimizer,
        model_state_dict=payload["model"],
        optim_state_dict=payload["optimizer"],
        options=options,
    )
    optim.schedule.load_state_dict(payload["schedule"])
    torch.set_rng_state(payload["torch_rng"])
    random.setstate(payload["python_rng"])
    return payload
