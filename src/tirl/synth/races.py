"""Teacher-free trajectories from RACES composites: each step's mapper, run in the sandbox.

For a searched composite pi_t = (x_0; e_1..e_t; y_1..y_t) (`tirl.envs.search`) the task is its
SEQUENTIAL problem (`tirl.envs.operators.sequential`), and the solution is written, not asked
for: the first block binds x_0 (as a Python literal), and step i is a code block holding the
source of e_i's mapper (`Environment.code`, renamed `step_i`), applied to y_{i-1} and printed.
Every block runs in one stateful sandbox session; the shown output is the real one. The final
text is the `<answer>` block, scored with the task's own verifier.

A composite is skipped, with a counted reason, when its input has no Python literal form, a
mapper's source cannot be read, a block fails in the sandbox, a printed value differs from the
mapper's value in-process (a mapper that is not self-contained), or the answer does not score 1.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from pathlib import Path

from tqdm.auto import tqdm

from tirl.envs.core import Chain, Environments
from tirl.envs.demos import printed_types, sequential_steps
from tirl.envs.operators import OperatorTask, score, sequential
from tirl.files import lock_folder, replacing
from tirl.sandbox.config import SandboxConfig
from tirl.synth.formats import model_text, render_parts, sft_record
from tirl.synth.records import Item, Step
from tirl.synth.stages import Outcome, execute_steps, keep, reject

# Where `tirl synth races` runs each composite's code: mappers need only these modules.
RACES_SANDBOX = SandboxConfig(timeout_s=5.0, preload=["math", "fractions"])


def solution_steps(traj: Chain, task: OperatorTask) -> list[Step] | str:
    """The solution's steps (`tirl.envs.demos.sequential_steps`), or the reason this composite
    cannot be rendered."""
    steps = sequential_steps(traj, task.answer)
    if isinstance(steps, str):
        return steps
    return [Step(kind, text) for kind, text in steps]


def composite_id(traj: Chain) -> str:
    return hashlib.sha256(repr((traj.names(), repr(traj.x0))).encode()).hexdigest()[:16]


async def synthesize(
    traj: Chain, registry: Environments, sandbox, protocol: str, sandbox_cfg: SandboxConfig
) -> tuple[str, Outcome]:
    task = sequential(traj)
    item_id = composite_id(traj)
    steps = solution_steps(traj, task)
    if isinstance(steps, str):
        return item_id, reject(steps)
    shown = sandbox_cfg.max_output_chars
    if await execute_steps(sandbox, steps, sandbox_cfg.timeout_s, shown) is not None:
        return item_id, reject("code failed in the sandbox")
    codes = [s for s in steps if s.kind == "code"]
    for step, kind, expected in zip(codes, printed_types("sequential", traj), (traj.x0, *traj.ys)):
        try:
            same = kind.equal(kind.parse(step.real), expected)
        except Exception:
            same = False
        if not same:
            return item_id, reject("sandbox value differs from the mapper's")
        step.output = step.real
    item = Item(
        item_id, task.prompt, task.answer, steps=steps, source="races:" + " -> ".join(traj.names())
    )
    reward = score(task, model_text(render_parts(item.problem, steps, protocol)), registry)
    if reward.value != 1.0:
        return item_id, reject("answer does not score 1")
    return item_id, keep(item)


def races_trajectories(
    registry: Environments, n: int, seed: int, min_size: int, max_size: int, level: int, split: str
):
    from tirl.envs.search import SearchConfig, search

    config = SearchConfig(min_size=min_size, max_size=max_size, level=level)
    return list(itertools.islice(search(registry, seed, config, split), n))


def run_races(
    out: str | Path,
    n: int = 100,
    seed: int = 0,
    sizes: tuple[int, int] = (2, 4),
    level: int = 1,
    split: str = "train",
    protocol: str = "agentmath_tags",
    sandbox_cfg: SandboxConfig | None = None,
) -> Path:
    """Write OUT/trajectories.jsonl and the report for n searched composites (resumable: ids
    already in OUT/stages/01_races.jsonl are skipped). The folder is locked while this runs:
    a second run on it is refused in one line naming this one. `sandbox_cfg` (default:
    `RACES_SANDBOX`) says where the code runs and how much of its output the demonstrations
    show."""
    out = Path(out)
    with lock_folder(out, "synth"):
        cfg = sandbox_cfg or RACES_SANDBOX
        return _run_races(out, n, seed, sizes, level, split, protocol, cfg)


def _run_races(
    out: Path,
    n: int,
    seed: int,
    sizes: tuple[int, int],
    level: int,
    split: str,
    protocol: str,
    sandbox_cfg: SandboxConfig,
) -> Path:
    from tirl.envs.registry import REGISTRY
    from tirl.sandbox.config import make_sandbox
    from tirl.synth.pipeline import StageLog, stage_path
    from tirl.synth.report import write_report

    log = StageLog(stage_path(out, 1, "races"))
    trajs = races_trajectories(REGISTRY, n, seed, sizes[0], sizes[1], level, split)

    async def main() -> None:
        gate = asyncio.Semaphore(8)
        async with make_sandbox(sandbox_cfg) as sandbox:
            bar = tqdm(total=len(trajs), desc="synth: races", unit="composite", leave=False)

            async def one(traj: Chain) -> None:
                if composite_id(traj) not in log:
                    async with gate:
                        item_id, outcome = await synthesize(
                            traj, REGISTRY, sandbox, protocol, sandbox_cfg
                        )
                    log.append(item_id, outcome)
                bar.update()

            await asyncio.gather(*(one(t) for t in trajs))
            bar.close()

    try:
        asyncio.run(main())
    finally:
        log.close()
    with replacing(out / "trajectories.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        for item in log.kept({composite_id(t): i for i, t in enumerate(trajs)}):
            f.write(json.dumps(sft_record(item, protocol), ensure_ascii=False) + "\n")
    write_report(out, f"tirl synth races: {out}")
    return out
