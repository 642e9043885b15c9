"""SmolLM2-135M-Instruct: tirl's SFT and RL steps against TRL's, in float32 and bfloat16.

    python bench/peers.py --model smollm2-135m-instruct [--part sft,rl,tools] [--blocks 3]
        [--rl-blocks 2] [--bf16-blocks 1] [--dtypes float32,bfloat16]
        [--trl-bf16 autocast|weights] [--threads 1]
        [--no-trl] [--no-tools] [--out FILE]

The SmolLM2 mode of `bench/peers.py` (issue 42). Every contender is a process of its own, so
that its peak resident memory (the process's max RSS, `getrusage`) is its own: tirl's in the
main environment (this file, `--worker SPEC`), TRL's in TRL's venv (`bench/peers_trl.py`).
Each process waits for a `go` before each step and reports the step's own seconds, so the
waits never count. Contenders that are compared run in one group, their blocks interleaved
(the order rotates every round), so they see the same load on a shared machine. The groups
run one after the other (float32 SFT, bfloat16 SFT, RL), so that at most two models are in
memory at once, each starting only once the memory it peaks at is available (7 GB for an SFT
group, 9 GB for an RL process; it waits otherwise, uncounted). An SFT group's two processes
live through the group and hand the memory freed after each step back to the OS
(`malloc_trim`, outside the clock). An RL step peaks at 6-8 GB, so each RL block is a
process of its own, one at a time, with the tasks its block would have had (block k starts
k blocks of prompts later).

SFT (`--part sft`), four groups of two (tirl, TRL): full fine-tuning and LoRA (rank 16,
alpha 32, all-linear), float32 then bfloat16. The rows are the demonstrations `tirl train`
makes for `tirl quickstart --model smollm2-135m-instruct` (the `real_model` preset: the
arithmetic source, SmolLM2's chat template and system message, 30% of them calling the
interpreter, its output masked), 8 per step, drawn as `tirl.train.sft` draws them. tirl's
step is `tirl.train.sft.sft_backward` + gradient clipping + AdamW on the model `Pipeline`
builds (`model.dtype`: bfloat16 weights, AdamW states in bfloat16 too). TRL's is
`SFTTrainer` on the same token ids in the same batches, the loss on tirl's trained tokens
(the assistant's own tokens; `assistant_masks` = tirl's loss mask; the script checks that the
label counts agree), `max_length` the longest row (nothing truncated), no gradient
checkpointing, no packing, constant learning rate, AdamW, gradient norm clipped to 1. TRL's
bfloat16 is its own default (`bf16=True`: autocast to bfloat16 around float32 weights and
float32 AdamW; `--trl-bf16 weights` loads bfloat16 weights instead). Reported: trained (loss)
tokens per second and padded positions computed per second (batch x longest row; the same
batches for both), medians over blocks.

RL (`--part rl`), one group: tirl's `RLTrainer` step as `tirl train` builds it for the preset
(HF engine, chat prompts, LoRA, 4 prompts x 8 samples, 64 model tokens, 2 updates, on-policy,
the sampler's log-probs as the old ones), text-only and with the interpreter (tool budget 2),
against TRL's `GRPOTrainer` text-only with the same LoRA, prompts (checked to be tirl's ids),
rewards (tirl's scorer) and shape. The policy is SmolLM2 as loaded (no SFT first), so it
rarely writes code: the with-tools row is the interpreter's cost at the rate it is called. TRL with its own tool calling (`tools=[python]`) is tried
first; where TRL refuses SmolLM2's template, its one-line error is printed instead of a row.
float32 only: on this machine's CPU a bfloat16 RL step would take many minutes.

With tools (`--part tools`, `bench/peers_smollm2_tools.py`), one more RL group: tirl with its
interpreter against TRL with its own tool calling, on a policy SFT'd into both formats and
with TRL given a chat template its tool calling knows.

Blocks: float32 SFT 1 warm-up block + `--blocks`; bfloat16 SFT `--bf16-blocks` and RL
`--rl-blocks`, without a warm-up block (a step there takes minutes, so the first step's
set-up is a small share of it). A block is `--block` steps (default 1 here). The bfloat16
steps train on the rows of the float32 measured blocks (the warm-up batch skipped).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import peers
import peers_smollm2_tools
from peers_trl import trim_heap

MODEL = "smollm2-135m-instruct"
PRESET = "real_model"  # what `tirl quickstart --model smollm2-135m-instruct` runs
SFT, RL, TOOLS = "sft", "rl", "tools"
LORA_OFF = ["model.lora.rank=0"]
TRL_NOTE = {"autocast": "bf16=True (autocast, float32 weights)", "weights": "bfloat16 weights"}


# ---------------------------------------------------------------------- settings
def run_config(overrides: list[str]):
    from tirl.cli import preset_path
    from tirl.config import load_config
    from tirl.run.config import RunConfig

    return load_config(RunConfig, preset_path(PRESET), overrides)


def base_overrides(threads: int) -> list[str]:
    return ["sft.steps=0", "rl.warmup_steps=0", f"threads={threads}"]


def sft_groups(args) -> list[dict]:
    """The SFT groups in the order they run: float32 first, then bfloat16."""
    groups = []
    for dtype in [d for d in ("float32", "bfloat16") if d in args.dtypes]:
        for lora in (False, True):
            tuning = "LoRA" if lora else "full"
            groups.append({
                "name": f"SFT {tuning} {dtype}", "part": SFT, "dtype": dtype, "lora": lora,
                "warmup": 1 if dtype == "float32" else 0, "memory_gb": 7,
                "blocks": args.blocks if dtype == "float32" else args.bf16_blocks,
            })  # fmt: skip
    return groups


# ---------------------------------------------------------------------- workers
def tirl_worker(spec: dict, log_path: Path) -> peers.SideProcess:
    command = [sys.executable, str(Path(__file__)), "--worker", json.dumps(spec)]
    return peers.SideProcess(command, log_path)


def trl_worker(spec: dict, log_path: Path) -> peers.SideProcess:
    command = [str(peers.TRL_VENV / "bin" / "python"), str(peers.TRL_SCRIPT), json.dumps(spec)]
    return peers.SideProcess(command, log_path)


def emit(record: dict) -> None:
    sys.stdout.write("PEERS " + json.dumps(record) + "\n")
    sys.stdout.flush()


def wait_for_go() -> bool:
    return sys.stdin.readline().strip() == "go"


def worker_main(spec: dict) -> None:
    """tirl's side of one contender (`--worker SPEC`): SFT steps or RL steps, one per `go`."""
    from tirl.train.pipeline import quiet_transformers

    cfg = run_config(spec["overrides"])
    quiet_transformers(cfg)  # torch's threads: `threads`
    with tempfile.TemporaryDirectory(prefix="tirl-peers-smollm2-") as tmp:
        if spec["part"] == SFT:
            sft_worker(cfg, spec, Path(tmp))
        else:
            asyncio.run(rl_worker(cfg, spec, Path(tmp)))


def sft_worker(cfg, spec: dict, tmp: Path) -> None:
    import torch

    from tirl.models.lora import trainable_parameters
    from tirl.protocol.segments import Trajectory
    from tirl.train.metrics import peak_rss_gb
    from tirl.train.pipeline import Pipeline
    from tirl.train.sft import sft_backward

    start = time.perf_counter()
    pipeline = Pipeline(cfg, tmp, evaluation=None)
    pipeline.prepare()
    model = pipeline.make_model()  # model.dtype, model.lora, as `tirl train` builds it
    model.train()
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)
    batches = json.loads(Path(spec["rows"]).read_text())
    batches = [[Trajectory.from_dict(d) for d in batch] for batch in batches]
    device = next(model.parameters()).device
    emit({
        "event": "built", "load_s": time.perf_counter() - start,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "trainable": sum(p.numel() for p in params), "threads": torch.get_num_threads(),
    })  # fmt: skip
    emit({"event": "ready"})
    for batch in batches:
        if not wait_for_go():
            return
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = sft_backward(
            model, batch, pipeline.tokenizer.pad_token_id, cfg.sft.mask_tool_output,
            cfg.sft.micro_batches, device,
        )  # fmt: skip
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # as tirl.train.sft.train_sft_stages
        optimizer.step()
        emit({
            "event": "step", "step_s": time.perf_counter() - start, "loss": loss,
            "trained_tokens": sum(sum(t.loss_mask[1:]) for t in batch),
            "cells": len(batch) * max(len(t.ids) for t in batch),
            "peak_rss_gb": peak_rss_gb(),
        })  # fmt: skip
        trim_heap()  # as TRL's side does: an idle contender holds what it keeps


async def rl_worker(cfg, spec: dict, tmp: Path) -> None:
    from tirl.sandbox import Sandbox
    from tirl.train.metrics import peak_rss_gb

    peers.instrument_tirl()
    start = time.perf_counter()
    async with Sandbox(cfg.sandbox.limits(), preload=tuple(cfg.sandbox.preload)) as sandbox:
        side = peers.TirlSide(cfg, sandbox, spec["tools"], tmp)
        engine = side.rollout.engine
        task = side.pipeline.mixture.item("train", cfg.sft.examples)  # the block's first
        emit({
            "event": "built", "load_s": time.perf_counter() - start,
            "sampler": f"{type(engine).__name__}, kv_cache {getattr(engine, 'kv_cache', '-')}",
            "prompt_tokens": len(side.pipeline.prompt_ids(task)),
        })  # fmt: skip
        emit({"event": "ready"})
        try:
            while await asyncio.to_thread(wait_for_go):
                start = time.perf_counter()
                record = await side.step()
                await side.drain()
                record["step_s"] = time.perf_counter() - start
                emit({"event": "step", **record, "peak_rss_gb": peak_rss_gb()})
        finally:
            await side.close()


# ---------------------------------------------------------------------- the parent
async def make_sft_rows(cfg, steps: int) -> list[list]:
    """`steps` batches of the preset's SFT demonstrations, as `tirl train` makes and draws
    them (`Pipeline.demonstrations`, `length_grouped_batches`)."""
    import torch

    from tirl.sandbox import Sandbox
    from tirl.train.pipeline import Pipeline
    from tirl.train.sft import length_grouped_batches

    with tempfile.TemporaryDirectory(prefix="tirl-peers-smollm2-") as tmp:
        pipeline = Pipeline(cfg, Path(tmp), evaluation=None)
        pipeline.prepare()
        async with Sandbox(cfg.sandbox.limits(), preload=tuple(cfg.sandbox.preload)) as sandbox:
            demos = await pipeline.demonstrations(True, sandbox)
        pipeline.logger.close()
    generator = torch.Generator().manual_seed(cfg.seed)
    lengths = [len(d.ids) for d in demos]
    draws = length_grouped_batches(
        lengths, cfg.sft.batch_size, steps, cfg.sft.length_window, generator
    )
    return [[demos[r] for r in rows] for rows in draws]


def sft_makers(group: dict, args, cfg, tmp: Path, batches: list[list]) -> dict:
    """The group's contenders: name -> a function that starts it (tirl's, then TRL's)."""
    from tirl.models.sources import model_folder

    name, dtype, lora = group["name"], group["dtype"], group["lora"]
    overrides = [*base_overrides(args.threads), f"model.dtype={dtype}"]
    overrides += [] if lora else LORA_OFF
    steps = group["warmup"] + group["blocks"] * args.block
    first = 0 if group["warmup"] else 1  # bfloat16: the rows of float32's measured blocks
    rows = batches[first : first + steps]
    rows_file = tmp / f"rows-{name.replace(' ', '-')}.json"
    rows_file.write_text(json.dumps([[t.to_dict() for t in b] for b in rows]))
    spec = {"part": SFT, "overrides": overrides, "rows": str(rows_file)}
    log = tmp / f"{name.replace(' ', '-')}.tirl.log"
    makers = {f"tirl {name}": lambda k: tirl_worker(spec, log)}
    if not args.no_trl:
        flat = [t for b in rows for t in b]
        trl = {
            "mode": "sft", "model": model_folder(MODEL), "threads": args.threads,
            "seed": cfg.seed, "batch_size": cfg.sft.batch_size, "lr": cfg.sft.lr,
            "weight_decay": cfg.sft.weight_decay,
            "max_length": max(len(t.ids) for t in flat),
            "rows": [{"input_ids": t.ids, "loss_mask": t.loss_mask} for t in flat],
            "bf16": args.trl_bf16 if dtype == "bfloat16" else None,
            "lora": dict(vars(cfg.model.lora)) if lora else None,
        }  # fmt: skip
        trl_log = peers.TRL_VENV.parent / "peers-trl-sft.log"
        makers[f"TRL {name}"] = lambda k: start_trl(lambda: trl_worker(trl, trl_log))
    return makers


async def rl_makers(args, cfg, out: dict, tmp: Path) -> dict:
    """tirl text-only, tirl with tools, TRL text-only (TRL with its own tools tried first):
    name -> a function that starts the contender for block k, its tasks the k-th block's
    (each block is a process of its own: three RL processes at once would not fit beside this
    machine's other jobs)."""
    from tirl.models.sources import model_folder
    from tirl.train.pipeline import Pipeline

    per_block = cfg.rl.prompts_per_step * args.block
    pipeline = Pipeline(cfg, tmp / "prompts", evaluation=None)
    pipeline.prepare()
    pipeline.logger.close()

    def trl_spec(k: int, tools: bool = False) -> dict:
        first = cfg.sft.examples + k * per_block  # as peers.TirlSide's first task, moved on
        ids = pipeline.prompt_ids(pipeline.mixture.item("train", first))
        spec = peers.trl_spec(cfg, Path(model_folder(MODEL)), ids, args.block)
        spec.update(first_task=first, chat=True, system=pipeline.renderer.system, tools=tools)
        spec["lora"] = dict(vars(cfg.model.lora))
        return spec

    def tirl(tools: bool):
        def make(k: int) -> peers.SideProcess:
            first = cfg.sft.examples + k * per_block
            overrides = [*base_overrides(args.threads), f"sft.examples={first}"]
            spec = {"part": RL, "overrides": overrides, "tools": tools}
            return tirl_worker(spec, tmp / f"rl-{'tools' if tools else 'text'}-{k}.log")

        return make

    log = peers.TRL_VENV.parent / "peers-trl-rl.log"
    makers: dict = {}
    if not args.no_trl and not args.no_tools:  # TRL's own tool calling, where it builds
        try:
            side = start_trl(lambda: trl_worker(trl_spec(0, tools=True), log))
        except peers.TrlRefused as exc:
            side = None
            out["trl_tools"] = str(exc)
            print(f"TRL GRPOTrainer with tools: not run: {exc}", flush=True)
        if side is not None:  # it built: a contender like the others
            out["trl_tools"] = "built"
            await side.close()
            makers["TRL GRPOTrainer with tools"] = lambda k: start_trl(
                lambda: trl_worker(trl_spec(k, tools=True), log)
            )
    makers["tirl text-only"] = tirl(False)
    if not args.no_tools:
        makers["tirl with tools"] = tirl(True)
    if not args.no_trl:
        makers["TRL GRPOTrainer text-only"] = lambda k: start_trl(
            lambda: trl_worker(trl_spec(k), log)
        )
    return makers


def start_trl(make) -> peers.SideProcess | None:
    """A TRL contender, or None with a one-line note saying why it is left out (a trainer
    TRL refuses to build is `peers.TrlRefused`, for the caller to report)."""
    if not (peers.TRL_VENV / "bin" / "python").is_file():
        print(peers.TRL_HINT, flush=True)
        return None
    try:
        return make()
    except peers.TrlRefused:
        raise
    except peers.TrlMissing:
        print(peers.TRL_HINT, flush=True)
    except peers.TrlFailed as exc:
        print(f"TRL left out: {exc}", flush=True)
    return None


def available_gb() -> float | None:
    """MemAvailable from /proc/meminfo, in GB (None where it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return None


async def wait_for_memory(gb: float, what: str) -> float:
    """Wait until `gb` GB are available before a contender starts (this machine is shared:
    a step that does not fit would bring the kernel's OOM killer onto someone's job); the
    seconds waited (not counted in any figure)."""
    start = time.perf_counter()
    said = False
    while (free := available_gb()) is not None and free < gb:
        if not said:
            print(f"{what}: waiting for {gb:.0f} GB of memory ({free:.1f} GB available)",
                  flush=True)  # fmt: skip
            said = True
        await asyncio.sleep(10)
    return time.perf_counter() - start


async def run_group(group: dict, makers: dict, block: int, restart: bool) -> dict:
    """Warm-up and measured blocks of every contender of the group, interleaved, the order
    rotated every round; the load average before each block. `restart`: each block in a
    process of its own, one process at a time; else every contender's process lives through
    the group."""
    names = list(makers)
    blocks: dict[str, list[dict]] = {name: [] for name in names}
    loads, info, waited = [], {}, 0.0
    if not restart:
        waited += await wait_for_memory(group["memory_gb"], group["name"])
    sides = {} if restart else {name: makers[name](0) for name in names}
    try:
        for k in range(group["warmup"] + group["blocks"]):
            order = names[k % len(names) :] + names[: k % len(names)]
            for name in order:
                if restart:
                    waited += await wait_for_memory(group["memory_gb"], f"{group['name']} {name}")
                side = makers[name](k) if restart else sides[name]
                if side is None:  # TRL left out (a line said why)
                    continue
                info[name] = side.info
                try:
                    loads.append(os.getloadavg()[0])
                    steps = [await side.step() for _ in range(block)]
                finally:
                    if restart:
                        await side.close()
                record = {"step_s": sum(s["step_s"] for s in steps) / block, "steps": steps}
                record["warmup"] = k < group["warmup"]
                blocks[name].append(record)
                print(f"{group['name']}: block {k}{' (warm-up)' if record['warmup'] else ''}"
                      f" {name}: {record['step_s']:.2f} s/step, load {loads[-1]:.2f}",
                      flush=True)  # fmt: skip
    finally:
        for side in sides.values():
            if side is not None:
                await side.close()
    blocks = {name: records for name, records in blocks.items() if records}
    return {"blocks": blocks, "loads": loads, "info": info, "waited_for_memory_s": waited}


def summarize(records: list[dict], part: str) -> dict:
    """Medians over the measured blocks: seconds per step, tokens per second."""
    measured = [b for b in records if not b["warmup"]]
    steps = [s for b in measured for s in b["steps"]]
    out = {
        "step_s": statistics.median(b["step_s"] for b in measured),
        "peak_rss_gb": max(s["peak_rss_gb"] for b in records for s in b["steps"]),
        "blocks": len(measured), "steps": len(steps),
    }  # fmt: skip
    if part == SFT:
        out["trained_tokens"] = statistics.median(s["trained_tokens"] for s in steps)
        for key in ("trained_tokens", "cells"):  # per second: the median over blocks
            out[f"{key}_per_s"] = statistics.median(
                sum(s[key] for s in b["steps"]) / (b["step_s"] * len(b["steps"])) for b in measured
            )
        out["cells"] = statistics.median(s["cells"] for s in steps)
    else:
        keys = ("sampled_tokens", "tool_calls", "sample_s", "correct", "real_tokens",
                "computed_tokens", "update_s", "trained_rows")  # fmt: skip
        for key in keys:
            if key in steps[0]:
                out[key] = statistics.median(s[key] for s in steps)
        if "generate_s" in steps[0]:  # TRL's: the update is the step after sampling, scoring
            out["sample_s"] = statistics.median(s["generate_s"] for s in steps)
            out["update_s"] = statistics.median(
                s["step_s"] - s["generate_and_score_s"] for s in steps
            )
    return out


async def run(args) -> dict:
    from tirl.train.pipeline import quiet_transformers

    cfg = run_config(base_overrides(args.threads))
    quiet_transformers(cfg)
    out: dict = {"model": MODEL, "threads": args.threads, "load_before": os.getloadavg(),
                 "trl_bf16": args.trl_bf16, "groups": {}}  # fmt: skip
    groups = sft_groups(args) if SFT in args.part else []
    steps = 1 + max([args.blocks, args.bf16_blocks]) * args.block
    batches = await make_sft_rows(cfg, steps) if groups else []
    if batches:
        out["sft_rows"] = {
            "steps": len(batches), "rows": sum(len(b) for b in batches),
            "trained_tokens": [sum(sum(t.loss_mask[1:]) for t in b) for b in batches],
            "tokens": [sum(len(t.ids) for t in b) for b in batches],
        }  # fmt: skip
    rl = [{"name": "RL LoRA float32", "part": RL, "warmup": 0, "blocks": args.rl_blocks,
           "memory_gb": 9}]  # fmt: skip
    order = groups + (rl if RL in args.part else [])
    if TOOLS in args.part:  # the policy first (made once, outside every clock)
        policy = await asyncio.to_thread(peers_smollm2_tools.tools_policy, args.threads)
        order.append(peers_smollm2_tools.tools_group(args))
        out["tools_policy"] = str(policy)
    with tempfile.TemporaryDirectory(prefix="tirl-peers-smollm2-") as tmp:
        for group in order:
            started = time.perf_counter()
            load = os.getloadavg()[0]
            if group["part"] == SFT:
                makers = sft_makers(group, args, cfg, Path(tmp), batches)
            elif group["name"] == peers_smollm2_tools.TOOLS_GROUP:
                makers = peers_smollm2_tools.tools_makers(args, policy, Path(tmp))
            else:
                makers = await rl_makers(args, cfg, out, Path(tmp))
            result = await run_group(group, makers, args.block, restart=group["part"] == RL)
            result.update(group=group, load_before=load, load_after=os.getloadavg()[0],
                          wall_s=time.perf_counter() - started)  # fmt: skip
            result["summary"] = {
                name: summarize(records, group["part"])
                for name, records in result["blocks"].items()
            }
            if group["part"] == SFT:
                check_same_labels(result)
            out["groups"][group["name"]] = result
    out["load_after"] = os.getloadavg()
    return out


def check_same_labels(result: dict) -> None:
    """tirl and TRL trained on the same number of tokens in every step (the same rows and the
    same loss mask): else the comparison is void."""
    blocks = list(result["blocks"].values())
    if len(blocks) < 2:
        return
    counts = [[s["trained_tokens"] for b in rs for s in b["steps"]] for rs in blocks]
    if counts[0] != counts[1]:
        raise SystemExit(f"peers: tirl and TRL trained different token counts: {counts}")


# ---------------------------------------------------------------------- printing
def sft_table(out: dict) -> str:
    rows = []
    fp32: dict[str, float] = {}
    for gname, g in out["groups"].items():
        if g["group"]["part"] != SFT:
            continue
        s = g["summary"]
        tirl = s.get(f"tirl {gname}")
        trl = s.get(f"TRL {gname}")
        for name, m in s.items():
            who = "tirl" if name.startswith("tirl") else "TRL"
            key = f"{who} {'LoRA' if g['group']['lora'] else 'full'}"
            tok_s = m["trained_tokens_per_s"]
            if g["group"]["dtype"] == "float32":
                fp32[key] = tok_s
                vs_fp32 = "-"
            else:
                vs_fp32 = f"{tok_s / fp32[key]:.3f}x" if key in fp32 else "-"
            ratio = (f"{tirl['trained_tokens_per_s'] / trl['trained_tokens_per_s']:.2f}x"
                     if tirl and trl and who == "tirl" else "")  # fmt: skip
            rows.append((
                name, f"{m['step_s']:.1f}", f"{tok_s:.1f}", f"{m['cells_per_s']:.0f}",
                f"{m['trained_tokens']:.0f} / {m['cells']:.0f}", f"{m['peak_rss_gb']:.2f}",
                ratio, vs_fp32, f"{m['blocks']} x {m['steps'] // m['blocks']}",
                f"{min(g['loads']):.1f}-{max(g['loads']):.1f}",
            ))  # fmt: skip
    head = ("contender", "s/step", "trained tok/s", "padded tok/s", "trained / padded tokens",
            "peak RSS GB", "tirl/TRL tok/s", "vs float32", "blocks x steps", "load")  # fmt: skip
    return peers.table(head, rows)


def rl_table(out: dict) -> str:
    rows = []
    for g in out["groups"].values():
        if g["group"]["part"] != RL:
            continue
        s = g["summary"]
        trl = s.get(g["group"].get("baseline", "TRL GRPOTrainer text-only"))
        for name, m in s.items():
            ratio = f"{trl['step_s'] / m['step_s']:.2f}x" if trl else "-"
            rows.append((
                f"{name} ({g['group']['name']})", f"{m['step_s']:.1f}",
                f"{m.get('sample_s', 0):.1f}",
                f"{g['info'][name].get('prompt_tokens', '-')}",
                f"{m.get('sampled_tokens', 0):.0f}", f"{m.get('tool_calls', 0):.0f}",
                f"{m.get('correct', 0):.0f}", f"{m.get('update_s', 0):.1f}",
                f"{m.get('real_tokens', 0):.0f} / {m.get('computed_tokens', 0):.0f}",
                f"{m['trained_rows']:.2f}" if "trained_rows" in m else "1.00",
                f"{m['peak_rss_gb']:.2f}", ratio,
                f"{m['blocks']} x {m['steps'] // m['blocks']}",
                f"{min(g['loads']):.1f}-{max(g['loads']):.1f}",
            ))  # fmt: skip
    head = ("contender", "s/step", "sampling s", "prompt tokens", "sampled tokens/step",
            "tool calls/step", "correct/step", "update s", "update tokens (real / computed)",
            "rows trained", "peak RSS GB", "speed vs TRL (TRL s / s)", "blocks x steps",
            "load")  # fmt: skip
    return peers.table(head, rows)


def main(args) -> None:
    if args.block < 1 or min(args.blocks, args.rl_blocks, args.bf16_blocks) < 1:
        raise SystemExit("peers: --block, --blocks, --rl-blocks and --bf16-blocks must be >= 1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    start = time.perf_counter()
    try:
        out = asyncio.run(run(args))
    except peers.TrlFailed as exc:
        raise SystemExit(f"peers: {exc}") from None
    if args.out:  # first: a table that fails to print loses nothing
        Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    versions = {}
    for g in out["groups"].values():
        for info in g["info"].values():
            versions.update(info.get("versions", {}))
    if any(g["group"]["part"] == SFT for g in out["groups"].values()):
        print("\nSFT, 8 rows a step (trained tok/s: the loss's tokens; padded tok/s: every"
              " position computed), TRL's bfloat16: " + TRL_NOTE[out["trl_bf16"]])  # fmt: skip
        print(sft_table(out))
    if any(g["group"]["part"] == RL for g in out["groups"].values()):
        print("\nRL step, LoRA, float32, 4 prompts x 8 samples; RL LoRA float32: 64 model"
              f" tokens, SmolLM2 as loaded; {peers_smollm2_tools.TOOLS_GROUP}:"
              f" {peers_smollm2_tools.MAX_TOKENS} completion tokens, at most"
              f" {peers_smollm2_tools.TOOL_BUDGET} tool calls, the policy SFT'd on both"
              f" formats ({out.get('tools_policy', '-')})")  # fmt: skip
        if "trl_tools" in out and out["trl_tools"] != "built":
            print(f"TRL GRPOTrainer with tools: not run: {out['trl_tools']}")
        print(rl_table(out))
    print(f"\nload {out['load_before'][0]:.2f} before, {out['load_after'][0]:.2f} after;"
          f" {time.perf_counter() - start:.0f} s in all; torch threads {args.threads} per"
          f" process. {', '.join(f'{k} {v}' for k, v in versions.items())}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(json.loads(sys.argv[2]))
    else:
        raise SystemExit("run it as: python bench/peers.py --model smollm2-135m-instruct")
