"""What `tirl eval` runs (the command, `tirl.cli.eval`, only parses and calls these): a saved
model, a hub name, or OpenAI-compatible servers, evaluated on the config's data.eval sets
(`evaluate_sets`) or on the benchmarks `tirl.eval.benchmark_eval.benchmark_tasks` reads,
resumably (`eval_benchmarks`). The sandbox, the engine and the rollout settings come from
`tirl.run.build`, as in training.

One road for both: MODEL (a server's --tokenizer) is the config's `model.name_or_path` before
the config is checked (`eval_overrides`), so every check sees the model that is loaded (a
chat template, its own context rather than the tiny model's `model.max_positions`); on the
config road `-k`, `--temperature` and `--max-tokens` are the `eval.*` keys they set. A loaded
model's own context bounds every trajectory as the engine bounds it: a sequence that reaches
it stops (finish "length", a truncation) and a prompt that does not fit is a failed sample.

`--out` is a locked folder (`tirl.files.lock_folder`): a second `tirl eval` on it is refused,
and so is a folder that another tirl command made, a training run above all, or one inside
it (`check_out_folder`): eval never writes over a run's files. Not covered: resuming the config
road (a rerun evaluates its sets again and rewrites its files).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

import yaml

from tirl.cliargs import check_model_source
from tirl.config import ConfigError
from tirl.eval.evaluate import check_failed_share
from tirl.files import json_text, read_lock_info

_UNSET = object()


def is_url(model: str) -> bool:
    return model.startswith(("http://", "https://"))


# ------------------------------------------------------------------ the config tirl eval loads


def _override_value(overrides: list[str], key: str):
    """What the last of `overrides` to set the dotted `key` gives it, directly or inside a
    section it sets (`eval={k: 2}`); _UNSET when none does. A malformed override is left to
    the config loader, which reports it."""
    steps = key.split(".")
    found = _UNSET
    for text in overrides:
        okey, sep, raw = text.partition("=")
        parts = [p.strip() for p in okey.split(".")]
        if not sep or parts != steps[: len(parts)]:
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            continue
        for step in steps[len(parts) :]:
            value = value.get(step, _UNSET) if isinstance(value, dict) else _UNSET
            if value is _UNSET:
                break
        found = value  # a section set without the key puts it back to its default
    return found


def _same_model(a: object, b: object) -> bool:
    """The same string, or two paths to one folder (`runs/x` and `./runs/x/`)."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def _yaml_text(value: object) -> str:
    """`value` as the text of an override (a string quoted only where YAML would misread it)."""
    if isinstance(value, str):
        try:
            plain = yaml.safe_load(value) == value and "\n" not in value
        except yaml.YAMLError:
            plain = False
        return value if plain else json.dumps(value)
    return str(value)


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides `tirl eval` loads its config with: the user's, then MODEL (a server URL's
    --tokenizer) as model.name_or_path and, without --benchmark, what `-k` (eval.samples_per_item),
    `--temperature` (eval.temperature of the sampled pass; 0 = the greedy pass only,
    eval.samples_per_item 0) and `--max-tokens` (eval.max_model_tokens) set. A flag and an
    override that set one key to different values, or -k with --temperature 0, are a ConfigError."""
    url = is_url(args.model)
    flag = "--tokenizer" if url else "MODEL"
    source = args.tokenizer if url else args.model
    wanted: dict[str, tuple[object, str]] = {}  # key -> (value, the flag that sets it)
    if source is not None:
        wanted["model.name_or_path"] = (source, f"{flag} {source}")
    if not args.benchmark:
        if args.temperature == 0:
            if args.k is not None:
                raise ConfigError(
                    f"-k {args.k} with --temperature 0: greedy decoding takes one sample per"
                    " item; drop -k, or give a temperature > 0 for the sampled pass"
                )
            wanted["eval.samples_per_item"] = (0, "--temperature 0")
        elif args.temperature is not None:
            wanted["eval.temperature"] = (args.temperature, f"--temperature {args.temperature}")
        if args.k is not None:
            wanted["eval.samples_per_item"] = (args.k, f"-k {args.k}")
        if args.max_tokens is not None:
            wanted["eval.max_model_tokens"] = (args.max_tokens, f"--max-tokens {args.max_tokens}")
    ours = []
    for key, (value, said) in wanted.items():
        given = _override_value(args.overrides, key)
        same = _same_model(given, value) if key == "model.name_or_path" else given == value
        if given is not _UNSET and not same:
            what = "name different models" if key == "model.name_or_path" else "disagree"
            raise ConfigError(
                f"{said} and the override {key}={_yaml_text(given)} {what}; give one of them"
            )
        ours.append(f"{key}={_yaml_text(value)}")
    if args.temperature == 0 and not args.benchmark:
        given = _override_value(args.overrides, "eval.temperature")
        if given is not _UNSET:
            raise ConfigError(
                f"--temperature 0 (the greedy pass only) and the override"
                f" eval.temperature={_yaml_text(given)} (a sampled pass) disagree; give one of them"
            )
    # last, so that a section the user sets (model={...}) cannot drop MODEL again
    return [*args.overrides, *ours]


def eval_config(args: argparse.Namespace, cfg):
    """The run config `tirl eval` samples with: the config's engine serving MODEL (already its
    model.name_or_path, `eval_overrides`), or the servers at MODEL (engine openai)."""
    from dataclasses import replace

    if is_url(args.model):
        options = {} if args.request_timeout_s is None else {"timeout_s": args.request_timeout_s}
        rollout = replace(cfg.rollout, engine="openai", urls=[args.model], engine_options=options)
        return replace(cfg, rollout=rollout)
    if args.request_timeout_s is not None:
        raise ConfigError("--request-timeout-s applies to a server URL, not to a model folder")
    return cfg


# ------------------------------------------------------------------ the results folder


def _tirl_folder_kind(folder: Path) -> str | None:
    """Which tirl command made `folder` ("train", "ablate", "study", "synth", "eval", ...), or
    None: its lock file's `made_by`, else "train" for a run folder of a tirl older than the
    lock (a config.yaml beside a metrics.jsonl)."""
    made_by = read_lock_info(folder).get("made_by")
    if made_by:
        return str(made_by)
    if (folder / "config.yaml").is_file() and (folder / "metrics.jsonl").is_file():
        return "train"
    return None


def check_out_folder(out: str | Path) -> None:
    """Refuse an --out folder that another tirl command made (a training run: eval would write
    over its report.md and eval.json), or that lies inside one, and one another process holds
    (`tirl.files.check_unlocked`). A ConfigError of one line naming the folder."""
    from tirl.files import check_unlocked

    folder = Path(os.path.realpath(os.path.expanduser(out)))
    for where in [folder, *folder.parents]:
        try:
            kind = _tirl_folder_kind(where)
        except OSError:  # a folder we may not read: not one tirl made for us to guard
            continue
        if kind and kind != "eval":
            inside = "is" if where == folder else f"lies inside {where}, which is"
            raise ConfigError(
                f"--out {out} {inside} a `tirl {kind}` folder, and eval would write over its"
                f" files; choose a folder outside it, e.g. {where.parent / (where.name + '-eval')}"
            )
    check_unlocked(folder)


@contextlib.contextmanager
def _results_folder(out: Path):
    """`out`, checked (`check_out_folder`) and locked for the block."""
    from tirl.files import lock_folder

    check_out_folder(out)
    with lock_folder(out, "eval"):  # a second eval on this folder is refused, naming us
        yield out


# ------------------------------------------------------------------ the model


def eval_policy(args: argparse.Namespace, cfg):
    """(the live model, or None where the engine loads MODEL itself or it is a server URL;
    tokenizer), checked before anything slow runs."""
    from tirl.models.tiny import load_policy, loading
    from tirl.rollout.engines import ENGINES

    if is_url(args.model):
        if not args.tokenizer:
            raise ConfigError("a server URL needs --tokenizer (a folder or hub name) to tokenize")
        from transformers import AutoTokenizer

        check_model_source(args.tokenizer, "--tokenizer", need_weights=False)
        return None, loading(args.tokenizer, AutoTokenizer.from_pretrained)
    check_model_source(args.model, "model")
    if "model" not in ENGINES[cfg.rollout.engine].needs:  # e.g. vllm loads MODEL itself
        from transformers import AutoTokenizer

        return None, loading(args.model, AutoTokenizer.from_pretrained)
    model, tokenizer = load_policy(args.model)
    return model.to(cfg.device).eval(), tokenizer


@contextlib.asynccontextmanager
async def _eval_rollout(cfg, model, tokenizer, eos_id: int):
    """The sandbox and engine of `tirl eval` (`tirl.run.build`), closed on leaving."""
    from tirl.backends.engine import close_engine
    from tirl.rollout.runner import Rollout
    from tirl.run import build

    async with build.sandbox_for(cfg) as sandbox:
        engine = build.engine_for(cfg, model, tokenizer, eos_id)
        try:
            yield Rollout(engine, tokenizer, sandbox)
        finally:
            await close_engine(engine)


class _Recorder:
    """The rollout `evaluate_policy` is handed, keeping every trajectory it returns (the greedy
    pass and the sampled one: evaluate_policy returns only the greedy trajectories), each
    tagged with its eval set and temperature; everything else is the rollout's own."""

    def __init__(self, rollout, variant: str) -> None:
        self.rollout = rollout
        self.variant = variant
        self.eval_set = ""
        self.trajectories: dict[str, list] = {}

    async def run_many(self, prompts, settings, metas=None, progress=None):
        trajs = await self.rollout.run_many(prompts, settings, metas, progress=progress)
        for traj in trajs:
            traj.meta.update(
                eval_set=self.eval_set, temperature=settings.temperature, variant=self.variant
            )
        self.trajectories.setdefault(self.eval_set, []).extend(trajs)
        return trajs

    def __getattr__(self, name: str):
        return getattr(self.rollout, name)


def _renderer(cfg, tokenizer):
    """Prompts as training renders them: `prompt.chat` (null: the tokenizer's chat template
    when it has one) and `prompt.system`, in the run's protocol."""
    from tirl.run.build import run_protocol
    from tirl.tasks.prompts import PromptRenderer

    return PromptRenderer(
        tokenizer, run_protocol(cfg), system=cfg.prompt.system, chat=cfg.prompt.chat
    )


def chat_prompt(renderer):
    """A benchmark task's prompt ids in the chat template: the problem as the user turn (the
    system message says how to run code and answer; a RACES task's prompt is its own)."""
    return lambda task: renderer.prompt_ids(task.problem)


def evaluate_sets(
    cfg, model, tokenizer, use_tools: bool, out: Path | None = None, title: str = "tirl eval"
) -> int:
    """`tirl eval MODEL` without --benchmark: the config's data.eval sets, as the training
    pipeline evaluates them (a greedy pass, then eval.samples_per_item samples per item at
    eval.temperature); prints the metrics, and exit code 1 (FailedSamplesError) when too many
    samples failed. With `out`, in that folder, locked: `eval.json` ({set: metrics}),
    `samples/<set>.jsonl` (every trajectory of both passes), `report.md` / `report.html` and
    `viewer.html`; all of them written again by a rerun."""
    from tirl.eval.evaluate import evaluate_policy, first_failure
    from tirl.run.build import eval_sets, eval_settings
    from tirl.tasks import Mixture

    sets = eval_sets(cfg, Mixture.from_entries(cfg.data.train, "data.train", cfg.seed))
    renderer = _renderer(cfg, tokenizer)
    settings = eval_settings(cfg, use_tools=use_tools)
    variant = "code" if use_tools else "text"  # the names training gives the two

    async def run() -> tuple[dict, _Recorder]:
        results = {}
        async with _eval_rollout(cfg, model, tokenizer, renderer.eos_id) as rollout:
            recorder = _Recorder(rollout, variant)
            for name, tasks in sets.items():
                recorder.eval_set = name
                results[name], _ = await evaluate_policy(
                    recorder,
                    tasks,
                    settings,
                    lambda t: renderer.prompt_ids(t.problem),
                    cfg.eval.samples_per_item,
                    cfg.eval.temperature,
                    f"eval {name}",
                    seed=cfg.seed,
                )
        return results, recorder

    with _results_folder(out) if out is not None else contextlib.nullcontext():
        results, recorder = asyncio.run(run())
        if out is not None:
            paths = _write_set_results(
                out, results, recorder.trajectories, cfg, tokenizer, title, variant
            )
    print(json_text(results))
    if out is not None:
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    failures = (first_failure(trajs) for trajs in recorder.trajectories.values())
    check_failed_share(
        sum(m["eval/failed"] for m in results.values()),
        sum(m["eval/samples"] for m in results.values()),
        cfg.eval.max_failed_share,
        "tirl eval",
        "rerun to evaluate again",
        next(filter(None, failures), ""),
    )  # FailedSamplesError: main prints it, exit code 1
    return 0


def _write_set_results(out: Path, results, trajectories, cfg, tokenizer, title, variant):
    """The files of `evaluate_sets` with --out, each written whole (`tirl.files`); returns
    their paths."""
    from tirl.config import to_dict
    from tirl.eval.report import write_report
    from tirl.eval.viewer import write_viewer
    from tirl.files import open_replacing, write_text

    out = Path(out)
    paths = [out / "eval.json"]
    write_text(paths[0], json_text(results) + "\n")
    for name, trajs in trajectories.items():
        paths.append(out / "samples" / f"{name}.jsonl")
        with open_replacing(paths[-1]) as f:
            for traj in trajs:
                f.write((json.dumps(traj.to_dict()) + "\n").encode("utf-8"))
    everything = [t for trajs in trajectories.values() for t in trajs]
    report = write_report(
        out,
        eval_results={variant: {"eval": results}},
        metrics_path=out / "metrics.jsonl",  # none: an evaluation logs no steps
        samples=everything,
        title=title,
        config=to_dict(cfg),
        max_samples=cfg.eval.saved_samples,
        tokenizer=tokenizer,
    )
    paths += [report["markdown"], report["html"]]
    paths.append(write_viewer(everything, out / "viewer.html", title, tokenizer=tokenizer))
    return paths


def eval_benchmarks(args, cfg, model, tokenizer, items) -> int:
    """`tirl eval MODEL --benchmark ...`: resumable benchmark evaluation with the tool loop, in
    a locked --out folder; exit code 1 when too many samples failed (a rerun retries them)."""
    from tirl.eval.benchmark_eval import benchmark_metrics, run_benchmark, write_benchmark_report
    from tirl.run.build import rollout_settings

    k = 1 if args.temperature == 0 else args.k
    renderer = _renderer(cfg, tokenizer)
    prompt_of = chat_prompt(renderer) if renderer.chat else None  # None: plain text prompts
    settings = rollout_settings(
        cfg,
        not args.no_tools,
        max_model_tokens=args.max_tokens,
        tool_budget=cfg.eval.tool_budget,
        temperature=args.temperature,
    )
    out_dir = Path(args.out)

    async def run() -> dict:
        results = {}
        async with _eval_rollout(cfg, model, tokenizer, renderer.eos_id) as rollout:
            for name, (its, source) in items.items():
                records = await run_benchmark(
                    rollout, name, its, settings, k, out_dir, source=source, seed=cfg.seed,
                    prompt_of=prompt_of,
                )  # fmt: skip
                results[name] = benchmark_metrics(records, k)
        return results

    from tirl.eval.viewer import load_trajectories, write_viewer

    with _results_folder(out_dir):
        results = asyncio.run(run())
        paths = write_benchmark_report(results, out_dir, f"tirl eval {args.model}")
        trajs = load_trajectories(out_dir)
        viewer = write_viewer(trajs, out_dir / "viewer.html", "tirl eval", tokenizer=tokenizer)
    paths.append(viewer)
    print((out_dir / "report.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    failed = sum(m["n_failed"] for m in results.values())
    total = sum(m["n_samples"] for m in results.values())
    error = next((m["failed_error"] for m in results.values() if m.get("failed_error")), "")
    rerun = "rerun the same command to retry them"
    check_failed_share(failed, total, cfg.eval.max_failed_share, "tirl eval", rerun, error)
    return 0
