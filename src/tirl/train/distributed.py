"""Training past one process: torch.distributed with FSDP2 (`fully_shard`), under `torchrun`.

    torchrun --nproc_per_node 8 -m tirl.cli train my.yaml

(`tirl train` / `tirl quickstart`: SFT and evaluation run on every rank / rank 0, RL is
sharded; rank 0 writes the run folder, which other ranks read when resuming, so a resumed
multi-machine run needs it on a shared file system.)

Each rank rolls out its share of the step's prompt groups, the trajectories are gathered so
that every rank scores the same batch and computes the same advantages, and each rank then
backpropagates its shard of every minibatch (`tirl.train.update`). Parameters, gradients and
optimizer state are sharded by FSDP. Rollouts are seeded per trajectory, so the gathered
batch does not depend on the number of ranks: N ranks make the update one process makes.

Backends: NCCL on GPUs, gloo on CPU. On CPU, gloo is pinned to the loopback interface when
the rendezvous address is loopback, so a single-machine run never looks up the host name.

Mixed precision (`rl.bf16`): `fsdp_policy` gives FSDP2 a `MixedPrecisionPolicy` that
all-gathers the parameters in bfloat16 and runs forward and backward in it, then reduce-scatters
the gradients in float32; the sharded parameters each rank keeps (the master weights), their
gradients and the optimizer state stay in the model's dtype (float32 as loaded for training).
That halves the all-gather traffic and the memory of the unsharded block, and no rounding
accumulates in the weights or in the sum of gradients over ranks. verl 0.9.1 makes the same
choice: its FSDP engine defaults to `param_dtype=bf16, reduce_dtype=fp32` (buffer fp32) when
`mixed_precision` is unset (`verl/workers/engine/fsdp/transformer_impl.py`,
`_build_fsdp_module`; `trainer/config/_generated_ppo_trainer.yaml`), with `model_dtype: fp32`
for the trained actor (`verl/workers/config/engine.py`, `FSDPEngineConfig`). (With
`model.dtype: bfloat16` the weights themselves are bfloat16: the policy then only reduces the
gradients in float32, and the weights and Adam's moments stay bfloat16.) Under the policy
the update does not add `torch.autocast` on top: see `tirl.train.update.computes_in_bf16`.
The log-probabilities and the loss stay float32: `tirl.train.batch.token_logprobs` upcasts the
(bfloat16) logits before `cross_entropy` / `log_softmax`. The policy works on CPU with gloo too
(bf16 all-gather, fp32 reduce-scatter; tests/test_trainer.py runs it), but `RunConfig.validate`
keeps `rl.bf16` for `device: cuda`, where it saves something.
"""

from __future__ import annotations

import gc
import ipaddress
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from tirl.run.config import RLConfig
from tirl.train.update import Shard, mark_computes_in_bf16

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int

    @property
    def shard(self) -> Shard:
        return Shard(self.rank, self.world)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def init_from_env(device: str = "cpu") -> DistContext | None:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT);
    None when not launched with more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if device.startswith("cuda") and torch.cuda.is_available():
        # each rank its own GPU: without this every rank of a node would allocate on cuda:0
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if _is_loopback(os.environ.get("MASTER_ADDR", "")):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return DistContext(dist.get_rank(), dist.get_world_size())


def leave_process_group() -> None:
    """Destroy the process group while the interpreter is fully alive.

    `destroy_process_group` only drops torch's own references: a group that FSDP's device
    mesh still holds (through a model in a reference cycle) would be destructed during
    interpreter shutdown, where its gloo threads abort the process ("terminate called without
    an active exception", exit -6) about once in fifteen runs. Callers drop their model first;
    collecting here frees the cycles so the group goes now.
    """
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def fsdp_policy(cfg: RLConfig) -> MixedPrecisionPolicy | None:
    """The FSDP2 `MixedPrecisionPolicy` for `cfg` (`rl.bf16`), or None for full precision.

    bfloat16 parameters in forward and backward, float32 gradient reduction; the sharded
    master parameters keep the model's dtype (the policy never touches them). The forward's
    floating-point inputs are cast to bfloat16 too (`cast_forward_inputs`, torch's default and
    verl's setting); tirl's inputs are token ids and masks, which it leaves alone.
    """
    if not cfg.bf16:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_model(
    model: torch.nn.Module, mixed_precision: MixedPrecisionPolicy | None = None
) -> torch.nn.Module:
    """FSDP2: each transformer block is its own unit, then the root (embeddings, head).

    `mixed_precision`: a `torch.distributed.fsdp.MixedPrecisionPolicy` for every unit (see
    `fsdp_policy`); None keeps forward, backward and reduction in the model's dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mixed_precision or MixedPrecisionPolicy()  # the default: no casts
    blocks = getattr(getattr(model, "model", None), "layers", None)  # Qwen2 / Llama layout
    if blocks is None:
        blocks = getattr(getattr(model, "transformer", None), "h", [])  # GPT-2 layout
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    mark_computes_in_bf16(model, policy.param_dtype == torch.bfloat16)
    return model


def broadcast_weights(model: torch.nn.Module, src: int = 0) -> None:
    """Make every rank's full copy of `model` equal to rank `src`'s (replicated SFT on GPUs
    need not end bit-identical)."""
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src)


def gather_in_order(items: list[Any], ctx: DistContext | None, total: int) -> list[Any]:
    """Rank r holds items r, r + world, ...; every rank gets all `total` of them in order."""
    if ctx is None:
        return items
    parts: list[list[Any]] = [[] for _ in range(ctx.world)]
    dist.all_gather_object(parts, items)
    return [parts[i % ctx.world][i // ctx.world] for i in range(total)]


def sum_over_ranks(metrics: dict[str, float], ctx: DistContext | None) -> dict[str, float]:
    if ctx is None or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def grad_norm_value(norm: torch.Tensor) -> float:
    """`clip_grad_norm_` returns a DTensor over FSDP2 parameters: make it one number."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)
