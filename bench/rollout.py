"""Rollout benchmarks (issue 6): (a) a simulated cluster, (b) the real HF engine on CPU.

    python bench/rollout.py [--part a|b|all] [--quick] [--seeds 5] [--steps 10] [--warmup 4]
                            [--replicas 8] [--reps 5]

Part (a): step time of four rollout schedules on a simulated cluster.

Runs `tirl.rollout.simulate` (a discrete-event model, nothing is executed or connected) for
batch-synchronous rollout, request-level async, + partial rollouts, + prefix-aware router, on
the same AgentMath-like workload per seed, and prints a markdown table (medians over seeds) and
every parameter. Step time is the mean over the steps after `--warmup` (partial rollouts need
a few steps to reach steady state: most trajectories finish within 4 segments). Unless
`--quick`, it also prints two sensitivity variants (twice the KV capacity; AgentMath's tool
latency) and a comparison of routers.

Why these parameters: the workload is AgentMath's RL stage (batch 64 x 8 samples, context and
tool budgets up to 96k tokens / 96 calls, 4 segments of 24k tokens / 24 calls; their mean
response is ~25-29k tokens, since a 4k cut is ~14% there; ours is ~18k before clipping); tool
latency is this repo's sandbox (`BENCHMARKS.md`: 0.44 ms small sympy cell, 4.7 ms heavy cell)
plus a 2% Pareto tail for timeouts and a loaded cluster; the cost model is an
order-of-magnitude 4-GPU replica of an 8B model (20 ms + 0.25 ms/seq per decode step, 50k
prefill tokens/s, 1.5M KV tokens). None of them was tuned to the 4x target.

Part (b): the real `HFEngine` on CPU, static vs continuous batching,
on a tool-calling workload with real sandbox cells.

Each trajectory draws a heavy-tailed number of tool calls (Pareto, clipped) and a heavy-tailed
length for each of its calls + 1 model segments (lognormal, clipped). A segment ends through
the engine's stop function once its drawn length is reached (standing for the code block
closing); then a real `tirl.sandbox` cell runs in the trajectory's session (it sleeps a
heavy-tailed tool latency and prints a line of drawn length), and the output's tokens are fed
back. The model is a random-init Qwen2 built from a config (nothing downloaded), with EOS
disabled so that only the drawn lengths end segments; tool output is tokenized byte-wise.

Both admissions get the same rows (`max_batch`) and the same trajectories per repetition:
- static: `HFEngine(admission="static")`: `max_batch` trajectories are admitted together,
  decode each round in lockstep until every member stopped, wait for every member's tool call,
  and no new trajectory starts before the whole batch has finished (batch-synchronous);
- continuous: any trajectory takes a free row at any step, and one waiting on its tool frees
  its row (request-level scheduling, `tirl.rollout.runner`).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass, replace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tirl.backends.hf import HFEngine
from tirl.rollout.simulate import (
    CostModel,
    LatencySpec,
    Schedule,
    WorkloadSpec,
    describe,
    simulate,
    standard_schedules,
)
from tirl.sandbox import Sandbox, SandboxLimits

AGENTMATH = {  # reported step time and speed-up, `shared/papers/002` "训练效率"
    "sync": "3600-4000 s, -",
    "async": "2100-2500 s, 1.5-1.8x",
    "async+partial": "1100-1300 s, 3.0-3.3x",
    "async+partial+router": "750-900 s, 4.0-5.0x",
}


def run_all(workload, cost, replicas, seeds, steps, warmup, schedules=None):
    """{schedule name: [SimResult per seed]}, by default the four schedules, same workloads."""
    out = {}
    for sched in schedules or standard_schedules():
        out[sched.name] = [
            simulate(sched, workload, cost, replicas=replicas, seed=s, n_steps=steps, warmup=warmup)
            for s in seeds
        ]
    return out


def table(results) -> str:
    base = next(iter(results.values()))
    rows = [
        "| configuration | mean step time (s) | speedup vs (1) | contribution | accelerator idle"
        " | decode tokens/s | router moves/step | AgentMath reported |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    prev = None
    for i, (name, res) in enumerate(results.items(), 1):
        step = statistics.median(r.mean_step_s for r in res)
        speed = statistics.median(b.mean_step_s / r.mean_step_s for b, r in zip(base, res))
        contrib = "-" if prev is None else f"{prev / step:.2f}x"
        idle = statistics.median(r.idle_share for r in res)
        tps = statistics.median(r.tokens_per_s for r in res)
        moves = statistics.median(r.migrations / len(r.steps) for r in res)
        rows.append(
            f"| ({i}) {name} | {step:,.0f} | {speed:.2f}x | {contrib} | {idle:.1%} | {tps:,.0f}"
            f" | {moves:.0f} | {AGENTMATH.get(name, '')} |"
        )
        prev = step
    return "\n".join(rows)


def params(workload, cost, replicas, seeds, steps, warmup) -> str:
    sched = standard_schedules()[-1]
    pairs = [("replicas", replicas), ("seeds", list(seeds)), ("steps", steps)]
    pairs += [("warmup steps (not measured)", warmup)]
    pairs += [(f"cost.{k}", v) for k, v in describe(cost)]
    pairs += [(f"workload.{k}", v) for k, v in describe(workload)]
    pairs += [
        (f"schedule.{k}", getattr(sched, k))
        for k in ("seg_tokens", "seg_calls", "l_base", "w_base", "rebalance_threshold")
    ]
    return "\n".join(f"- {k} = {v}" for k, v in pairs)


# ---------------------------------------------------------------- part (b)


@dataclass(frozen=True)
class EngineWorkload:
    trajectories: int = 48
    max_batch: int = 8
    prompt_tokens: int = 32
    calls_alpha: float = 1.2  # tool calls = min(floor(Pareto(alpha)), max_calls): 56% make one
    max_calls: int = 8
    seg_median: float = 16.0  # segment length lognormal(log median, sigma), clipped
    seg_sigma: float = 1.0
    seg_min: int = 2
    seg_max: int = 160
    latency_median_s: float = 0.02  # tool latency lognormal, clipped
    latency_sigma: float = 1.0
    latency_max_s: float = 1.0
    output_median_chars: float = 24.0  # printed output length lognormal(sigma 0.8)


@dataclass(frozen=True)
class Plan:
    """One trajectory's draws: its segment lengths and, between them, its tool cells."""

    segments: list[int]
    latencies: list[float]
    output_chars: list[int]


def draw(w: EngineWorkload, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = []
    for _ in range(w.trajectories):
        calls = min(int(rng.paretovariate(w.calls_alpha)), w.max_calls)
        segs = [
            min(
                max(round(rng.lognormvariate(math.log(w.seg_median), w.seg_sigma)), w.seg_min),
                w.seg_max,
            )
            for _ in range(calls + 1)
        ]
        lat = [
            min(rng.lognormvariate(math.log(w.latency_median_s), w.latency_sigma), w.latency_max_s)
            for _ in range(calls)
        ]
        chars = [
            round(rng.lognormvariate(math.log(w.output_median_chars), 0.8)) for _ in range(calls)
        ]
        plans.append(Plan(segs, lat, chars))
    return plans


def tiny_qwen2(hidden: int = 128, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return Qwen2ForCausalLM(config).eval()


async def _trajectory(engine: HFEngine, sandbox: Sandbox, key: int, plan: Plan, vocab: int) -> int:
    """Drive one planned trajectory; returns its number of model tokens."""
    feed = [(key * 7 + i) % vocab for i in range(32)]
    tokens, session = 0, None
    try:
        for i, length in enumerate(plan.segments):
            out = await engine.generate(
                key, feed, max_new_tokens=length, stop=lambda ids, n=length: len(ids) >= n
            )
            tokens += len(out.ids)
            if i == len(plan.latencies):
                break
            if session is None:
                session = await sandbox.session()
            code = f"import time\ntime.sleep({plan.latencies[i]:.4f})\nprint('x' * {plan.output_chars[i]})"
            result = await session.run(code)
            feed = [b % vocab for b in result.stdout.encode()] or [0]
    finally:
        engine.release(key)
        if session is not None:
            await session.close()
    return tokens


async def _one_run(model, plans: list[Plan], w: EngineWorkload, admission: str) -> dict:
    engine = HFEngine(model, eos_id=-1, max_batch=w.max_batch, admission=admission, seed=0)
    vocab = model.config.vocab_size
    async with Sandbox(SandboxLimits(timeout_s=10)) as sandbox:
        await (await sandbox.session()).close()  # warm the zygote
        t0 = time.perf_counter()
        tokens = await asyncio.gather(
            *(_trajectory(engine, sandbox, k, p, vocab) for k, p in enumerate(plans))
        )
        wall = time.perf_counter() - t0
    engine.close()
    return {
        "tokens": sum(tokens),
        "wall_s": wall,
        "tokens_per_s": sum(tokens) / wall,
        "steps": engine.steps,
        "occupancy": engine.rows_stepped / max(engine.steps, 1),
    }


def run_part_b(w: EngineWorkload, reps: int, hidden: int = 128) -> dict[str, list[dict]]:
    """{admission: [result per repetition]}; repetition r uses workload seed r for both."""
    torch.set_num_threads(1)
    model = tiny_qwen2(hidden)
    asyncio.run(_one_run(model, draw(w, 999)[:4], w, "continuous"))  # warm-up, not measured
    results: dict[str, list[dict]] = {"static": [], "continuous": []}
    for rep in range(reps):
        plans = draw(w, rep)
        for admission in results:
            results[admission].append(asyncio.run(_one_run(model, plans, w, admission)))
    return results


def table_b(results: dict[str, list[dict]]) -> str:
    med = {a: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for a, rs in results.items()}
    ratios = [
        c["tokens_per_s"] / s["tokens_per_s"]
        for s, c in zip(results["static"], results["continuous"])
    ]
    rows = [
        "| admission | model tokens | wall time (s) | tokens/s | decode steps | rows per step |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for a, m in med.items():
        rows.append(
            f"| {a} | {m['tokens']:,.0f} | {m['wall_s']:.2f} | {m['tokens_per_s']:,.0f}"
            f" | {m['steps']:,.0f} | {m['occupancy']:.2f} |"
        )
    rows.append(
        f"\ncontinuous / static tokens/s: median {statistics.median(ratios):.2f}x"
        f" over {len(ratios)} repetitions (each: {', '.join(f'{r:.2f}x' for r in ratios)})"
    )
    return "\n".join(rows)


def part_a(a) -> None:
    seeds = range(a.seeds)
    workload, cost = WorkloadSpec(), CostModel()
    t0 = time.perf_counter()
    res = run_all(workload, cost, a.replicas, seeds, a.steps, a.warmup)
    print("## Rollout schedules, simulated (medians over seeds)\n")
    print(table(res))
    print("\nParameters:\n")
    print(params(workload, cost, a.replicas, seeds, a.steps, a.warmup))
    if not a.quick:
        variants = {
            "KV capacity x2 (3.0M tokens per replica)": (
                workload,
                replace(cost, kv_capacity_tokens=3_000_000),
            ),
            "tool latency as AgentMath's cluster (lognormal, median 1.2 s, sigma 0.5)": (
                replace(workload, latency=LatencySpec(1.0, 1.2, 0.5, 0.0)),
                cost,
            ),
        }
        vseeds = range(min(3, a.seeds))
        for title, (w, c) in variants.items():
            print(f"\n### Variant: {title} ({len(vseeds)} seeds)\n")
            print(table(run_all(w, c, a.replicas, vseeds, a.steps, a.warmup)))
        std = standard_schedules()
        routers = [
            Schedule("async+partial, non-sticky", partial=True, router="round_robin_per_turn"),
            std[2],
            std[3],
        ]
        print(
            f"\n### Router baselines ({len(vseeds)} seeds; speed-up vs the first row): a new"
            " request per turn sent round-robin (re-prefills the whole context every turn, as"
            " AReaL's TIR example does), pinned round-robin (the (3) above), prefix-aware\n"
        )
        print(table(run_all(workload, cost, a.replicas, vseeds, a.steps, a.warmup, routers)))
    print(f"\n(simulated in {time.perf_counter() - t0:.0f} s of wall time)")


def part_b(a) -> None:
    w = EngineWorkload(trajectories=24) if a.quick else EngineWorkload()
    t0 = time.perf_counter()
    results = run_part_b(w, a.reps, a.hidden)
    print(f"\n## HFEngine on CPU: static vs continuous batching (medians of {a.reps} reps)\n")
    print(table_b(results))
    print("\nParameters:\n")
    print("\n".join(f"- workload.{k} = {v}" for k, v in describe(w)))
    print(
        f"- model = random-init Qwen2 (4 layers, hidden {a.hidden}, 4 heads, 2 KV heads, vocab 512)"
    )
    print(f"- torch threads = {torch.get_num_threads()}")
    print(f"\n(measured in {time.perf_counter() - t0:.0f} s of wall time)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("a", "b", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="a: 2 seeds, 6 steps; b: 24 traj, 2 reps")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5, help="part b repetitions")
    ap.add_argument("--hidden", type=int, default=128, help="part b model width")
    a = ap.parse_args()
    if a.quick:
        a.seeds, a.steps, a.warmup, a.reps = 2, 6, 4, 2
    if a.part in ("a", "all"):
        part_a(a)
    if a.part in ("b", "all"):
        part_b(a)


if __name__ == "__main__":
    main()
