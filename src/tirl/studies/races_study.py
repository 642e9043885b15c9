"""`tirl study races`: does composition beat individual environments? RACES's study, tiny, on CPU.

RACES (papers/003) claims that at the same training budget RL on composed environments
generalizes better than RL on the same environments one at a time (Table 1), that individual RL
reaches the higher training reward yet plateaus on held-out tasks (Figure 2), that compositions of
a fifth of the environments match or beat all of them individually (Table 2), and that
generalization is not monotonic in composition size (Table 3). This runs the same comparison on
a tiny model (the task sets: `tirl.studies.races_tasks`):

1. one SFT model per variant (`code`: the interpreter is on; `text`: text-only), trained in
   stages (`study.sft_stages`, run as `sft.stages`: one optimizer and schedule): atomic tasks and
   compositions up to size 2 until the model copies its input, then chains up to size 3, so that
   the start solves some longer chains; evaluated on the held-out sets (the curves' step 0);
2. from that same SFT model, for every seed, RL of each arm (`tirl.studies.races_tasks.ARMS`:
   individual, RACES, RACES-small, SEQUENTIAL-only at sizes 2, 3, 4, 5, and the pass-rate
   curriculum over sizes 1-5) with one RL config: the same steps, prompts, group size and token
   limits, and no adaptive batches, so every arm samples the same number of rollouts. The
   curriculum arm alone runs `run.rl.curriculum` (enabled for it by the study). Every
   `eval.every_rl_steps` and at the end, a greedy pass over the held-out atomic tasks and the
   held-out compositions;
3. the analysis and report (`tirl.studies.races_report`, which the command hands in).

Folder: `tasks/` (every task set as JSONL with `meta.split`, and `manifest.json`), `sft/` (the
SFT run folder of both variants, and `inputs.json`: what the start was made from, so that a later
study with other RL settings can start from it, `sft_from`), `seed<N>/<arm>/` (each arm's run
folder: metrics.jsonl with the ids of the tasks every update trained on, `train/tasks`; samples
of the final evaluation; the RL policy and trainer state only with `study.keep_policies`), then
the report's files.

`--quick` (the CLI) loads the config again with `study.quick`'s overrides before the command's
own: the same study shrunk, with the same tables, claims, plots and report. `resume` continues a
killed study in its folder, made with the same config (`study_config.json`; `RESUME_FREE` may
differ): a finished SFT, arm or evaluation is not redone (`_train_all`). The presets:
`races_study.yaml` (the tiny model) and `races_study_smollm2.yaml` (SmolLM2-135M-Instruct with
LoRA, sized in its comments).

Seeds: each seed of `study.seeds` draws every arm's own RL task set (`tasks/arm_<arm>_seed<N>.jsonl`,
from the same pool and mixture) and seeds RL's sampling and state. SFT, the pool and the
held-out sets come from `study.task_seed` alone and are shared by every seed: every arm of every
seed starts from the same weights, which is what "the same SFT start" asks, and is scored on
the same items, so differences between arms are paired.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tirl.config import ConfigError, setting, to_dict
from tirl.envs.dataset import write_tasks
from tirl.envs.operators import OPERATORS, OperatorTask
from tirl.files import write_text
from tirl.models.tiny import is_saved_policy
from tirl.run.build import sandbox_for
from tirl.run.config import RunConfig, SFTStage
from tirl.run.evaluation import Evaluation
from tirl.studies.races_tasks import (
    ARMS,
    CURRICULUM_ARMS,
    EVAL_SIZES,
    StudyTasks,
    choose_pool,
    study_tasks,
)
from tirl.train.pipeline import (
    Pipeline,
    flat_keys,
    quiet_transformers,
    seed_everything,
)
from tirl.train.run_folder import claim_folder

STUDY_ENTRIES: tuple[str, ...] = (
    r"tasks",
    r"sft",
    r"seed\d+",
    r"results\.json",
    r"study\.md",
    r"report\.html",
    r"plots",
    r"study_config\.json",
)
EVAL_SETS = ("atomic", "compositions")
# The resolved config of the study, compared on --resume (a resumed study is the same study).
STUDY_CONFIG = "study_config.json"
# Keys a resumed study may change: where and how fast it runs, not what it computes.
RESUME_FREE = ("run.threads", "study.quick")
# `--quick` on the tiny preset: one seed, the individual, RACES and curriculum arms, half the
# RL steps, a quarter of the held-out compositions (SFT as is: the start must copy its input).
QUICK = (
    "study.seeds=[0]",
    "study.arms=[individual,races,curriculum]",
    "study.arm_items=100",
    "study.atomic_items=16",
    "study.per_cell=1",
    "run.rl.steps=6",
    "run.eval.every_rl_steps=3",
)
# sft/inputs.json: what a study's SFT start was made from, for a later study's `sft_from`.
SFT_INPUTS = "inputs.json"
# The settings the SFT start depends on; a study that starts from another's SFT may change the
# rest (rl, eval, the engine, threads, the arms and seeds).
SFT_KEYS = ("seed", "protocol", "tools", "prompt", "model", "sandbox", "sft")
# What a greedy evaluation of the SFT start depends on besides the start itself and the
# held-out files: a study from another's start (`sft_from`) reuses that study's evaluation of
# it when these are the same.
START_EVAL_KEYS = ("eval", "rollout")
# Where the sandbox runs does not change what the demonstrations' code prints.
SANDBOX_PLACE = ("sandbox.kind", "sandbox.urls", "sandbox.actors", "sandbox.kill_background")


def _seeds_problem(seeds: list[int]) -> str | None:
    if not seeds:
        return "must name at least one seed"
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        return "must be distinct seeds >= 0"
    return None


def _arms_problem(arms: list[str]) -> str | None:
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        return f"unknown arm {unknown[0]!r}; the arms are {', '.join(ARMS)}"
    if not arms or len(set(arms)) != len(arms):
        return "must name distinct arms, at least one"
    return None


def _stages_problem(stages: list[list[int]]) -> str | None:
    if not stages:
        return "must list at least one stage"
    if any(len(st) != 2 or st[0] < 1 or st[1] < 1 for st in stages):
        return "each stage must be [max chain size >= 1, steps >= 1]"
    return None


@dataclass
class StudySettings:
    """What the study compares and on how much (the model, SFT, RL and evaluation are `run`)."""

    seeds: list[int] = setting(
        factory=lambda: [0, 1, 2],
        doc="seeds of every arm: each draws the arm's own RL tasks and seeds RL's sampling",
        check=_seeds_problem,
    )
    arms: list[str] = setting(
        factory=lambda: list(ARMS),
        doc=f"the arms to train, of {', '.join(ARMS)}",
        check=_arms_problem,
    )
    pool_size: int = setting(10, ">= 2", "base environments trained on (the shortest code)")
    unseen: int = setting(
        0, ">= 0", "environments never trained on, only in held-out compositions (all of them)"
    )
    heldout_share: float = setting(
        0.25, "(0, 1)", "the share of compositions of trained environments held out, by name"
    )
    arm_items: int = setting(400, ">= 1", "RL tasks written per arm (RL cycles over them)")
    atomic_items: int = setting(32, ">= 1", "held-out atomic tasks")
    per_cell: int = setting(4, ">= 1", "held-out compositions per (size 2-5, operator)")
    sft_stages: list[list[int]] = setting(
        factory=lambda: [[2, 1000], [3, 500]],
        doc="SFT's stages, each [max chain size, steps]: atomic tasks and compositions up to"
        " that size; they replace run.sft.steps",
        check=_stages_problem,
    )
    task_seed: int = setting(
        0, ">= 0", "seeds the pool, SFT's and the held-out sets (the same for every seed)"
    )
    keep_policies: bool = setting(
        False, doc="keep every arm's RL policy and trainer state (about 10 MB per arm and variant)"
    )
    quick: list[str] = setting(
        factory=lambda: list(QUICK),
        doc="the overrides `--quick` applies before the command's own: the same study, shrunk"
        " (fewer steps, items, arms, one seed); each `key=value` as on the command line",
    )


@dataclass
class RacesStudyConfig:
    study: StudySettings = setting(factory=StudySettings, doc="the comparison")
    run: RunConfig = setting(factory=RunConfig, doc="model, SFT, RL and evaluation of every arm")


StudyReport = Callable[[Path], dict]  # (study folder) -> results; tirl.studies.races_report's


def _source(path: Path) -> dict:
    return {"source": "races", "path": str(path), "split_by": "meta"}


def sft_file(stage: int) -> str:
    return f"sft_stage{stage}"


def arm_file(arm: str, seed: int) -> str:
    """The name (no suffix) of one seed's RL task set of an arm."""
    return f"arm_{arm}_seed{seed}"


def write_task_files(tasks: StudyTasks, folder: Path) -> dict:
    """Every set as `folder/<name>.jsonl`; returns the manifest of what was written."""
    sets = {**{sft_file(k): ts for k, ts in enumerate(tasks.sft)},
            **{arm_file(a, s): ts for (a, s), ts in tasks.arms.items()},
            "heldout_atomic": tasks.atomic, "heldout_compositions": tasks.compositions}  # fmt: skip
    for name, rows in sets.items():
        write_tasks(rows, folder / f"{name}.jsonl")
    manifest = {
        "pool": asdict(tasks.pool),
        "files": {name: f"{name}.jsonl" for name in sets},
        "rows": {name: len(rows) for name, rows in sets.items()},
    }
    return manifest


def base_config(cfg: RacesStudyConfig, tasks_dir: Path) -> RunConfig:
    """The run config every phase shares: SFT in the study's stages, evaluation on the held-out
    sets. data.train is the first stage's set, whose items the tokenizer is trained on; every
    arm replaces it with its own RL task file (`arm_config`)."""
    s = cfg.study
    run = cfg.run
    evals = [
        {"name": "atomic", "items": s.atomic_items, **_source(tasks_dir / "heldout_atomic.jsonl")},
        {"name": "compositions", "items": len(EVAL_SIZES) * len(OPERATORS) * s.per_cell,
         **_source(tasks_dir / "heldout_compositions.jsonl")},
    ]  # fmt: skip
    stages = [
        SFTStage(steps=steps, data=[_source(tasks_dir / f"{sft_file(k)}.jsonl")])
        for k, (_, steps) in enumerate(s.sft_stages)
    ]
    data = replace(run.data, train=[_source(tasks_dir / f"{sft_file(0)}.jsonl")], eval=evals)
    return replace(run, data=data, sft=replace(run.sft, stages=stages))


def arm_config(base: RunConfig, tasks_dir: Path, arm: str, seed: int) -> RunConfig:
    """An arm's RL: this seed's task file of the arm from item 0 (SFT is not rerun), the
    curriculum on for the curriculum arm only, everything else shared."""
    data = replace(base.data, train=[_source(tasks_dir / f"{arm_file(arm, seed)}.jsonl")])
    curriculum = replace(base.rl.curriculum, enabled=arm in CURRICULUM_ARMS)
    return replace(
        base,
        seed=seed,
        data=data,
        sft=replace(base.sft, examples=0, stages=[]),
        rl=replace(base.rl, curriculum=curriculum),
    )


def sft_inputs(base: RunConfig, sft_sets: list[list[OperatorTask]]) -> dict:
    """What a study's SFT start is made of, by dotted key: the settings of SFT_KEYS and a
    content hash of each SFT stage's task set. Equal inputs train the same start."""
    whole = to_dict(base)
    settings = {key: whole[key] for key in SFT_KEYS}
    for stage in settings["sft"]["stages"]:  # a stage's tasks count by content, below
        del stage["data"]
    inputs = {k: v for k, v in flat_keys(settings).items() if k not in SANDBOX_PLACE}
    for k, rows in enumerate(sft_sets):
        content = json.dumps([t.to_dict() for t in rows], sort_keys=True).encode()
        inputs[f"tasks.{sft_file(k)}"] = hashlib.sha256(content).hexdigest()
    return inputs


def sft_start_problem(folder: Path, out_dir: Path, inputs: dict, variants: list[str]) -> str | None:
    """Why the SFT start of the study in `folder` cannot be that of the study in `out_dir`
    (None if it can)."""
    if not folder.is_dir():
        return "no such folder"
    if folder.resolve() == out_dir.resolve():
        return "it is the study's own folder, which a new study clears first; give another"
    saved = folder / "sft" / SFT_INPUTS
    if not saved.is_file():
        return f"it has no sft/{SFT_INPUTS}: not a study folder, or one from before --sft-from"
    try:
        old = json.loads(saved.read_text())
    except ValueError:
        return f"its sft/{SFT_INPUTS} is not JSON"
    differ = sorted(k for k in old.keys() | inputs.keys() if old.get(k) != inputs.get(k))
    if differ:
        return f"its SFT start was made from other settings ({', '.join(differ)} differ)"
    missing = [v for v in variants if not is_saved_policy(folder / "sft" / v / "sft")]
    if missing:
        return f"it has no finished SFT model of the {', '.join(missing)} variant"
    return None


def copy_start_evaluation(source: Path, out_dir: Path, cfg: RacesStudyConfig) -> str | None:
    """Copy into `out_dir` the evaluation of the SFT start that the study in `source` (whose
    start `out_dir` copied) recorded, if it scored the same held-out files under the same
    evaluation settings; else why not (the start is then evaluated again)."""
    for name in EVAL_SETS:
        file = Path("tasks") / f"heldout_{name}.jsonl"
        ours, theirs = out_dir / file, source / file
        if not theirs.is_file() or theirs.read_bytes() != ours.read_bytes():
            return f"its {file} differs"
    try:
        saved = json.loads((source / STUDY_CONFIG).read_text())["run"]
        done = json.loads((source / "sft" / "eval_progress.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return f"{source} has no recorded evaluation of its start"
    run = to_dict(cfg.run)
    differ = [f"run.{key}" for key in START_EVAL_KEYS if saved.get(key) != run.get(key)]
    if differ:
        return f"{', '.join(differ)} differ"
    samples = [
        Path("sft") / "samples" / f"{variant}_sft_{name}.jsonl"
        for variant in cfg.run.variants
        for name in EVAL_SETS
    ]
    recorded = all(set(EVAL_SETS) <= set(done.get(v, {}).get("sft", {})) for v in cfg.run.variants)
    if not recorded or not all((source / f).is_file() for f in samples):
        return f"{source} has no recorded evaluation of its start"
    for file in samples:
        (out_dir / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / file, out_dir / file)
    progress = {v: {"sft": done[v]["sft"]} for v in cfg.run.variants}
    write_text(out_dir / "sft" / "eval_progress.json", json.dumps(progress, indent=2))
    return None


def run_study(
    cfg: RacesStudyConfig,
    out_dir: Path,
    evaluation: Evaluation,
    report: StudyReport,
    sft_from: Path | None = None,
    resume: bool = False,
) -> dict:
    """Write the task sets, train and evaluate every arm, write the report; its results. With
    `sft_from`, a finished study folder whose SFT start was made from the same inputs
    (`sft_inputs`), every arm starts from that start instead of a new SFT; its evaluation is
    that study's if it scored the same held-out files under the same evaluation settings
    (`copy_start_evaluation`), else it is evaluated again. With `resume`, continue the study in `out_dir`
    made with the same config (`STUDY_CONFIG`): a finished SFT, arm or evaluation is not
    redone (`_train_all`)."""
    if cfg.run.rl.adaptive_batch:
        raise ConfigError(
            "run.rl.adaptive_batch must be false: adaptive batches sample more rollouts for some"
            " arms than for others, and the study compares arms at the same number of rollouts",
            "run.rl.adaptive_batch",
        )
    if cfg.run.rl.curriculum.enabled:
        raise ConfigError(
            "run.rl.curriculum.enabled must be false: the study turns the curriculum on for the"
            " curriculum arm only (run.rl.curriculum's other keys set how it draws)",
            "run.rl.curriculum.enabled",
        )
    if cfg.run.sft.stages:
        raise ConfigError(
            "run.sft.stages: the study makes SFT's stages from study.sft_stages", "run.sft.stages"
        )
    s = cfg.study
    try:  # every task set before anything is written: a pool that cannot be made is one line
        pool = choose_pool(s.pool_size, s.unseen, s.task_seed)
        tasks = study_tasks(
            pool,
            s.task_seed,
            cfg.run.sft.examples,
            s.arm_items,
            s.atomic_items,
            s.per_cell,
            sft_sizes=tuple(size for size, _ in s.sft_stages),
            arm_seeds=tuple(s.seeds),
            heldout_share=s.heldout_share,
        )
    except ValueError as e:
        raise ConfigError(f"study: {e}") from None
    out_dir = Path(out_dir)
    tasks_dir = out_dir / "tasks"
    inputs = sft_inputs(base_config(cfg, tasks_dir), tasks.sft)
    if resume and sft_from is not None:
        raise ConfigError(
            "--resume continues with the study's own SFT start (copied there from --sft-from"
            " when it began); leave --sft-from out"
        )
    if resume:
        check_same_study(cfg, out_dir)
    if sft_from is not None:
        problem = sft_start_problem(sft_from, out_dir, inputs, cfg.run.variants)
        if problem:
            raise ConfigError(f"--sft-from {sft_from}: {problem}")
    quiet_transformers(cfg.run)
    with claim_folder(out_dir, "study", STUDY_ENTRIES, resume=resume):
        write_text(out_dir / STUDY_CONFIG, json.dumps(to_dict(cfg), indent=2))
        manifest = write_task_files(tasks, tasks_dir)
        manifest.update(
            arms=list(s.arms),
            seeds=list(s.seeds),
            variants=list(cfg.run.variants),
            arm_files={a: {str(n): f"{arm_file(a, n)}.jsonl" for n in s.seeds} for a in s.arms},
            sft_stages=[list(st) for st in s.sft_stages],
        )
        write_text(tasks_dir / "manifest.json", json.dumps(manifest, indent=2))
        if sft_from is not None:
            for variant in cfg.run.variants:
                shutil.copytree(
                    sft_from / "sft" / variant / "sft", out_dir / "sft" / variant / "sft"
                )
            why_not = copy_start_evaluation(sft_from, out_dir, cfg)
            print(
                f"the SFT start's evaluation is {sft_from}'s" if why_not is None
                else f"the SFT start is evaluated again ({why_not})",
                flush=True,
            )  # fmt: skip
        write_text(out_dir / "sft" / SFT_INPUTS, json.dumps(inputs, indent=2))
        reuse_sft = sft_from is not None or resume
        asyncio.run(_train_all(cfg, out_dir, evaluation, reuse_sft, resume))
        return report(out_dir)


def check_same_study(cfg: RacesStudyConfig, out_dir: Path) -> None:
    """A study folder is resumed only with the config that made it (but `RESUME_FREE`)."""
    saved_path = out_dir / STUDY_CONFIG
    if not saved_path.is_file():
        raise ConfigError(
            f"cannot resume {out_dir}: it has no {STUDY_CONFIG} (no study started there)"
        )
    try:
        saved = flat_keys(json.loads(saved_path.read_text()))
    except (ValueError, AttributeError):
        raise ConfigError(f"cannot resume {out_dir}: its {STUDY_CONFIG} is not JSON") from None
    ours = flat_keys(to_dict(cfg))
    free = [k for k in ours.keys() | saved.keys() if k.startswith(RESUME_FREE)]
    differ = sorted(
        k for k in ours.keys() | saved.keys() if k not in free and ours.get(k) != saved.get(k)
    )
    if differ:
        raise ConfigError(
            f"cannot resume {out_dir}: its study was made with other settings ({', '.join(differ)}"
            " differ); resume with the same config, overrides and --quick"
        )


def arm_finished(run_dir: Path, variant: str) -> bool:
    """The arm's final evaluation of every set is recorded (and its samples written)."""
    progress = run_dir / "eval_progress.json"
    try:
        done = json.loads(progress.read_text()).get(variant, {}).get("rl", {})
    except (OSError, ValueError, AttributeError):
        return False
    return all(
        name in done and (run_dir / "samples" / f"{variant}_rl_{name}.jsonl").is_file()
        for name in EVAL_SETS
    )


def _drop_policies(run_dir: Path, variant: str) -> None:
    for kept in ("rl", "rl_state", "engine_policy"):
        shutil.rmtree(run_dir / variant / kept, ignore_errors=True)


async def _train_all(
    cfg: RacesStudyConfig, out_dir: Path, evaluation: Evaluation, reuse_sft: bool, resume: bool
) -> None:
    """SFT once per variant, then every seed's arms. Reusing a start (`--sft-from`, or a
    resumed study's finished SFT) is the pipeline's resume: the saved tokenizer and weights
    are loaded and the start is evaluated unless that evaluation is recorded. On `resume` an
    arm whose final evaluation is recorded is skipped; any other arm is the pipeline's resume
    too: its RL continues from its last checkpoint (`run.rl.checkpoint_every`) or starts over
    (the pipeline drops the records of the steps it runs again, so each is logged once)."""
    tasks_dir = out_dir / "tasks"
    base = base_config(cfg, tasks_dir)
    sft_pipeline = Pipeline(base, out_dir / "sft", evaluation, resume=reuse_sft)
    sft_pipeline.prepare()  # one tokenizer, trained on the SFT set, for every run
    async with sandbox_for(base) as sandbox:
        for variant in base.variants:
            use_tools = variant == "code"
            seed_everything(base.seed)
            model = sft_pipeline.make_model()
            await sft_pipeline.sft(variant, model, sandbox, use_tools)
            start = copy.deepcopy(model.state_dict())
            for seed in cfg.study.seeds:
                for arm in cfg.study.arms:
                    run_dir = out_dir / f"seed{seed}" / arm
                    if resume and arm_finished(run_dir, variant):
                        if not cfg.study.keep_policies:  # killed before they were removed
                            _drop_policies(run_dir, variant)
                        continue
                    arm_cfg = arm_config(base, tasks_dir, arm, seed)
                    pipeline = Pipeline(arm_cfg, run_dir, evaluation, resume=resume)
                    pipeline.prepare(sft_pipeline.tokenizer)
                    model.load_state_dict(start)
                    seed_everything(seed)
                    try:
                        await pipeline.rl(variant, model, sandbox, use_tools, arm_cfg)
                    finally:
                        pipeline.logger.close()
                    if not cfg.study.keep_policies:  # the metrics and samples are the result
                        _drop_policies(run_dir, variant)
    sft_pipeline.logger.close()
