"""The RL policy's optimizer and learning-rate schedule.

AdamW without weight decay over the trainable parameters only (the adapters under LoRA,
`tirl.models.lora.trainable_parameters`), and a linear warmup over `rl.warmup_steps` steps'
worth of optimizer steps (`updates_per_step` each), flat after it. One optimizer step clips the
gradient's norm to `rl.max_grad_norm` first; the norm before clipping is what the step logs
(`actor/grad_norm`). The optimizer's and the schedule's state go into the trainer's checkpoint
(`tirl.train.checkpoint`).
"""

from __future__ import annotations

import torch

from tirl.models.lora import trainable_parameters
from tirl.run.config import RLConfig
from tirl.train.distributed import grad_norm_value


class PolicyOptimizer:
    """AdamW and its warmup schedule over `model`'s trainable parameters."""

    def __init__(self, model: torch.nn.Module, cfg: RLConfig) -> None:
        self.params = trainable_parameters(model)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)
        warmup = max(1, cfg.warmup_steps * cfg.updates_per_step)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda u: min(1.0, (u + 1) / warmup)
        )
        self.max_grad_norm = cfg.max_grad_norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> float:
        """Clip the gradients, step the optimizer and the schedule; the norm before clipping
        (under FSDP the norm of the whole gradient, every rank's shards together)."""
        norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        self.optimizer.step()
        self.schedule.step()
        return norm

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.schedule.get_last_lr()[0]
