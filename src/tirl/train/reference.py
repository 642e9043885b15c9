"""The reference policy of the KL term: the policy as RL found it, frozen.

Only with `rl.kl_coef` > 0 (CIR §2.3.2 and DAPO drop the term, and with it the copy's memory).
The copy is taken when the trainer is built, before a checkpoint is restored into the policy,
so a resumed run compares against the same start (the SFT model), and it is never saved: the
run rebuilds it from that start. Its log-probabilities are scored like pi_old's, in the same
passes and under the same autocast, so the KL of an unchanged policy is 0, not rounding noise.
"""

from __future__ import annotations

import copy

import torch

from tirl.run.config import RLConfig
from tirl.train.batch import TokenBatch
from tirl.train.update import batch_logprobs, update_autocast


def reference_policy(model: torch.nn.Module, cfg: RLConfig) -> torch.nn.Module | None:
    """A frozen copy of `model` now (eval mode, never stepped), or None without a KL term."""
    return copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None


def reference_logprobs(
    reference: torch.nn.Module | None, batch: TokenBatch, cfg: RLConfig, device: torch.device
) -> torch.Tensor | None:
    """[B, T-1] log-probabilities of `batch`'s target tokens under `reference` (None: None),
    in the update's micro-batches."""
    if reference is None:
        return None
    with update_autocast(cfg, reference, device):
        return batch_logprobs(reference, batch, cfg.micro_batch_size, cfg.micro_batch_tokens)
