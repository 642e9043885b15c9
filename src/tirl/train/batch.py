"""Trajectories to tensors, and the policy's log-probabilities on them.

The ids trained on are the ids in the trajectory's segments, concatenated; nothing is decoded
and re-encoded (architecture.md invariant 1). Targets are shifted by one: position t of every
[B, T-1] tensor here scores token t+1.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tirl.protocol.segments import SegmentKind, Trajectory


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    loss_mask: torch.Tensor  # [B, T-1] float, 1 where the target token is trained on
    sampler_logprobs: torch.Tensor  # [B, T-1] logprobs the sampler reported (0 where unknown)
    sampled: torch.Tensor  # [B, T-1] float, 1 where the target token was sampled (model tokens)

    def to(self, device: str | torch.device) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in vars(self).values()))

    def select(self, rows: torch.Tensor | slice) -> TokenBatch:
        return TokenBatch(*(t[rows] for t in vars(self).values()))

    def lengths(self) -> torch.Tensor:
        """[B] real tokens of each row."""
        return self.attention_mask.sum(-1)

    def trimmed(self) -> TokenBatch:
        """The same rows cut to their longest one: right padding past it changes no real
        position's logits under causal attention, so every log-probability is the same."""
        width = max(1, int(self.lengths().max()))
        full = (self.input_ids, self.attention_mask)
        shifted = (self.loss_mask, self.sampler_logprobs, self.sampled)  # [B, T-1]
        return TokenBatch(*(t[:, :width] for t in full), *(t[:, : width - 1] for t in shifted))


def collate(
    trajectories: Sequence[Trajectory], pad_id: int, mask_tool_output: bool = True
) -> TokenBatch:
    """Right-pad trajectories into one batch.

    Model tokens always have loss mask 1 and prompt tokens 0. Tool tokens have 0 when
    `mask_tool_output` (CIR §2.3.2) and 1 otherwise — the unmasked setting exists only for
    ablations.
    """
    trained_kinds = {SegmentKind.MODEL} | (set() if mask_tool_output else {SegmentKind.TOOL})
    width = max(len(t.ids) for t in trajectories)
    n = len(trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float)
    sampler_lp = torch.zeros((n, width), dtype=torch.float)
    sampled = torch.zeros((n, width), dtype=torch.float)
    for row, traj in enumerate(trajectories):
        col = 0
        for seg in traj.segments:
            k = len(seg.ids)
            input_ids[row, col : col + k] = torch.tensor(seg.ids, dtype=torch.long)
            attention[row, col : col + k] = 1
            if seg.kind in trained_kinds:
                mask[row, col : col + k] = 1.0
            if seg.kind is SegmentKind.MODEL:
                sampled[row, col : col + k] = 1.0
            if seg.logprobs is not None:
                sampler_lp[row, col : col + k] = torch.tensor(seg.logprobs)
            col += k
    return TokenBatch(input_ids, attention, mask[:, 1:], sampler_lp[:, 1:], sampled[:, 1:])


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of every target token under `model`: [B, T-1]; optionally the
    entropy of the predictive distribution at each position: [B, T-1].

    Only positions some row trains on or sampled are scored; the leading positions no row needs
    (the prompts, a long shared system prompt above all) are 0 and cost no logits: the model is
    asked for the logits of the last positions only (transformers' `logits_to_keep`), which
    skips the output head, the [B, T, V] logits and their gradient there. A real vocabulary
    makes that the largest tensor of a step (SmolLM2: 49,152 logits per position). Models
    whose forward lacks the argument compute every position, as before."""
    width = batch.input_ids.shape[1]
    needed = (batch.loss_mask + batch.sampled).amax(0).nonzero()  # target positions any row needs
    first = int(needed[0]) if len(needed) and _keeps_logits(model) else 0
    kwargs = {"logits_to_keep": width - first} if first else {}
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kwargs).logits
    logits = logits[:, :-1].float()  # [B, T-1-first, V]: target positions first..T-2
    targets = batch.input_ids[:, first + 1 :]  # [B, T-1-first]
    scored = -F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    logprobs = F.pad(scored, (first, 0))  # [B, T-1]
    entropy = None
    if with_entropy:
        log_p = torch.log_softmax(logits, dim=-1)
        entropy = F.pad(-(log_p.exp() * log_p).sum(-1), (first, 0))
    return logprobs, entropy


@functools.cache
def _forward_keeps_logits(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward takes `logits_to_keep` (a LoRA model passes it on to its base;
    a model sharded by FSDP keeps its class's forward)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _forward_keeps_logits(type(base))
