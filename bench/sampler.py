"""Throughput of tirl's batched KV-cache sampler against simpler ways to sample, same run.

    python bench/sampler.py [--sequences 64] [--tokens 40] [--repeats 3] [--fast-path both|on|off]

All three sample the same number of tokens from the same tiny model (made from scratch):
- `tirl HFEngine`: every sequence in flight at once, one batched forward per token, KV cache
  (by default its slot cache's pass fused from the weights; `--fast-path both`, the default,
  adds a row for the same engine through the model's modules, `tirl.backends.fused`);
- `HF generate, one at a time`: `model.generate` per sequence (KV cache, batch 1);
- `no cache, one at a time`: a full forward pass per token (what a naive loop does).
Prints tokens/s (median of the repeats) and the speed-up over each baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from functools import partial

import torch
from transformers.utils import logging as hf_logging

from tirl.backends.hf import HFEngine
from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.synth.arithmetic import demonstration_texts, prompt_for


def setup():
    env = ArithmeticEnv()
    tasks = env.items("train", 400)
    tokenizer = train_tokenizer(
        ["".join(t for _, t in demonstration_texts(x, x.answer)) for x in tasks]
    )
    model = build_model(tokenizer, TinyModelSpec(), seed=0).eval()
    prompts = [tokenizer(prompt_for(t))["input_ids"] for t in tasks]
    return model, prompts


def engine_run(model, prompts, tokens: int, fused: bool | None = None) -> int:
    async def main():
        engine = HFEngine(model, eos_id=-1, max_batch=len(prompts), seed=0, fused=fused)
        outs = await asyncio.gather(
            *(engine.generate(i, p, max_new_tokens=tokens) for i, p in enumerate(prompts))
        )
        engine.close()
        return sum(len(o.ids) for o in outs)

    return asyncio.run(main())


@torch.no_grad()
def generate_run(model, prompts, tokens: int) -> int:
    n = 0
    for p in prompts:
        out = model.generate(
            torch.tensor([p]),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=True,
            pad_token_id=0,
        )
        n += out.shape[1] - len(p)
    return n


@torch.no_grad()
def no_cache_run(model, prompts, tokens: int) -> int:
    n = 0
    for p in prompts:
        ids = list(p)
        for _ in range(tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1)))
            n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--fast-path",
        choices=("both", "on", "off"),
        default="both",
        help="HFEngine's slot-cache pass fused from the weights (on, its default), through the"
        " model's modules (off), or both (the second as its own row)",
    )
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    model, prompts = setup()
    prompts = prompts[: args.sequences]
    engines = {
        "on": {"tirl HFEngine (batched, KV cache)": engine_run},
        "off": {"tirl HFEngine (batched, KV cache)": partial(engine_run, fused=False)},
    }
    if args.fast_path == "both":
        engines["on"]["tirl HFEngine, modules (not fused)"] = partial(engine_run, fused=False)
    runs = {
        **engines["off" if args.fast_path == "off" else "on"],
        "HF generate, one at a time": generate_run,
        "no cache, one at a time": no_cache_run,
    }
    rates = {}
    for name, fn in runs.items():
        samples = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            n = fn(model, prompts, args.tokens)
            samples.append(n / (time.perf_counter() - start))
        rates[name] = statistics.median(samples)
    ours = rates["tirl HFEngine (batched, KV cache)"]
    print(
        f"{args.sequences} sequences x {args.tokens} tokens, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"{'sampler':<36} {'tokens/s':>10} {'tirl speed-up':>14}")
    for name, rate in rates.items():
        print(f"{name:<36} {rate:>10.0f} {ours / rate:>13.1f}x")


if __name__ == "__main__":
    main()
