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
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tirl.train.update import Shard


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


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each transformer block is its own unit, then the root (embeddings, head)."""
    from torch.distributed.fsdp import fully_shard

    blocks = getattr(getattr(model, "model", None), "layers", None)  # Qwen2 / Llama layout
    if blocks is None:
        blocks = getattr(getattr(model, "transformer", None), "h", [])  # GPT-2 layout
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
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
