"""tirl's RL step against TRL's GRPOTrainer, and tirl with the interpreter against text-only.

    python bench/peers.py [--quick] [--blocks 4] [--block 4] [--threads 1] [--model PATH]
                          [--mixed-groups] [--out FILE] [--profile N] [--no-trl] [--no-tools]
                          [--no-before]
    python bench/peers.py --model smollm2-135m-instruct [--part sft,rl,tools] [--blocks 3] ...

`--model smollm2-135m-instruct` is the SmolLM2 mode (issue 42, `bench/peers_smollm2.py`):
SFT tokens/s (full and LoRA, float32 and bfloat16) and the RL step against TRL on the real
model, each contender in a process of its own; `--part tools` is the RL step with tools
against TRL's own tool calling (issue 47, `bench/peers_smollm2_tools.py`). Everything below
is the tiny-model mode.

Contenders train the same policy on the same tasks, a block of RL steps at a time, their
blocks interleaved (the order rotates every round) so that all see the same load on a shared
machine:
- `TRL GRPOTrainer`: TRL's trainer, text-only (its tool calling needs a chat model), in a
  process of its own in TRL's venv (`bench/peers_trl.py`);
- `tirl text-only`: `tirl.train.rl.RLTrainer` as `tirl train` builds it (the pipeline's
  engine, rollout and trainer), without the interpreter, with the fast paths of issues 30 and
  47: the sampler's log-probs as the old ones (`rl.old_logprobs: auto`), passes planned by a
  token budget over length-sorted rows (`rl.micro_batch_tokens`), the next step sampled
  while this one updates (`rl.one_step_off_policy`), rows without an advantage left out of
  the update (`rl.skip_zero_advantage`) and the engine's steps on one torch thread
  (`rollout.engine_options: {threads: 1}`);
- `tirl with tools`: the same, with the sandbox on (tirl's quickstart: code blocks run as they
  close, tool budget 2);
- `tirl text-only (every row)`: this round's settings, but every row through the update (no
  `rl.skip_zero_advantage`): the same work as TRL's update, whatever the groups scored;
- `... (before)`: both tirl contenders with the settings of the previous round (issue 17:
  old log-probs scored in passes of 32 rows, one pass per minibatch, on-policy, every row
  through the update), in the same run (`--no-before` leaves these three out).

Matched for all (printed side by side): the policy (tirl's tiny Qwen2, loaded by path from one
`save_pretrained` folder), the tasks (tirl's arithmetic source, the same prompts in the same
order, tokenized to the same ids), 8 prompts x 8 samples per step, 64 model tokens,
temperature 1 (no top-p / top-k), 2 optimizer updates per step over minibatches of 32 rows, no
KL (no reference model), clip 0.2 / 0.28, token-mean loss, float32, no vLLM, the same torch
thread count per process. Rewards are tirl's (+1 / -1 by the task's scorer) in both trainers.
The one-step-off-policy update runs in a thread of its own beside the sampler: with
`--threads 1` tirl then computes on two threads where TRL computes on one; with `--threads 2`
every contender may use both cores (tirl's two threads share them, `tirl.cpu.sharing_cores`).

The policy is the quickstart's model after a short SFT on code demonstrations (so that it
ends its answers and calls the interpreter), made once and kept in
`~/.cache/tirl/peers-policy-<hash>` (about 90 s on 2 cores); `--model` uses a saved tirl
policy instead (e.g. a quickstart run's `runs/quickstart/code/sft`). That policy solves none
of the quickstart's items, so every group scores alike and tirl's update has no row to train
on; `--mixed-groups` makes the groups mixed: one-digit operands, and a policy SFT'd on code
and text answers alike, which gets some items right.

Reported per contender: seconds per RL step (each block's wall time, its last update waited
for, over its steps; the median over the measured blocks, after one warm-up block), sampled
tokens/s, and where a step goes (medians of each column on its own): sampling (tirl: with the
tool calls), scoring (old log-probs and rewards), update (the optimizer steps; with the
overlap it runs while the next step samples, so the columns add up to more than a step).
`pad share` is the share of the token positions tirl's passes computed that were padding;
`rows trained` the median share of rows tirl's update ran (`rl.skip_zero_advantage` leaves out
those without an advantage: groups that scored alike).
TRL lives in its own venv so that it cannot change the main environment's torch or
transformers; without it, the TRL column is left out with a one-line hint saying how to get
it. `--profile N` lists the torch ops tirl's steps spend most time in, over every thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRL_VERSION = "1.16.0"  # the newest TRL, and it runs on the main environment's transformers 5.24
TRL_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tirl" / "trl-venv"
TRL_HINT = (
    f"TRL not found in {TRL_VENV}: python bench/peers.py --make-trl-venv   (a venv layered on"
    f" this environment, as the tests make theirs, with trl=={TRL_VERSION}; then run this again)"
)
TRL_SCRIPT = Path(__file__).with_name("peers_trl.py")

# The quickstart preset's code SFT, shortened: every demonstration calls the interpreter, so a
# short run already ends its answers and writes code (tool calls ~1 per trajectory).
POLICY_SFT = [
    "variants=[code]", "sft.steps=150", "sft.examples=1000", "sft.code_share=1.0",
    "sft.lr=0.002", "sft.batch_size=32", "rl.steps=0",
]  # fmt: skip
# The RL step being compared: the quickstart's, with an update's minibatch of 32 rows.
RL_STEP = ["sft.steps=0", "rl.warmup_steps=0"]
# `--mixed-groups`: tasks and a policy whose groups score mixed, so that the update has rows to
# train on (the default policy solves none of the quickstart's 3-digit items: every group
# scores alike and `rl.skip_zero_advantage` leaves the whole update out). One-digit operands,
# and a policy SFT'd on code and text answers alike: it answers some items right and some
# wrong, with the interpreter and without.
MIXED_TASKS = ["data.train=[{source: arithmetic, digits: 1}]"]
MIXED_SFT = [*MIXED_TASKS, "sft.code_share=0.5"]
# The previous round's settings (issue 17): old log-probs scored in passes of 32 rows as TRL
# does, one forward-backward pass per minibatch, on-policy, every row through the update.
BEFORE = ["rl.old_logprobs=trainer", "rl.micro_batch_size=32", "rl.skip_zero_advantage=false"]
# This round's: no scoring pass, passes of at most 1,024 padded tokens over length-sorted rows,
# the next step sampled during the update, rows without an advantage left out of it, and the
# engine's decode steps on one torch thread (this tiny model's are too small to gain from two:
# 0.27-0.29 s of sampling a step against 0.38-0.45 s, docs/benchmarks/history.md).
FAST = [
    "rl.old_logprobs=auto", "rl.micro_batch_tokens=1024", "rl.one_step_off_policy=true",
    "rl.skip_zero_advantage=true", "rollout.engine_options={threads: 1}",
]  # fmt: skip

TRL, TEXT, TOOLS = "TRL GRPOTrainer", "tirl text-only", "tirl with tools"
TEXT_BEFORE, TOOLS_BEFORE = f"{TEXT} (before)", f"{TOOLS} (before)"
# This round's settings but every row through the update: the same work as TRL's update.
EVERY_ROW = [*FAST, "rl.skip_zero_advantage=false"]  # the later setting wins
TEXT_EVERY_ROW = f"{TEXT} (every row)"


# ---------------------------------------------------------------------- the policy
def run_config(overrides: list[str]):
    from tirl.cli import preset_path
    from tirl.config import load_config
    from tirl.run.config import RunConfig

    return load_config(RunConfig, preset_path("quickstart"), overrides)


def cached_policy(threads: int, extra: list[str]) -> Path:
    """The SFT'd policy all contenders start from (`POLICY_SFT` with the `extra` overrides):
    made once, then read from the cache."""
    import tirl

    settings = [*POLICY_SFT, *extra]
    # without extras, the key of the policy made before they existed (still in caches)
    key = json.dumps([POLICY_SFT, getattr(tirl, "__version__", ""), *([extra] if extra else [])])
    key = key.encode()
    folder = TRL_VENV.parent / f"peers-policy-{hashlib.sha256(key).hexdigest()[:10]}"
    policy = folder / "code" / "sft"
    if (policy / "config.json").is_file():
        return policy
    print(f"making the policy once (short code SFT, ~90 s) into {folder}", flush=True)
    from tirl.sandbox import Sandbox
    from tirl.train.pipeline import Pipeline, quiet_transformers

    cfg = run_config([*settings, f"threads={threads}"])
    quiet_transformers(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    pipeline = Pipeline(cfg, folder, evaluation=None)
    pipeline.prepare()

    async def sft() -> None:
        async with Sandbox(cfg.sandbox.limits(), preload=tuple(cfg.sandbox.preload)) as sandbox:
            await pipeline.train_sft("code", pipeline.make_model(), sandbox, use_tools=True)

    asyncio.run(sft())
    pipeline.logger.close()
    return policy


# ---------------------------------------------------------------------- tirl's side
class TirlSide:
    """tirl's RLTrainer as `tirl train` builds it (`Pipeline.rl`), stepped one step at a time,
    with clocks around scoring."""

    def __init__(self, cfg, sandbox, use_tools: bool, run_dir: Path) -> None:
        import tirl.train.rl as rl
        from tirl.run.build import engine_capabilities, rl_settings
        from tirl.train.feed import RolloutFeed
        from tirl.train.pipeline import Pipeline

        self.clock = StepClock()
        clock = self.clock
        pipeline = Pipeline(cfg, run_dir, evaluation=None)
        pipeline.prepare()
        model = pipeline.make_model()
        self.pipeline = pipeline
        self.rollout = pipeline.rollout_for(
            "code" if use_tools else "text", model, sandbox, use_tools
        )
        first = cfg.sft.examples

        feed = RolloutFeed(  # what Pipeline.rl builds
            self.rollout,
            lambda i: pipeline.mixture.item("train", first + i),
            cfg.rl,
            prompt_of=pipeline.prompt_ids,
            seed=cfg.seed,
        )
        self.trainer = rl.RLTrainer(
            model,
            feed,
            settings=rl_settings(cfg, use_tools),
            pad_id=pipeline.tokenizer.pad_token_id,
            logger=None,
            variant="code" if use_tools else "text",
            capabilities=engine_capabilities(cfg),
        )
        score = self.trainer.feed.score

        def timed_score(trajs, *args, **kwargs):  # scoring time and what was scored
            start = time.perf_counter()
            score(trajs, *args, **kwargs)
            clock.add("reward_s", time.perf_counter() - start)
            clock.add("sampled_tokens", sum(t.num_model_tokens for t in trajs))
            clock.add("tool_tokens", sum(t.num_tool_tokens for t in trajs))
            clock.add("tool_calls", sum(len(t.tool_calls) for t in trajs))
            clock.add("correct", sum(bool(t.score and t.score.correct) for t in trajs))
            clock.add("tool_s", sum(c.duration_s for t in trajs for c in t.tool_calls))

        self.trainer.feed.score = timed_score
        self.open: list[tuple[dict, dict]] = []  # records whose update may still run

    async def step(self, ops: OpTimes | None = None) -> dict:
        self.clock.reset()
        decode_steps = getattr(self.rollout.engine, "steps", 0)
        if ops is None:
            metrics = await self.trainer.step()
        else:
            with ops.recording():
                metrics = await self.trainer.step()
        c = self.clock.counts
        logprob_s = c.get("logprob_s", 0.0)
        record = {
            "step_s": metrics["time/step_s"],
            "sample_s": metrics["time/rollout_s"] - c.get("reward_s", 0.0),
            "score_s": logprob_s + c.get("reward_s", 0.0),
            "sampled_tokens": c.get("sampled_tokens", 0),
            "tool_tokens": c.get("tool_tokens", 0),
            "tool_calls": c.get("tool_calls", 0),
            "tool_s": c.get("tool_s", 0.0),
            "correct": c.get("correct", 0),
            "computed_tokens": c.get("computed", 0),
            "real_tokens": c.get("real", 0),
            "engine_steps": getattr(self.rollout.engine, "steps", 0) - decode_steps,
            "updated": metrics["train/updated"],
        }
        self.open.append((record, metrics))
        return record

    async def drain(self) -> float:
        """Wait for a running update (one step off-policy); its seconds. The records of the
        block get their update times, which the trainer knows once the updates are done."""
        start = time.perf_counter()
        await self.trainer.finish_updates()
        for record, metrics in self.open:
            record["update_s"] = metrics.get("time/update_s", 0.0)
            record["staleness"] = metrics.get("rl/staleness_mean", 0.0)
            record["trained_rows"] = metrics.get("actor/trained_row_share", 1.0)
        self.open = []
        return time.perf_counter() - start

    async def close(self) -> None:
        from tirl.backends.engine import close_engine

        await self.drain()
        await close_engine(self.rollout.engine)
        self.pipeline.logger.close()


class StepClock:
    """Sums of what one step spent, filled by the timed trainer and the wrappers below."""

    current: StepClock | None = None  # the side whose step is running

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}

    def reset(self) -> None:
        self.counts = {}
        StepClock.current = self

    def add(self, key: str, value: float) -> None:
        self.counts[key] = self.counts.get(key, 0) + value


class OpTimes:
    """Self CPU time per torch op, summed over the steps recorded (torch.profiler sees the
    sampler's thread too, which a Python profiler of the event loop's thread would not)."""

    def __init__(self) -> None:
        self.self_us: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.wall_s = 0.0

    @contextlib.contextmanager
    def recording(self):
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile

        every_thread = _ExperimentalConfig(profile_all_threads=True)
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], experimental_config=every_thread) as prof:
            yield
        self.wall_s += time.perf_counter() - start
        for event in prof.key_averages():
            self.self_us[event.key] = self.self_us.get(event.key, 0.0) + event.self_cpu_time_total
            self.calls[event.key] = self.calls.get(event.key, 0) + event.count

    def table(self, top: int, steps: int) -> str:
        ranked = sorted(self.self_us.items(), key=lambda kv: -kv[1])
        total_s = sum(self.self_us.values()) / 1e6
        rows = [
            (key, f"{us / 1e6 / steps:.3f}", f"{self.calls[key] / steps:.0f}")
            for key, us in ranked[:top]
        ]
        rows.append(("(all torch ops)", f"{total_s / steps:.3f}", ""))
        rows.append(("(step wall time, profiled)", f"{self.wall_s / steps:.3f}", ""))
        return table(("op", "s/step", "calls/step"), rows)


def instrument_tirl() -> None:
    """Clock tirl's scoring pass (old log-probs, `tirl.train.update.batch_logprobs`) as the
    learner (`tirl.train.learner`) calls it, and count the token positions every pass computes
    (`TokenBatch.trimmed`: each pass is cut to its longest row) against the real ones. The
    counts of an overlapped update land in the step that was sampling meanwhile."""
    import tirl.train.learner as learner
    from tirl.train.batch import TokenBatch

    inner = learner.batch_logprobs

    def timed(*args, **kwargs):
        clock = StepClock.current
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        if clock is not None:
            clock.add("logprob_s", time.perf_counter() - start)
        return out

    learner.batch_logprobs = timed
    trimmed = TokenBatch.trimmed

    def counted(batch):
        cut = trimmed(batch)
        clock = StepClock.current
        if clock is not None:
            clock.add("computed", cut.input_ids.numel())
            clock.add("real", int(cut.attention_mask.sum()))
        return cut

    TokenBatch.trimmed = counted


# ---------------------------------------------------------------------- TRL's side
class TrlFailed(RuntimeError):
    """The TRL side stopped; its log says why."""


class TrlMissing(TrlFailed):
    """TRL is not importable in its venv."""


class TrlRefused(TrlFailed):
    """The contender could not be built; it said why in a `failed` record."""


class SideProcess:
    """A contender in a process of its own, stepped by `go` lines: it prints `PEERS {json}`
    records (`built`, `ready`, then one `step` per `go`; `failed` or `missing` instead)."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"},
        )  # fmt: skip
        self.info = self.read("built")
        self.info.update(self.read("ready"))

    def read(self, event: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith("PEERS "):
                record = json.loads(line[len("PEERS ") :])
                if record["event"] == "failed":
                    self.info = record
                    raise TrlRefused(record["error"])
                if record["event"] == "missing":
                    raise TrlMissing(record["error"])
                if record["event"] == event:
                    return record
        tail = self.log_path.read_text().strip().splitlines()[-1:] or ["no output"]
        raise TrlFailed(f"a contender stopped (its log: {self.log_path}): {tail[0]}")

    async def step(self, ops: None = None) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return await asyncio.to_thread(self.read, "step")

    async def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class TrlSide(SideProcess):
    """TRL's GRPOTrainer in its venv (`bench/peers_trl.py`), one RL step per `step()`."""

    def __init__(self, spec: dict, log_path: Path) -> None:
        command = [str(TRL_VENV / "bin" / "python"), str(TRL_SCRIPT), json.dumps(spec)]
        super().__init__(command, log_path)

    async def step(self, ops: None = None) -> dict:
        r = await super().step()
        return {
            "step_s": r["step_s"],
            "sample_s": r["generate_s"],
            "score_s": r["generate_and_score_s"] - r["generate_s"],
            "update_s": r["step_s"] - r["generate_and_score_s"],
            "sampled_tokens": r["sampled_tokens"],
        }


def start_trl(spec: dict, log_path: Path) -> TrlSide | None:
    """The TRL side, or None with a one-line note saying why it is left out."""
    if not (TRL_VENV / "bin" / "python").is_file():
        print(TRL_HINT, flush=True)
        return None
    try:
        return TrlSide(spec, log_path)
    except TrlMissing:
        print(TRL_HINT, flush=True)
    except TrlFailed as exc:
        print(f"TRL left out: {exc}", flush=True)
    return None


def trl_spec(cfg, policy: Path, prompt_ids: list[int], total_steps: int) -> dict:
    """What the TRL side needs to train exactly tirl's step (see peers_trl.py)."""
    from tirl.tasks.prompts import PLAIN_TEMPLATE

    rl = cfg.rl
    return {
        "model": str(policy), "threads": cfg.threads, "seed": cfg.seed,
        "train_sources": [dict(e) for e in cfg.data.train], "first_task": cfg.sft.examples,
        "template": PLAIN_TEMPLATE, "first_prompt_ids": prompt_ids,
        "prompts_per_step": rl.prompts_per_step, "group_size": rl.group_size,
        "updates_per_step": rl.updates_per_step, "max_model_tokens": rl.max_model_tokens,
        "temperature": rl.temperature, "lr": rl.lr, "max_grad_norm": rl.max_grad_norm,
        "clip_low": rl.clip_low, "clip_high": rl.clip_high, "total_steps": total_steps,
        "reward_config": {"reward": rl.reward},
    }  # fmt: skip


# ---------------------------------------------------------------------- the run
def rl_step(args) -> list[str]:
    return [*RL_STEP, *(MIXED_TASKS if args.mixed_groups else [])]


async def run(args, policy: Path) -> dict:
    import torch

    from tirl.sandbox import Sandbox
    from tirl.train.pipeline import quiet_transformers

    base = [*rl_step(args), f"model.name_or_path={policy}", f"threads={args.threads}"]
    cfg = run_config([*base, *FAST])
    quiet_transformers(cfg)
    instrument_tirl()
    total = args.blocks + 1  # one warm-up block
    load_before = os.getloadavg()
    sides: dict = {}
    out = {"load_before": load_before, "policy": str(policy), "threads": args.threads,
           "mixed_groups": args.mixed_groups}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tirl-peers-") as tmp:
        async with Sandbox(cfg.sandbox.limits(), preload=tuple(cfg.sandbox.preload)) as sandbox:
            contenders = [(TEXT, False, FAST), (TOOLS, True, FAST)]
            if not args.no_before:
                contenders += [
                    (TEXT_EVERY_ROW, False, EVERY_ROW),
                    (TEXT_BEFORE, False, BEFORE),
                    (TOOLS_BEFORE, True, BEFORE),
                ]
            for name, tools, settings in contenders:
                if tools and args.no_tools:
                    continue
                side_cfg = run_config([*base, *settings])
                sides[name] = TirlSide(side_cfg, sandbox, tools, Path(tmp) / f"side{len(sides)}")
            if not args.no_trl:
                task0 = sides[TEXT].pipeline.mixture.item("train", cfg.sft.examples)
                spec = trl_spec(
                    cfg, policy, sides[TEXT].pipeline.prompt_ids(task0), total * args.block
                )
                trl = start_trl(spec, TRL_VENV.parent / "peers-trl.log")
                if trl is not None:
                    sides[TRL] = trl
                    out["trl"] = trl.info
            engine = sides[TEXT].rollout.engine
            out["tirl_sampler"] = f"{type(engine).__name__}, kv_cache " + str(
                getattr(engine, "kv_cache", "padded")
            )
            names = list(sides)
            profiles = {n: OpTimes() for n in (TEXT, TOOLS) if args.profile and n in sides}
            blocks: dict[str, list[dict]] = {name: [] for name in names}
            try:
                for k in range(total):
                    order = names[k % len(names) :] + names[: k % len(names)]
                    for name in order:
                        block = await run_block(
                            sides[name], args.block, profiles.get(name) if k else None
                        )
                        blocks[name].append(block)
                        print(f"block {k}{' (warm-up)' if k == 0 else ''} {name}:"
                              f" {block['step_s']:.2f} s/step", flush=True)  # fmt: skip
            finally:
                for side in sides.values():
                    await side.close()
    out.update(load_after=os.getloadavg(), torch_threads=torch.get_num_threads(), blocks=blocks)
    out["summary"] = {name: summarize(records[1:]) for name, records in blocks.items()}
    for name, ops in profiles.items():
        out.setdefault("profiles", {})[name] = ops.table(args.profile, args.blocks * args.block)
    return out


async def run_block(side, steps: int, ops: OpTimes | None) -> dict:
    """`steps` consecutive steps of one contender, then its running update waited for (so the
    next contender's block does not share the machine with it): the block's seconds per
    step, and its steps' records."""
    start = time.perf_counter()
    records = [await side.step(ops) for _ in range(steps)]
    drain = getattr(side, "drain", None)
    if drain is not None:
        await drain()
    return {"step_s": (time.perf_counter() - start) / steps, "steps": records}


def summarize(blocks: list[dict]) -> dict:
    """Seconds per step: the median over blocks; every other column: the median over all the
    blocks' steps of that column on its own."""
    records = [r for block in blocks for r in block["steps"]]
    keys = [k for k in records[0] if k != "updated"]
    med = {k: statistics.median(r[k] for r in records) for k in keys}
    med["step_s"] = statistics.median(block["step_s"] for block in blocks)
    med["tokens_per_s"] = statistics.median(r["sampled_tokens"] for r in records) / med["step_s"]
    med["sample_tokens_per_s"] = statistics.median(
        r["sampled_tokens"] / r["sample_s"] for r in records
    )
    if "computed_tokens" in records[0]:
        computed = sum(r["computed_tokens"] for r in records)
        med["padded_share"] = 1 - sum(r["real_tokens"] for r in records) / max(1, computed)
    med["steps"] = len(records)
    return med


# ---------------------------------------------------------------------- printing
def config_table(cfg, trl: dict | None, threads: int, sampler: str) -> str:
    """tirl's settings beside the ones TRL reported it trained with."""
    rl = cfg.rl
    a = (trl or {}).get("args", {})

    def trl_value(*keys: str, fmt: str = "{}") -> str:
        return fmt.format(*(a[k] for k in keys)) if all(k in a for k in keys) else "-"

    b = rl.prompts_per_step * rl.group_size
    rows = [
        ("policy", "one save_pretrained folder", "the same folder, by path"),
        ("dtype", cfg.model.dtype, (trl or {}).get("dtype", "-")),
        ("prompts x samples per step", f"{rl.prompts_per_step} x {rl.group_size}",
         trl_value("generation_batch_size", "num_generations", fmt="{0} rows, {1} per prompt")),
        ("model tokens", rl.max_model_tokens, trl_value("max_completion_length")),
        ("temperature / top-p / top-k", f"{rl.temperature} / 1 / off",
         trl_value("temperature", "top_p", "top_k", fmt="{} / {} / {}")),
        ("optimizer updates per step", rl.updates_per_step,
         trl_value("steps_per_generation", "num_iterations",
                   fmt="{} (steps_per_generation; num_iterations {})")),
        ("rows per forward-backward pass", f"{b // rl.updates_per_step} (minibatch) in passes"
         f" of <= {rl.micro_batch_tokens} padded tokens, length-sorted (before: one pass)",
         trl_value("per_device_train_batch_size", "gradient_accumulation_steps",
                   fmt="{} (gradient_accumulation_steps {})")),
        ("old log-probs", "the sampler's (rl.old_logprobs auto; before: scored in passes of 32)",
         trl_value("per_device_train_batch_size", fmt="scored in passes of {}")),
        ("loss", f"{rl.policy_loss} {rl.clip_low} / {rl.clip_high}, {rl.loss_agg}",
         trl_value("loss_type", "epsilon", "epsilon_high", fmt="{} {} / {}")),
        ("KL", f"kl_coef {rl.kl_coef}, no reference", trl_value("beta", fmt="beta {}")),
        ("reward", f"{rl.reward}, task scorer", "tirl's, same scorer"),
        ("sampler", f"{sampler}, continuous batching",
         trl_value("use_vllm", fmt="model.generate (use_vllm {})")),
        ("gradient checkpointing", cfg.model.gradient_checkpointing,
         trl_value("gradient_checkpointing")),
        ("optimizer", "AdamW (torch)", trl_value("optim")),
        ("torch threads", f"{threads}; the update overlaps sampling in a second thread, the"
         f" engine's steps on {cfg.rollout.engine_options.get('threads') or threads}"
         f" (before: on-policy, one thread, the engine's steps on {threads})",
         (trl or {}).get("threads", "-")),
    ]  # fmt: skip
    return table(("setting", "tirl", "TRL"), rows)


def result_table(summary: dict) -> str:
    """One row per contender: medians, and the speed-up over TRL's step time."""
    base = summary.get(TRL)
    rows = []
    for name, s in summary.items():
        speedup = f"{base['step_s'] / s['step_s']:.2f}x" if base else "-"
        pad = f"{s['padded_share']:.2f}" if "padded_share" in s else "-"
        update = f"{s['update_s']:.2f}" if "update_s" in s else "-"
        trained = f"{s['trained_rows']:.2f}" if "trained_rows" in s else "-"
        rows.append((
            name, f"{s['step_s']:.2f}", f"{s['tokens_per_s']:.0f}",
            f"{s['sample_tokens_per_s']:.0f}", f"{s['sampled_tokens']:.0f}",
            f"{s['sample_s']:.2f}", f"{s['score_s']:.2f}", update, trained,
            f"{s.get('tool_calls', 0):.0f}", pad, speedup,
        ))  # fmt: skip
    head = ("contender", "s/step", "sampled tok/s", "tok/s while sampling", "tokens/step",
            "sampling s", "scoring s", "update s", "rows trained", "tool calls", "pad share",
            "vs TRL")  # fmt: skip
    return table(head, rows)


def table(head: tuple, rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def make_trl_venv() -> None:
    """TRL's venv, layered on this environment as the tests' side venvs are
    (`tests/side_venv.py`): it shares torch and transformers, and pip adds only TRL's own
    dependencies. `python -m venv --system-site-packages` run from inside a venv would see the
    base interpreter instead, and pip would fetch a torch of its own."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from side_venv import layered_venv

    python = layered_venv(TRL_VENV)
    subprocess.run([str(python), "-m", "pip", "install", f"trl=={TRL_VERSION}"], check=True)
    print(f"TRL {TRL_VERSION} in {TRL_VENV}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--blocks", type=int, help="measured blocks (after 1 warm-up); default 4 (SmolLM2: 3)"
    )
    parser.add_argument("--block", type=int, help="steps per block; default 4 (SmolLM2: 1)")
    parser.add_argument("--quick", action="store_true", help="2 measured blocks of 3 steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every contender")
    parser.add_argument(
        "--model",
        help="a saved tirl policy (default: the cached short SFT), or smollm2-135m-instruct:"
        " the SmolLM2 mode (bench/peers_smollm2.py)",
    )
    smollm2 = parser.add_argument_group("SmolLM2 mode (--model smollm2-135m-instruct)")
    smollm2.add_argument(
        "--part",
        default="sft,rl",
        help="sft, rl, tools (with tools against TRL's own tool calling,"
        " bench/peers_smollm2_tools.py) or a list (default sft,rl: one run)",
    )
    smollm2.add_argument("--rl-blocks", type=int, default=2, help="RL blocks (no warm-up)")
    smollm2.add_argument(
        "--bf16-blocks", type=int, default=1, help="bfloat16 SFT blocks (no warm-up)"
    )
    smollm2.add_argument(
        "--dtypes", default="float32,bfloat16", help="SFT dtypes (default float32,bfloat16)"
    )
    smollm2.add_argument(
        "--trl-bf16", choices=("autocast", "weights"), default="autocast",
        help="TRL's bfloat16: bf16=True around float32 weights (its default), or bf16 weights",
    )  # fmt: skip
    parser.add_argument(
        "--mixed-groups", action="store_true",
        help="one-digit items and a policy SFT'd on code and text alike, whose groups score"
        " mixed (by default every group scores alike and the update has no row to train on)",
    )  # fmt: skip
    parser.add_argument("--no-trl", action="store_true", help="tirl only")
    parser.add_argument("--no-tools", action="store_true", help="leave out tirl with tools")
    parser.add_argument(
        "--no-before",
        action="store_true",
        help="leave out the every-row contender and the previous round's settings",
    )
    parser.add_argument(
        "--make-trl-venv", action="store_true", help=f"make {TRL_VENV} with trl and stop"
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="print the N torch ops tirl's measured steps spent most time in, every thread"
        " (torch.profiler; it slows the steps, so take the timings from a run without it)",
    )  # fmt: skip
    parser.add_argument("--out", help="write every step's record as JSON here")
    args = parser.parse_args()
    if args.make_trl_venv:
        return make_trl_venv()
    if args.model == "smollm2-135m-instruct":
        import peers_smollm2

        args.blocks = 3 if args.blocks is None else args.blocks
        args.block = 1 if args.block is None else args.block
        args.part = {p.strip() for p in args.part.split(",")}
        if not args.part or args.part - {"sft", "rl", "tools"}:
            parser.error(f"--part {','.join(sorted(args.part))}: sft, rl, tools or a list")
        args.dtypes = [d.strip() for d in args.dtypes.split(",")]
        if not args.dtypes or set(args.dtypes) - {"float32", "bfloat16"}:
            parser.error(f"--dtypes {','.join(args.dtypes)}: float32, bfloat16 or both")
        return peers_smollm2.main(args)
    args.blocks = 4 if args.blocks is None else args.blocks
    args.block = 4 if args.block is None else args.block
    if args.quick:
        args.blocks, args.block = 2, 3
    if min(args.blocks, args.block, args.threads) < 1:
        parser.error("--blocks, --block and --threads must be >= 1")
    if args.model and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no saved policy there (config.json missing)")
    os.environ.setdefault("TQDM_DISABLE", "1")
    start = time.perf_counter()
    policy = (
        Path(args.model)
        if args.model
        else cached_policy(args.threads, MIXED_SFT if args.mixed_groups else [])
    )
    try:
        out = asyncio.run(run(args, policy))
    except TrlFailed as exc:  # stopped mid-run
        raise SystemExit(f"peers: {exc}") from None
    cfg = run_config([*rl_step(args), *FAST, f"model.name_or_path={out['policy']}"])
    print()
    print(config_table(cfg, out.get("trl"), args.threads, out["tirl_sampler"]))
    print()
    print(result_table(out["summary"]))
    trl = out.get("trl", {})
    versions = ", ".join(f"{k} {v}" for k, v in trl.get("versions", {}).items())
    print(f"\nmedians of {args.blocks} blocks of {args.block} steps after 1 warm-up block,"
          " order rotated every round;"
          f" load {out['load_before'][0]:.2f} before, {out['load_after'][0]:.2f} after;"
          f" {time.perf_counter() - start:.0f} s in all. {versions}")  # fmt: skip
    for name, text in out.get("profiles", {}).items():
        print(f"\ntorch ops of {name} (self CPU time per step, all threads):\n{text}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
