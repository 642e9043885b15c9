"""SFT step time: plain random batches, the same batches cut into length-sorted micro-batches
(`sft.micro_batches`, the quickstart's setting), and length-grouped batches
(`sft.length_window`).

    python bench/sft_batches.py [--steps 30] [--repeats 3] [--json /tmp/bench_sft.json]

Input: the quickstart's code-variant demonstrations (half solve a 3-digit problem in code, half
answer directly, so lengths vary as in `tirl quickstart`), 2,000 of them, and the quickstart's
model shape (Qwen2, hidden 128, 4 layers, 4 heads), batch 64. Each repeat trains a fresh model
for --steps steps in each configuration, interleaved so that load on the machine hits all
alike. Rows: median seconds per step, the share of padded tokens computed, and the speed-up
over plain batches in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.run.config import SFTConfig
from tirl.synth.arithmetic import (
    code_demonstrations,
    demonstration_texts,
    text_demonstrations,
    text_only_texts,
)
from tirl.train.sft import length_grouped_batches, train_sft

os.environ.setdefault("TQDM_DISABLE", "1")
BATCH = 64
# (label, micro_batches, length_window); the first is the baseline
CONFIGS = (("plain batches", 1, 1), ("4 micro-batches", 4, 1), ("length window 8", 1, 8))


def demonstrations(n: int):
    env = ArithmeticEnv(("product", "mod", "chain"), 3, 0)
    tasks = env.items("train", n)
    texts = ["".join(t for _, t in demonstration_texts(t, t.answer)) for t in tasks[:500]]
    texts += ["".join(t for _, t in text_only_texts(t)) for t in tasks[:500]]
    tokenizer = train_tokenizer(texts, vocab_size=384)
    half = n // 2
    code = code_demonstrations(tasks[:half], [t.answer for t in tasks[:half]], tokenizer)
    return tokenizer, code + text_demonstrations(tasks[half:], tokenizer)


def pad_share(lengths: list[int], micro: int, window: int, steps: int) -> float:
    gen = torch.Generator().manual_seed(0)
    padded = real = 0
    for rows in length_grouped_batches(lengths, BATCH, steps, window, gen):
        ordered = sorted(lengths[r] for r in rows)
        for i in range(micro):
            part = ordered[i * len(ordered) // micro : (i + 1) * len(ordered) // micro]
            padded += len(part) * max(part)
            real += sum(part)
    return 1 - real / padded


def seconds_per_step(tokenizer, demos, micro: int, window: int, steps: int) -> float:
    spec = TinyModelSpec(hidden_size=128, layers=4, heads=4, max_positions=192)
    model = build_model(tokenizer, spec, seed=0)
    cfg = SFTConfig(
        steps=steps, batch_size=BATCH, micro_batches=micro, length_window=window, warmup_steps=2
    )
    start = time.perf_counter()
    train_sft(model, demos, cfg, pad_id=tokenizer.pad_token_id, seed=0)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    tokenizer, demos = demonstrations(2000)
    lengths = [len(d.ids) for d in demos]
    times: dict[str, list[float]] = {label: [] for label, _, _ in CONFIGS}
    for _ in range(args.repeats):
        for label, micro, window in CONFIGS:
            times[label].append(seconds_per_step(tokenizer, demos, micro, window, args.steps))
    median = {label: statistics.median(t) for label, t in times.items()}
    base = median[CONFIGS[0][0]]
    rows = [
        {
            "config": label,
            "s_per_step": round(median[label], 4),
            "pad_share": round(pad_share(lengths, micro, window, 400), 3),
            "speedup": round(base / median[label], 2),
        }
        for label, micro, window in CONFIGS
    ]
    print(f"{'config':>16} {'s/step (median)':>16} {'padded share':>13} {'speed-up':>9}")
    for r in rows:
        print(
            f"{r['config']:>16} {r['s_per_step']:>16.4f} {r['pad_share']:>13.3f}"
            f" {r['speedup']:>8.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "times": times, "steps": args.steps}, f, indent=2)


if __name__ == "__main__":
    main()
