"""Where a real model's memory goes in `tirl train`, part by part (issue 42).

    python bench/real_model_memory.py [--model smollm2-135m-instruct] [--lora 16] [--rows 32]
                                      [--checkpointing] [--sft-passes 2] [--micro-batch-tokens 512]
                                      [--out FILE]

One process does what one variant of `tirl quickstart --model ...` does, in order, and after
each part prints the process's resident memory (RSS) and its peak so far: the model loaded;
LoRA's adapters (or, with `--lora 0`, full fine-tuning); the plain copy the engine samples
under LoRA; an SFT step of 8 demonstrations with AdamW (in `--sft-passes` passes); the HF
engine sampling `--rows` chat prompts of the arithmetic source for 64 tokens (its slot KV
cache); an RL update of those rows (two minibatches, passes of at most `--micro-batch-tokens`
tokens). The defaults are the `real_model` preset's. RSS is what the kernel
counts, allocator caches included: the figure a user sees in `top`, not a tensor census.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tirl.backends.hf import HFEngine  # noqa: E402
from tirl.models.lora import add_lora, plain_copy, trainable_parameters  # noqa: E402
from tirl.models.tiny import load_policy, set_gradient_checkpointing  # noqa: E402
from tirl.protocol import get_protocol  # noqa: E402
from tirl.protocol.score import Score  # noqa: E402
from tirl.rollout.runner import Rollout, RolloutSettings  # noqa: E402
from tirl.run.config import RLConfig  # noqa: E402
from tirl.tasks.base import Code, Think  # noqa: E402
from tirl.tasks.demos import demo_trajectory  # noqa: E402
from tirl.tasks.prompts import PromptRenderer  # noqa: E402
from tirl.tasks.sources.arithmetic import ArithmeticSource  # noqa: E402
from tirl.train.feed import RolloutFeed  # noqa: E402
from tirl.train.rl import RLTrainer  # noqa: E402
from tirl.train.sft import sft_backward  # noqa: E402

SYSTEM = (
    "Solve the problem. You can run Python: write a ```python block; its output comes back in"
    " an ```output block. Give the final answer as \\boxed{}."
)


def rss_gb() -> tuple[float, float]:
    """(resident now, peak so far), GB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    now = pages * resource.getpagesize() / 1e9
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--lora", type=int, default=16, help="adapter rank; 0: full fine-tuning")
    p.add_argument("--rows", type=int, default=32, help="rollouts sampled and trained on")
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    p.add_argument("--sft-passes", type=int, default=2, help="SFT micro-batches (preset: 2)")
    p.add_argument(
        "--micro-batch-tokens", type=int, default=512, help="RL's pass size (preset: 512)"
    )
    p.add_argument("--out", help="also write the rows as JSON")
    args = p.parse_args()
    torch.manual_seed(0)
    rows: list[dict] = []
    start = time.perf_counter()

    def mark(part: str) -> None:
        gc.collect()
        now, peak = rss_gb()
        rows.append({"part": part, "rss_gb": now, "peak_gb": peak,
                     "s": time.perf_counter() - start})  # fmt: skip
        print(f"| {part} | {now:.2f} | {peak:.2f} |", flush=True)

    print("| after | RSS GB | peak GB |\n|---|---:|---:|")
    mark("python, torch and transformers imported")
    model, tokenizer = load_policy(args.model)
    mark("model loaded (float32)")
    if args.lora:
        model = add_lora(model, args.lora, 2.0 * args.lora, 0.0, ["all-linear"])
    set_gradient_checkpointing(model, args.checkpointing)
    mark(f"LoRA rank {args.lora} added" if args.lora else "full fine-tuning")
    sampler = plain_copy(model) if args.lora else model
    mark("the engine's plain copy (LoRA)" if args.lora else "the engine samples the live model")

    protocol = get_protocol("cir_fences")
    renderer = PromptRenderer(tokenizer, protocol, system=SYSTEM, chat=True)
    source = ArithmeticSource()
    tasks = [source.item("train", i) for i in range(max(8, args.rows))]
    demos = []
    for task in tasks[:8]:
        parts = [Code(f"print({task.meta['expression']})"),
                 Think(f"The answer is \\boxed{{{task.answer}}}.")]  # fmt: skip
        demos.append(demo_trajectory(renderer, task.problem, parts, [task.answer], {}))
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-4)
    model.train()
    sft_backward(model, demos, tokenizer.pad_token_id, True, args.sft_passes, torch.device("cpu"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    mark("an SFT step of 8 demonstrations, AdamW's state made")

    async def sample():
        from tirl.sandbox import Sandbox

        async with Sandbox() as sandbox:
            engine = HFEngine(sampler, renderer.eos_id, max_batch=128)
            rollout = Rollout(engine, tokenizer, sandbox)
            settings = RolloutSettings(max_model_tokens=64, tool_budget=2, temperature=1.0,
                                       protocol=protocol, max_output_chars=128)  # fmt: skip
            prompts = [renderer.prompt_ids(t.problem) for t in tasks[: args.rows]]
            metas = [{"task": i // 8, "seed": i} for i in range(len(prompts))]
            trajs = await rollout.run_many(prompts, settings, metas)
            mark(f"{len(prompts)} rollouts sampled (the engine's KV cache)")
            engine.close()
            return trajs

    trajs = asyncio.run(sample())
    for i, traj in enumerate(trajs):  # mixed rewards (only memory is measured here)
        traj.score = Score(float(i % 2), bool(i % 2))
    cfg = RLConfig(
        micro_batch_tokens=args.micro_batch_tokens, updates_per_step=2, old_logprobs="trainer"
    )
    trainer = RLTrainer(
        model, RolloutFeed(None, None, cfg), settings=None, pad_id=tokenizer.pad_token_id
    )
    trainer.update(trajs, max_tokens=64)
    mark(f"an RL update of {len(trajs)} rows")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
