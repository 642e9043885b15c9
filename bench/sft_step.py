"""One SFT step in float32, in bfloat16 and compiled, side by side in one process.

    python bench/sft_step.py [--preset quickstart|real_model] [--threads 1] [--steps 12]
                             [--settings float32,bfloat16,compiled]

The step of `tirl train`'s SFT (`tirl.train.sft.sft_backward`, gradient clipping, AdamW) on the
preset's own demonstrations and batches (the quickstart's 64 rows in 4 length-sorted
micro-batches, or the SmolLM2 recipe's 8 rows with LoRA), for each setting:
- `float32`: the preset as it is;
- `bfloat16`: `model.dtype=bfloat16` (weights and AdamW states in bfloat16), which is fast
  only on a CPU with bfloat16 units (AVX-512 BF16 or AMX; `lscpu` lists `avx512_bf16`) or a
  GPU, and 10-20x slower than float32 on one without (docs/benchmarks/history.md);
- `compiled`: float32 under `torch.compile(model, dynamic=True)` (its first step compiles).

Every setting starts from the same weights and trains on the same batches; the steps are
interleaved (step i of every setting, then step i + 1), so all see the same machine load.
Reported: the first step, the median of the rest (after 2 more warm-up steps), the ratio to
float32 and the loss after the last step (a bfloat16 step must learn what a float32 one does).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

SETTINGS = ("float32", "bfloat16", "compiled")
EXAMPLES = {"quickstart": 640, "real_model": 80}  # enough rows for the steps measured


def pipeline_for(preset: str, threads: int, dtype: str):
    from tirl.cli import preset_path
    from tirl.config import load_config
    from tirl.run.config import RunConfig
    from tirl.train.pipeline import Pipeline, quiet_transformers

    overrides = [f"sft.examples={EXAMPLES[preset]}", "variants=[code]", f"threads={threads}"]
    cfg = load_config(RunConfig, preset_path(preset), [*overrides, f"model.dtype={dtype}"])
    quiet_transformers(cfg)  # torch's threads: `threads`
    run_dir = Path(tempfile.mkdtemp(prefix="tirl-bench-sft-step-"))
    pipeline = Pipeline(cfg, run_dir, evaluation=None)
    pipeline.prepare()
    return cfg, pipeline


def trainer(preset: str, threads: int, setting: str):
    """A function that runs one SFT step on a batch: (seconds, loss)."""
    import torch

    from tirl.models.lora import trainable_parameters
    from tirl.train.sft import sft_backward

    cfg, pipeline = pipeline_for(
        preset, threads, "bfloat16" if setting == "bfloat16" else "float32"
    )
    torch.manual_seed(cfg.seed)
    model = pipeline.make_model()
    model.train()
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)
    forward = torch.compile(model, dynamic=True) if setting == "compiled" else model
    pad = pipeline.tokenizer.pad_token_id

    def step(batch) -> tuple[float, float]:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = sft_backward(
            forward, batch, pad, cfg.sft.mask_tool_output, cfg.sft.micro_batches,
            torch.device("cpu"),
        )  # fmt: skip
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return time.perf_counter() - start, loss

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(EXAMPLES), default="quickstart")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--steps", type=int, default=12, help="steps per setting (>= 4)")
    parser.add_argument(
        "--settings", default=",".join(SETTINGS), help="a list of: " + ", ".join(SETTINGS)
    )
    args = parser.parse_args()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or set(settings) - set(SETTINGS):
        parser.error(f"--settings {args.settings}: a list of {', '.join(SETTINGS)}")
    if args.steps < 4 or args.threads < 1:
        parser.error("--steps must be >= 4 and --threads >= 1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from peers_smollm2 import make_sft_rows  # the preset's rows, drawn as `tirl train` draws

    cfg, _ = pipeline_for(args.preset, args.threads, "float32")
    batches = asyncio.run(make_sft_rows(cfg, args.steps))
    steps = {s: trainer(args.preset, args.threads, s) for s in settings}
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {s: [] for s in settings}
    losses: dict[str, float] = {}
    for batch in batches:
        for setting, step in steps.items():
            seconds, losses[setting] = step(batch)
            times[setting].append(seconds)
    median = {s: statistics.median(t[3:]) for s, t in times.items()}
    base = median.get("float32")
    after = os.getloadavg()[0]
    print(f"\n{args.preset}, {args.steps} steps of {cfg.sft.batch_size} rows,"
          f" {args.threads} torch thread(s); load {load:.2f} before, {after:.2f} after\n")  # fmt: skip
    print("| setting | first step | median step (from the 4th) | float32 / setting | loss after |")
    print("|---|---:|---:|---:|---:|")
    for s in settings:
        ratio = f"{base / median[s]:.2f}x" if base else "-"
        print(f"| {s} | {times[s][0]:.2f} s | {median[s]:.3f} s | {ratio} | {losses[s]:.4f} |")


if __name__ == "__main__":
    main()
