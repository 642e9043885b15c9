"""Length-dependent reward shaping, counted in MODEL tokens.

A tool-integrated response interleaves tokens the model sampled (mask 1) with interpreter output
(mask 0). Only the former are the model's length: counting tool tokens would punish a model for
what the interpreter printed. verl's DAPO reward manager takes L from the response attention
mask, which includes tool tokens, and OpenRLHF measured `response_length` as a span that did the
same until #1243 / PR #1252 (research/rl-frameworks.md sections 1.3, 8, 12). Here every length
is `model_token_counts(loss_mask)`.

Not covered here: a hard truncation penalty, a budget on tool calls or tool-output tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def model_token_counts(mask: Tensor) -> Tensor:
    """Number of model-sampled tokens per sequence: `mask [B, T] -> int64 [B]`.

    Tool output, prompt and padding (mask 0) are not counted.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T]; got {tuple(mask.shape)}")
    return mask.bool().sum(dim=-1)


def overlong_penalty(
    model_lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, "DAPO", section 3.4; verl
    `DAPORewardManager` `overlong_buffer`), added to the outcome reward: `[B] -> float [B]`.

    With L the model-token length and L_exp = max_len - buffer:

        0                                   if L <= L_exp
        (L_exp - L) / buffer * penalty      if L_exp < L <= max_len   (linear, 0 down to -penalty)
        -penalty                            if L > max_len

    Args:
        model_lengths: `[B]` model tokens per sequence (`model_token_counts(loss_mask)`), NOT
            the response span including tool output.
        max_len: model-token budget of a response.
        buffer: width of the linear zone, 0 < buffer <= max_len (DAPO: 4096 of 20480).
        penalty: reward lost at and beyond max_len (DAPO's `penalty_factor`, 1.0).
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"need 0 < buffer <= max_len; got buffer={buffer}, max_len={max_len}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0 (it is subtracted); got {penalty}")
    length = model_lengths.to(torch.get_default_dtype())
    expected = max_len - buffer
    linear = (expected - length) / buffer * penalty
    # clamp(max=0) is the "0 below L_exp" regime, clamp(min=-penalty) the "beyond max_len" one.
    return linear.clamp(min=-penalty, max=0.0)
