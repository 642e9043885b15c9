"""Runs inside vLLM's worker processes: receives the trainer's weights (`VLLMEngine.load_weights`).

vLLM mixes this class into its worker (`worker_extension_cls`), so its method can be called
with `collective_rpc("tirl_load_weights", args=(payload,))`. The payload is the state dict in
safetensors format (bytes): tensors passed to `collective_rpc` directly arrive as lists and the
failure takes the engine down, so they travel serialized, as verl's and TRL's CPU paths do.

The weights go through vLLM's own in-place reload (`Worker.reload_weights`), which loads the
checkpoint-format names (q/k/v stacked into vLLM's fused layers) and redoes what the backend
does after loading (the CPU backend repacks linear weights; calling the model's `load_weights`
directly skips that and leaves it serving the old packed copies). The caller resets the prefix
cache afterwards: cached prefixes were computed under the old weights.

This module imports nothing of tirl, so a worker does not import tirl's other modules.
"""

from __future__ import annotations

import logging

# The layer-wise reload warns, at every push, that modules without weights (the rotary
# embedding) "failed to load weights"; the count check in `VLLMEngine.load_weights` is what
# says whether every tensor arrived.
_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class WeightLoader:
    """The worker extension: `tirl_load_weights(payload) -> number of tensors loaded`."""

    def tirl_load_weights(self, payload: bytes) -> int:
        from safetensors.torch import load

        logging.getLogger(_RELOAD_LOGGER).setLevel(logging.ERROR)
        tensors = load(payload)
        self.reload_weights(weights_iterator=iter(tensors.items()))  # type: ignore[attr-defined]
        return len(tensors)
