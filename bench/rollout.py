"""Rollout benchmarks (issue 6): (a) a simulated cluster, (b) the real HF engine on CPU.

    python bench/rollout.py [--part a|b|all] [--quick] [--seeds 5] [--steps 10] [--warmup 4]
                            [--replicas 8] [--reps 5] [--kv-cache both|slots|padded]
                            [--fast-path both|on|off] [--profile] [--model NAME] [--threads 1]

Part (a): step time of four rollout schedules on a simulated cluster.

Runs `tirl.studies.simulate` (a discrete-event model, nothing is executed or connected) for
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
back. The model is a random-init Qwen2 built from a config (nothing downloaded), or with
`--model` a pretrained one (smollm2-135m-instruct, from its PyPI wheel), with EOS disabled so
that only the drawn lengths end segments; tool output is tokenized byte-wise.

Both admissions get the same rows (`max_batch`) and the same trajectories per repetition:
- static: `HFEngine(admission="static")`: `max_batch` trajectories are admitted together,
  decode each round in lockstep until every member stopped, wait for every member's tool call,
  and no new trajectory starts before the whole batch has finished (batch-synchronous);
- continuous: any trajectory takes a free row at any step, and one waiting on its tool frees
  its row (request-level scheduling, `tirl.rollout.runner`).

Each admission runs with every selected forward-pass setup in the same repetition (the order
of the runs is reversed every other repetition):
- "slots+fused", the engine's default for Qwen2/Llama (issue 30): the slot cache, its forward
  pass run straight from the weights (`tirl.backends.fused`);
- "slots" (`--fast-path off` alone; with `both`, the default, the before of a before/after in
  one run): the slot cache, its pass through the model's own transformers modules;
- "padded" (issue 17's baseline, `--kv-cache padded` or `both`): the cache the slot cache
  replaced (`tirl.backends.kv_slots`: a slot per decoding row, no re-padding, a joining row's
  chunk in the same pass as the decoding rows).
`--profile` adds where a step's time goes: one run per admission timed by part, one forward
pass's cost against its rows, and a decode pass by op category.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, replace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tirl.backends.hf import HFEngine
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.studies.simulate import (
    CostModel,
    LatencySpec,
    Schedule,
    WorkloadSpec,
    describe,
    simulate,
    standard_schedules,
)

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


async def _one_run(
    model,
    plans: list[Plan],
    w: EngineWorkload,
    admission: str,
    kv_cache: str = "slots",
    on_engine=None,
    fused: bool | None = None,
) -> dict:
    engine = HFEngine(
        model,
        eos_id=-1,
        max_batch=w.max_batch,
        admission=admission,
        seed=0,
        kv_cache=kv_cache,
        fused=fused,
    )
    if on_engine is not None:  # the profile's timers
        on_engine(engine)
    vocab = model.config.vocab_size
    async with Sandbox(SandboxLimits(timeout_s=10)) as sandbox:
        await (await sandbox.session()).close()  # warm the zygote
        t0, cpu0 = time.perf_counter(), time.process_time()
        tokens = await asyncio.gather(
            *(_trajectory(engine, sandbox, k, p, vocab) for k, p in enumerate(plans))
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    engine.close()
    kv = engine.kv
    return {
        "tokens": sum(tokens),
        "wall_s": wall,
        "cpu_s": cpu,  # this process (engine and event loop), not the sandbox's workers
        "tokens_per_s": sum(tokens) / wall,
        "steps": engine.steps,
        "occupancy": engine.rows_stepped / max(engine.steps, 1),
        "forwards": getattr(kv, "forwards", engine.steps),
        "repads": getattr(kv, "repads", 0),
        "rows_copied": getattr(kv, "saves", 0) + getattr(kv, "loads", 0) + getattr(kv, "moves", 0),
    }


CACHES = ("slots", "padded")  # the slot cache, and the padded cache it replaced (the baseline)
# How each step's forward pass runs: label -> (kv_cache, fused). "slots+fused": the slot cache,
# its pass run from the weights (`tirl.backends.fused`, issue 30: the engine's default for
# Qwen2/Llama); "slots": the slot cache through the model's modules (the baseline of issue
# 30); "padded": the padded cache (the baseline of issue 17).
SETUPS = {"slots+fused": ("slots", True), "slots": ("slots", False), "padded": ("padded", False)}


def setups_for(kv_cache: str = "both", fast_path: str = "both") -> tuple[str, ...]:
    """The `SETUPS` that `--kv-cache` and `--fast-path` select."""
    out = []
    if kv_cache in ("both", "slots"):
        out += {"both": ["slots+fused", "slots"], "on": ["slots+fused"], "off": ["slots"]}[
            fast_path
        ]
    if kv_cache in ("both", "padded"):
        out.append("padded")
    return tuple(out)


def bench_model(name_or_path: str | None, hidden: int):
    """Part (b)'s model: the random-init toy, or a pretrained one (`--model`: a name tirl
    knows, such as smollm2-135m-instruct, or a folder), in float32 and eval mode."""
    if name_or_path is None:
        return tiny_qwen2(hidden)
    from transformers import AutoModelForCausalLM

    from tirl.models.sources import SHIPPED_MODELS, model_folder

    if not (os.path.exists(os.path.expanduser(name_or_path)) or name_or_path in SHIPPED_MODELS):
        raise SystemExit(
            f"--model {name_or_path!r}: not a folder, a .gguf file or a shipped model"
            f" ({', '.join(SHIPPED_MODELS)}); the benchmark downloads nothing"
        )
    folder = model_folder(name_or_path)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def describe_model(model, name_or_path: str | None) -> str:
    c = model.config
    what = name_or_path or "random-init Qwen2"
    return (
        f"{what} ({c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads}"
        f" heads, {c.num_key_value_heads} KV heads, vocab {c.vocab_size})"
    )


def run_part_b(
    w: EngineWorkload, reps: int, model, setups=("slots+fused", "slots", "padded")
) -> dict[tuple[str, str], list[dict]]:
    """{(admission, setup): [result per repetition]}; repetition r runs workload seed r in
    every configuration, in an order reversed every other repetition (load drifts)."""
    for setup in setups:  # warm-up, not measured
        kv_cache, fused = SETUPS[setup]
        asyncio.run(_one_run(model, draw(w, 999)[:4], w, "continuous", kv_cache, fused=fused))
    configs = [(adm, setup) for setup in setups for adm in ("static", "continuous")]
    results: dict[tuple[str, str], list[dict]] = {c: [] for c in configs}
    for rep in range(reps):
        plans = draw(w, rep)
        for admission, setup in configs if rep % 2 == 0 else configs[::-1]:
            kv_cache, fused = SETUPS[setup]
            run = asyncio.run(_one_run(model, plans, w, admission, kv_cache, fused=fused))
            results[(admission, setup)].append(run)
    return results


def _ratios(results, num: tuple[str, str], den: tuple[str, str]) -> str:
    each = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(results[num], results[den])]
    return (
        f"median **{statistics.median(each):.2f}x** over {len(each)} repetitions"
        f" (each: {', '.join(f'{r:.2f}x' for r in each)})"
    )


def table_b(results: dict[tuple[str, str], list[dict]]) -> str:
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in results.items()}
    rows = [
        "| admission | forward pass | model tokens | wall time (s) | process CPU (s) | tokens/s"
        " | decode steps | rows per step | forward passes | re-padded steps | rows copied |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (adm, setup), m in med.items():
        rows.append(
            f"| {adm} | {setup} | {m['tokens']:,.0f} | {m['wall_s']:.2f} | {m['cpu_s']:.2f}"
            f" | {m['tokens_per_s']:,.0f}"
            f" | {m['steps']:,.0f} | {m['occupancy']:.2f} | {m['forwards']:,.0f}"
            f" | {m['repads']:,.0f} | {m['rows_copied']:,.0f} |"
        )
    setups = sorted({setup for _, setup in results}, key=list(SETUPS).index)
    rows.append("")
    for setup in setups:
        rows.append(
            f"- continuous / static tokens/s, {setup}: "
            + _ratios(results, ("continuous", setup), ("static", setup))
        )
    for new, old in (("slots+fused", "slots"), ("slots", "padded")):
        if new in setups and old in setups:
            for adm in ("static", "continuous"):
                rows.append(
                    f"- {new} / {old} tokens/s, {adm}: " + _ratios(results, (adm, new), (adm, old))
                )
    return "\n".join(rows)


# ---------------------------------------------------------------- part (b) profile


class _Timer:
    """Wall time spent in the functions it wraps, per label (for `--profile`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, obj, name: str, label: str) -> None:
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t
                self.calls[label] = self.calls.get(label, 0) + 1

        setattr(obj, name, timed)  # an instance attribute: the class is untouched


def _run_breakdown(model, w: EngineWorkload, setups) -> str:
    """One run of each admission and slot-cache setup (workload seed 0): where the wall time
    went. The fused pass writes its cache inline, so its cache column is empty."""
    rows = [
        "| admission | forward pass | wall (s) | steps | model forward | of which cache"
        " writes/reads | rest of the step (inputs, sampling) | slot bookkeeping between"
        " steps | rest (event loop, tools, idle) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setup in setups:
        kv_cache, fused = SETUPS[setup]
        for admission in ("static", "continuous"):
            timer = _Timer()

            def instrument(engine, timer=timer):
                timer.wrap(engine, "_step", "step")
                timer.wrap(engine.kv, "arrange", "arrange")
                if engine.kv.fused is not None:
                    timer.wrap(engine.kv.fused, "forward", "forward")
                else:
                    timer.wrap(engine.kv.cache, "update", "cache")
                    timer.wrap(model, "forward", "forward")

            try:
                run = asyncio.run(
                    _one_run(model, draw(w, 0), w, admission, kv_cache, instrument, fused)
                )
            finally:
                model.__dict__.pop("forward", None)  # the instance attribute `instrument` set
            sec, wall, steps = timer.seconds, run["wall_s"], run["steps"]
            parts = [sec["forward"], sec.get("cache"), sec["step"] - sec["forward"]]
            parts += [sec["arrange"], wall - sec["step"] - sec["arrange"]]
            cells = " | ".join(
                "-" if x is None else f"{x:.2f} s ({x / wall:.0%}, {1000 * x / steps:.2f} ms/step)"
                for x in parts
            )
            rows.append(f"| {admission} | {setup} | {wall:.2f} | {steps:,} | {cells} |")
    return "\n".join(rows)


def _median_ms(fn, reps: int = 30) -> float:
    times = []
    for _ in range(reps):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return 1000 * statistics.median(times)


def _pass_costs(model, past: int = 128, chunk: int = 25) -> str:
    """CPU time of one step's forward pass against its rows: a decode step, and one where a
    row joins with a `chunk`-token tool output, for the slot cache fused and through the
    model's modules; for the padded cache, a decode step that reuses the last batch cache and
    one that re-pads."""

    rows = [
        f"| rows | slots+fused: decode (ms) | slots+fused: + a {chunk}-token join (ms)"
        f" | slots: decode (ms) | slots: + a {chunk}-token join (ms)"
        " | padded: decode, cache reused (ms) | padded: decode, re-padded (ms)"
        f" | padded: + a {chunk}-token join (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in (1, 2, 4, 8):
        rows.append(_pass_costs_row(model, n, past, chunk))
    return "\n".join(rows)


def _slot_costs(model, n: int, past: int, chunk: int, fused: bool) -> tuple[float, float]:
    from tirl.backends.fused import FusedSlotForward
    from tirl.backends.kv_slots import SlotRows

    keys, prompt, tool, decode = list(range(n)), [[7] * past] * n, [[5] * chunk], [[1]] * n
    slots = SlotRows(model, n + 1, 4096, fused=FusedSlotForward(model) if fused else None)
    slots.arrange(keys, [0] * n, {})
    slots.forward(keys, prompt, [0] * n)
    lengths = [past] * n

    def slot_decode():
        slots.forward(keys, decode, lengths)
        lengths[:] = [p + 1 for p in lengths]

    slot_ms = _median_ms(slot_decode)
    at = list(lengths)
    slots.arrange([*keys, "new"], [*at, 0], {})
    join_ms = _median_ms(lambda: slots.forward([*keys, "new"], decode + tool, [*at, 0]))
    return slot_ms, join_ms


def _pass_costs_row(model, n: int, past: int, chunk: int) -> str:
    from tirl.backends.hf import PaddedRows

    keys, prompt, tool, decode = list(range(n)), [[7] * past] * n, [[5] * chunk], [[1]] * n
    fused_ms, fused_join_ms = _slot_costs(model, n, past, chunk, True)
    slot_ms, join_ms = _slot_costs(model, n, past, chunk, False)

    padded = PaddedRows(model, "cache", True, True)
    padded.forward(keys, prompt, [0] * n)
    lengths = [past] * n

    def padded_decode():
        padded.forward(keys, decode, lengths)
        lengths[:] = [p + 1 for p in lengths]

    reused_ms = _median_ms(padded_decode)
    saved, at = dict(padded.caches), list(lengths)

    def repadded():
        padded.caches, padded._last_decode = dict(saved), None
        padded.forward(keys, decode, at)

    def joined():
        padded.caches, padded._last_decode = dict(saved), None
        padded.forward([*keys, "new"], decode + tool, [*at, 0])

    return (
        f"| {n} | {fused_ms:.2f} | {fused_join_ms:.2f} | {slot_ms:.2f} | {join_ms:.2f}"
        f" | {reused_ms:.2f} | {_median_ms(repadded):.2f} | {_median_ms(joined):.2f} |"
    )


OP_CATEGORIES = {  # torch.profiler op names -> category
    "attention": ("scaled_dot_product",),
    "matrix products (linear layers, MLP, LM head)": ("aten::mm", "aten::addmm", "aten::bmm"),
    "KV writes and reads": ("index_put", "index_select", "aten::index"),
}


def _op_split(model, rows: int, fused: bool, past: int = 128, passes: int = 20) -> str:
    """Share of a slot decode pass's wall time per op category, and outside ops (Python)."""
    from torch.profiler import ProfilerActivity, profile

    from tirl.backends.fused import FusedSlotForward
    from tirl.backends.kv_slots import SlotRows

    keys = list(range(rows))
    slots = SlotRows(model, rows, 4096, fused=FusedSlotForward(model) if fused else None)
    slots.arrange(keys, [0] * rows, {})
    slots.forward(keys, [[7] * past] * rows, [0] * rows)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for i in range(passes):
            slots.forward(keys, [[1]] * rows, [past + i] * rows)
        wall = time.perf_counter() - t
    split = dict.fromkeys([*OP_CATEGORIES, "other ops (norms, rotary, elementwise, views)"], 0.0)
    for event in prof.key_averages():
        name = next(
            (c for c, marks in OP_CATEGORIES.items() if any(m in event.key for m in marks)),
            "other ops (norms, rotary, elementwise, views)",
        )
        split[name] += event.self_cpu_time_total / 1e6
    split["outside ops (Python in transformers and tirl)"] = wall - sum(split.values())
    return ", ".join(f"{name} {sec / wall:.0%}" for name, sec in split.items())


def profile_part_b(w: EngineWorkload, model) -> None:
    print(f"\n### Where the time goes (slot cache, workload seed 0; load {_load(os.getloadavg())})")
    print("\nOne run of each admission, wall time by part (share of the run, per step):\n")
    print(_run_breakdown(model, w, ("slots+fused", "slots")))
    print("\nOne forward pass against its rows (CPU time, median of 30; rows at 128 tokens):\n")
    with torch.no_grad():
        print(_pass_costs(model))
        for fused in (True, False):
            for rows in (1, 8):
                split = _op_split(model, rows, fused)
                name = "slots+fused" if fused else "slots"
                print(f"\nA decode pass ({name}) over {rows} row(s), by op category: {split}")


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
    w = replace(
        EngineWorkload(),
        trajectories=a.trajectories or (24 if a.quick else 48),
        max_batch=a.max_batch,
    )
    torch.set_num_threads(a.threads)
    model = bench_model(a.model, a.hidden)
    t0, load0 = time.perf_counter(), os.getloadavg()
    results = run_part_b(w, a.reps, model, setups_for(a.kv_cache, a.fast_path))
    load1 = os.getloadavg()
    print(f"\n## HFEngine on CPU: static vs continuous batching (medians of {a.reps} reps)\n")
    print(table_b(results))
    print("\nParameters:\n")
    print("\n".join(f"- workload.{k} = {v}" for k, v in describe(w)))
    print(f"- model = {describe_model(model, a.model)}")
    print(f"- torch threads = {torch.get_num_threads()}")
    print(f"- load average (1, 5, 15 min) before: {_load(load0)}; after: {_load(load1)}")
    print(f"\n(measured in {time.perf_counter() - t0:.0f} s of wall time)")
    if a.profile:
        profile_part_b(w, model)


def _load(avg) -> str:
    return ", ".join(f"{x:.2f}" for x in avg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("a", "b", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="a: 2 seeds, 6 steps; b: 24 traj, 2 reps")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5, help="part b repetitions")
    ap.add_argument("--hidden", type=int, default=128, help="part b: the toy model's width")
    ap.add_argument(
        "--model",
        help="part b: a pretrained model instead of the random-init toy (smollm2-135m-instruct,"
        " a folder)",
    )
    ap.add_argument("--threads", type=int, default=1, help="part b: torch threads (default 1)")
    ap.add_argument(
        "--max-batch",
        type=int,
        default=EngineWorkload.max_batch,
        help="part b: rows the engine decodes at once, in both admissions (default 8)",
    )
    ap.add_argument(
        "--trajectories", type=int, help="part b: trajectories a repetition (default 48; 24 quick)"
    )
    ap.add_argument(
        "--kv-cache",
        choices=("both", *CACHES),
        default="both",
        help="part b: the KV cache(s) to run; both: the padded one is the baseline",
    )
    ap.add_argument(
        "--fast-path",
        choices=("both", "on", "off"),
        default="both",
        help="part b, slot cache: its forward pass fused from the weights (on), through the"
        " model's modules (off, the baseline), or both in the same run",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="part b: also where a step's time goes (per-step cost vs rows, op categories)",
    )
    a = ap.parse_args()
    if a.quick:
        a.seeds, a.steps, a.warmup, a.reps = 2, 6, 4, 2
    if a.part in ("a", "all"):
        part_a(a)
    if a.part in ("b", "all"):
        part_b(a)


if __name__ == "__main__":
    main()
