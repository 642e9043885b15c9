"""Run the synthesis stages over a dataset, resumably.

Each stage appends one JSON line per item to `OUT/stages/NN_<stage>.jsonl` as soon as the item
is done: `{"id", "kept", "reason", "notes", "item"}`. A stage's input is the kept items of the
stage before (the `read` stage turns the input file into items). On restart every stage skips
the ids already in its file, so nothing is processed twice and nothing is lost; the teacher's
answers are in the request cache (`OUT/cache/`) before their line is written, so an item cut
off between the two is finished from the cache, without a new request. A torn last line (a
crash or a full disk mid-write) is ignored and that item redone; the stage files and the request
caches are repaired (`tirl.files.repair_jsonl`) before anything is appended to them, so a new
line never lands on a fragment. The output folder is locked while a run works in it
(`tirl.files.lock_folder`): a second run on it is refused in one line naming the first.

When an item fails with an exception (a teacher that keeps refusing, the request budget), the
stage lets the items already in flight finish and be recorded, then re-raises: the run stops,
and `--resume` continues it. `OUT/trajectories.jsonl` (SFT-ready, see `tirl.synth.formats`) and
the report are rewritten from the stage files at the end of every run. Each stage's wall time
and the items it ran are added up in `OUT/stage_times.json`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from tqdm.auto import tqdm

from tirl.config import ConfigError, dump_yaml
from tirl.files import lock_folder, repair_jsonl, replacing, write_text
from tirl.synth.config import STAGE_NAMES, SynthConfig
from tirl.synth.formats import sft_record
from tirl.synth.records import Item, Rejected, read_records
from tirl.synth.stagelog import StageLog, stage_path
from tirl.synth.stages import STAGES, Context, Outcome, keep, reject

StageFn = Callable[[Item, Context], Awaitable[Outcome]]


async def run_stage(
    name: str, fn: StageFn, items: Iterable[Item], ctx: Context, log: StageLog, concurrency: int
) -> int:
    """Run `fn` over the items not yet in `log`; returns how many it ran."""
    todo = [it for it in items if it.id not in log]
    if not todo:
        return 0
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(todo), desc=f"synth: {name}", unit="item", leave=False)

    async def one(item: Item) -> None:
        async with gate:
            outcome = await fn(item, ctx)
        log.append(item.id, outcome)
        bar.update()

    try:
        results = await asyncio.gather(*(one(it) for it in todo), return_exceptions=True)
    finally:
        bar.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return len(todo)


def add_stage_time(out: Path, name: str, seconds: float, items: int) -> None:
    """Add one stage's wall time and the items it ran to `OUT/stage_times.json` (summed over
    the runs of a resumed folder: the time spent on what each run did)."""
    path = out / "stage_times.json"
    times = json.loads(path.read_text()) if path.exists() else {}
    row = times.setdefault(name, {"seconds": 0.0, "items": 0})
    row["seconds"] = round(row["seconds"] + seconds, 3)
    row["items"] += items
    write_text(path, json.dumps(times, indent=2))


def _read_stage(input_path: str, cfg: SynthConfig, log: StageLog) -> dict[str, int]:
    """Record every input record in the read log; returns the input order of all ids."""
    order: dict[str, int] = {}
    for i, rec in enumerate(read_records(input_path, cfg.input)):
        order[rec.id] = i
        if rec.id not in log:
            log.append(rec.id, reject(rec.reason) if isinstance(rec, Rejected) else keep(rec))
    return order


def contamination_index(cfg: SynthConfig):
    from tirl.tasks.benchmark_files import load_benchmark
    from tirl.tasks.contamination import ContaminationIndex

    problems = []
    for name in cfg.decontam.benchmarks:
        try:
            problems += [it.problem for it in load_benchmark(name, cfg.decontam.benchmark_dir)]
        except (ValueError, ImportError) as e:
            raise ConfigError(f"decontam.benchmarks: {name}: {e}") from None
    return ContaminationIndex(problems, cfg.decontam.n)


def check_out_dir(out: Path, resume: bool) -> None:
    started = (out / "stages").is_dir() and any((out / "stages").iterdir())
    if started and not resume:
        raise ConfigError(f"{out} already holds a synth run: pass --resume, or another --out")


async def _run(cfg: SynthConfig, input_path: str, out: Path, max_requests: int | None) -> None:
    from tirl.sandbox.config import make_sandbox
    from tirl.synth.client import ChatClient

    ctx = Context(cfg)
    if cfg.stages.decontaminate:
        ctx.index = contamination_index(cfg)
    for cache in ("teacher.jsonl", "judge.jsonl"):  # appended to by the clients
        repair_jsonl(out / "cache" / cache)
    if cfg.stages.codeify or cfg.stages.self_correct:
        ctx.teacher = ChatClient(cfg.teacher, out / "cache" / "teacher.jsonl", max_requests)
    if cfg.stages.feedback_alignment:
        ctx.judge = ChatClient(cfg.judge_endpoint, out / "cache" / "judge.jsonl", max_requests)
    read_log = StageLog(stage_path(out, 0, "read"))
    order = _read_stage(input_path, cfg, read_log)
    read_log.close()
    items = read_log.kept(order)
    sandbox = make_sandbox(cfg.sandbox) if cfg.stages.execute else None
    try:
        if sandbox is not None:
            await sandbox.start()  # an unreachable sandbox server fails here, before any stage
            ctx.sandbox = sandbox
        for name in cfg.enabled():
            log = StageLog(stage_path(out, STAGE_NAMES.index(name) + 1, name))
            start = time.perf_counter()
            try:
                ran = await run_stage(name, STAGES[name], items, ctx, log, cfg.concurrency)
            finally:
                log.close()
            if ran:
                add_stage_time(out, name, time.perf_counter() - start, ran)
            items = log.kept(order)
    finally:
        for client in (ctx.teacher, ctx.judge):
            if client is not None:
                await client.aclose()
        if sandbox is not None:
            await sandbox.close()


def write_trajectories(out: Path, cfg: SynthConfig) -> int:
    """Rewrite OUT/trajectories.jsonl from the last stage's kept items."""
    read = stage_path(out, 0, "read")
    order = {item_id: i for i, item_id in enumerate(StageLog(read).rows)}
    names = cfg.enabled()
    last = stage_path(out, STAGE_NAMES.index(names[-1]) + 1, names[-1]) if names else read
    items = StageLog(last).kept(order) if last.exists() else []
    with replacing(out / "trajectories.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(sft_record(item, cfg.output_format), ensure_ascii=False) + "\n")
    return len(items)


def run_pipeline(
    cfg: SynthConfig,
    input_path: str,
    out: str | Path,
    resume: bool = False,
    max_requests: int | None = None,
) -> Path:
    """Run (or resume) every enabled stage; returns the output folder. See the module doc."""
    out = Path(out)
    check_out_dir(out, resume)  # before the lock: a refused run writes nothing
    with lock_folder(out, "synth"):
        check_out_dir(out, resume)  # again, now that no other run can start one here
        with replacing(out / "config.yaml") as tmp:
            dump_yaml(cfg, tmp)
        asyncio.run(_run(cfg, input_path, out, max_requests))
        write_trajectories(out, cfg)
        from tirl.synth.report import write_report

        write_report(out)
    return out
