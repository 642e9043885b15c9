"""Supervised fine-tuning on trajectories, interpreter tokens masked from the loss.

The loss is the mean negative log-likelihood over trained tokens of the batch (model tokens;
tool tokens too only when `mask_tool_output` is off, for ablations).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from tirl.algos.losses import agg_loss
from tirl.cpu import pace
from tirl.models.lora import trainable_parameters
from tirl.protocol.segments import Trajectory
from tirl.run.config import SFTConfig
from tirl.train.batch import collate, token_logprobs
from tirl.train.metrics import MetricsLogger, peak_rss_gb


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine decay to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, steps: int, window: int, generator: torch.Generator
) -> Iterator[list[int]]:
    """The rows of each step's batch: every row drawn uniformly with replacement, as for plain
    random batches, but `window` steps' rows at a time, sorted by length and cut into batches
    that are then shuffled. A batch is padded to its longest row, so grouping rows of similar
    length cuts the padded tokens that cost compute and train nothing; which rows are seen, and
    how often, does not change. `window` 1 is plain random batches. What a batch mixes does
    change: where lengths follow the kind of demonstration (code or direct answer), batches
    become all of one kind and the model learns differently (docs/benchmarks/history.md, SFT batching);
    `sft_backward`'s micro-batches save padding without that."""
    for start in range(0, steps, window):
        k = min(window, steps - start)
        rows = torch.randint(len(lengths), (k * batch_size,), generator=generator).tolist()
        if k == 1:
            yield rows
            continue
        rows.sort(key=lambda r: lengths[r])
        batches = [rows[i * batch_size : (i + 1) * batch_size] for i in range(k)]
        yield from (batches[i] for i in torch.randperm(k, generator=generator).tolist())


def sft_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """Mean negative log-likelihood over the batch's trained tokens."""
    logprobs, _ = token_logprobs(model, batch)  # [B, T-1]
    return agg_loss(-logprobs, batch.loss_mask, "token-mean")


def length_sorted_chunks(trajs: Sequence[Trajectory], parts: int) -> list[list[Trajectory]]:
    """`trajs` sorted by length and cut into `parts` near-equal runs (fewer if there are
    fewer rows): each run is padded to its own longest row, not the batch's."""
    ordered = sorted(trajs, key=lambda t: len(t.ids))
    parts = max(1, min(parts, len(ordered)))
    bounds = [round(i * len(ordered) / parts) for i in range(parts + 1)]
    return [ordered[a:b] for a, b in zip(bounds, bounds[1:])]


def sft_backward(
    model: torch.nn.Module,
    trajs: Sequence[Trajectory],
    pad_id: int,
    mask_tool_output: bool,
    micro_batches: int,
    device: torch.device,
) -> tuple[float, float]:
    """Backpropagate the token-mean negative log-likelihood of `trajs` as one batch, in
    `micro_batches` length-sorted micro-batches: each micro-batch's summed loss is divided by
    the whole batch's trained tokens, so the accumulated gradient is the one batch's (up to
    float rounding), only with fewer padded tokens computed. Returns (loss, padded share)."""
    batches = [
        collate(chunk, pad_id, mask_tool_output).to(device)
        for chunk in length_sorted_chunks(trajs, micro_batches)
    ]
    trained = sum(b.loss_mask.sum() for b in batches).clamp(min=1)
    loss_value = 0.0
    for batch in batches:
        logprobs, _ = token_logprobs(model, batch)  # [b, T-1]
        loss = (-logprobs * batch.loss_mask).sum() / trained
        loss.backward()
        loss_value += loss.item()
    cells = sum(b.attention_mask.numel() for b in batches)
    real = sum(b.attention_mask.sum().item() for b in batches)
    return loss_value, 1.0 - real / cells


def train_sft(
    model: torch.nn.Module,
    demos: Sequence[Trajectory],
    cfg: SFTConfig,
    *,
    pad_id: int,
    seed: int,
    logger: MetricsLogger | None = None,
    variant: str = "",
) -> float:
    """Train `model` in place for `cfg.steps` steps; returns the last loss."""
    return train_sft_stages(
        model, [(demos, cfg.steps)], cfg, pad_id=pad_id, seed=seed, logger=logger,
        variant=variant, log_stage=False,
    )  # fmt: skip


def train_sft_stages(
    model: torch.nn.Module,
    stages: Sequence[tuple[Sequence[Trajectory], int]],
    cfg: SFTConfig,
    *,
    pad_id: int,
    seed: int,
    logger: MetricsLogger | None = None,
    variant: str = "",
    log_stage: bool = True,
) -> float:
    """Train `model` in place on each stage's demonstrations for its steps, in order
    (`sft.stages`); returns the last loss. One optimizer and one learning-rate schedule span
    all stages (warm-up once, cosine over the steps of all stages: a later stage does not warm
    up again), and the logged `step` counts on across stages; with `log_stage` each record
    carries its stage's index as `sft/stage`."""
    if any(not demos for demos, _ in stages):
        raise ValueError("SFT needs at least one demonstration")
    total = sum(steps for _, steps in stages)
    device = next(model.parameters()).device
    params = trainable_parameters(model)  # the adapters only, under LoRA
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total, cfg.warmup_steps)
    )
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss_value = float("nan")
    bar = tqdm(range(total), desc=f"{variant} SFT", leave=False)
    step = 0
    for index, (demos, steps) in enumerate(stages):
        lengths = [len(d.ids) for d in demos]
        batches = length_grouped_batches(
            lengths, cfg.batch_size, steps, cfg.length_window, generator
        )
        for rows in batches:
            pace()  # torch's threads follow the free cores (tirl.cpu)
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss_value, pad_share = sft_backward(
                model, [demos[r] for r in rows], pad_id, cfg.mask_tool_output, cfg.micro_batches,
                device,
            )  # fmt: skip
            grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
            if logger is not None:
                record = {
                    "variant": variant,
                    "phase": "sft",
                    "step": step,
                    "train/loss": loss_value,
                    "actor/grad_norm": float(grad_norm),
                    "train/lr": schedule.get_last_lr()[0],
                    "train/pad_share": pad_share,
                    "time/step_s": time.perf_counter() - start,
                    "mem/peak_rss_gb": peak_rss_gb(),
                }
                if log_stage:
                    record["sft/stage"] = index
                logger.log(record)
            step += 1
    bar.close()
    model.eval()
    return loss_value
