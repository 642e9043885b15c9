"""The `tirl` command. Subcommands hold no logic: they parse, load a config and call in."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import socket
import sys
from importlib import resources
from pathlib import Path

from tirl.backends.engine import WeightPushError  # light: no torch
from tirl.cliargs import (
    ArgumentParser,
    bind_host,
    check_model_source,
    input_path,
    number,
    output_dir,
    output_file,
    require_device,
)
from tirl.config import ConfigError, describe, dump_yaml, load_config, to_dict
from tirl.envs.cli import add_envs_parser
from tirl.eval.evaluate import FailedSamplesError, check_failed_share  # light: no torch
from tirl.integrations.openenv import server as openenv_server
from tirl.integrations.verl.cli import add_parser as add_verl_parser
from tirl.sandbox.api import SandboxError
from tirl.sandbox.config import SandboxConfig
from tirl.synth.cli import add_synth_parser

DEFAULT_PRESET = "quickstart"
DEFAULT_CONFIG = f"{DEFAULT_PRESET}.yaml"
SANDBOX_DEFAULTS = SandboxConfig()  # `tirl sandbox serve` takes its defaults from the section


def preset_path(name: str) -> Path:
    """A preset bundled with tirl (`tirl/presets/NAME.yaml`)."""
    return Path(str(resources.files("tirl") / "presets" / f"{name}.yaml"))


def _load_run_config(path: str | None, overrides: list[str]):
    from tirl.train.config import RunConfig

    return load_config(RunConfig, path or preset_path(DEFAULT_PRESET), overrides)


def _evaluation():
    """tirl.eval's evaluation and report, handed to the training pipeline (which does not
    import tirl.eval: architecture.md's layers)."""
    from tirl.eval.evaluate import evaluate_policy, first_failure
    from tirl.eval.report import format_summary_table, summary_rows, write_report
    from tirl.train.pipeline import Evaluation

    return Evaluation(
        evaluate_policy=evaluate_policy,
        check_failed_share=check_failed_share,
        first_failure=first_failure,
        write_report=write_report,
        summary_table=lambda results: format_summary_table(summary_rows(results)),
    )


def cmd_train(args: argparse.Namespace) -> int:
    """`tirl train [CONFIG]` and `tirl quickstart` (the bundled quickstart preset)."""
    cfg = _load_run_config(args.config, args.overrides)  # before torch: errors come at once
    if cfg.model.name_or_path:  # a server engine needs the model's tokenizer only
        weights = cfg.rollout.engine != "openai"
        check_model_source(cfg.model.name_or_path, "model.name_or_path", need_weights=weights)
    require_device(cfg.device)
    from tirl.train.run_folder import check_run_folder

    check_run_folder(cfg.out_dir, cfg.name, resume=args.resume)
    from tirl.train.pipeline import run_training

    run_dir, results = run_training(cfg, _evaluation(), resume=args.resume)
    print(f"\nrun folder: {run_dir}\nreport:     {run_dir / 'report.html'}  (and report.md)")
    print(f"wall time:  {results['wall_s']:.0f} s")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    cfg = _load_run_config(args.config, args.overrides)
    require_device(cfg.device)
    from tirl.studies.ablate import PRESET_NOTES, parse_variants, run_ablation

    variants = parse_variants(args.preset, args.variant or [])
    note = PRESET_NOTES.get(args.preset or "", "")
    out = run_ablation(cfg, variants, args.seeds, Path(args.out), _evaluation(), note)
    print(f"\nablation folder: {out}\ntable: {out / 'ablation.md'}  curves: {out / 'report.html'}")
    return 0


def cmd_study_races(args: argparse.Namespace) -> int:
    """`tirl study races [CONFIG] [overrides]`: RACES's composition study on a tiny model."""
    from tirl.studies.races_study import RacesStudyConfig

    cfg = load_config(RacesStudyConfig, args.config or preset_path("races_study"), args.overrides)
    require_device(cfg.run.device)
    from tirl.studies.races_report import write_study_report
    from tirl.studies.races_study import run_study

    out = Path(args.out)
    results = run_study(cfg, out, _evaluation(), write_study_report)
    for variant, claims in results["claims"].items():
        verdicts = ", ".join(f"{i + 1}: {c['verdict']}" for i, c in enumerate(claims))
        print(f"{variant}: claims {verdicts}")
    print(f"\nstudy folder: {out}\nreport: {out / 'study.md'}  and {out / 'report.html'}")
    return 0


def _print_keys(rows) -> None:
    for row in rows:
        if row.type == "section":
            print(f"\n{row.key}: {row.doc}")
            continue
        bounds = f"  range {row.range}" if row.range else ""
        print(f"  {row.key} = {json.dumps(row.default)}  ({row.type}){bounds}")
        if row.doc:
            print(f"      {row.doc}")


def cmd_config(args: argparse.Namespace) -> int:
    if args.keys:
        from tirl.tasks.registry import SOURCES, source_names
        from tirl.train.config import RunConfig

        _print_keys(describe(RunConfig))
        print("\ntask sources: the keys of a data.train / data.eval entry {source: NAME, ...}")
        for name in source_names():
            print(f"\n  source: {name}  ({(SOURCES[name].__doc__ or '').strip().splitlines()[0]})")
            fields = [r for r in describe(SOURCES[name]) if r.key != "name"]
            _print_keys(fields)
        return 0
    cfg = _load_run_config(args.config, args.overrides)
    require_device(cfg.device)  # as `tirl train` would: a config for a device this machine lacks
    if args.output:
        dump_yaml(cfg, args.output)
    else:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def _is_url(model: str) -> bool:
    return model.startswith(("http://", "https://"))


# The flags of `tirl eval --benchmark` runs (argparse dest -> default): given without
# --benchmark they would be ignored, so they are refused instead.
BENCHMARK_FLAGS = {"k": 4, "temperature": 1.0, "max_tokens": 512, "limit": None,
                   "out": "runs/eval", "data_dir": None}  # fmt: skip


def _check_eval_flags(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen evaluation would ignore; fill the benchmark defaults."""
    if args.tokenizer is not None and not _is_url(args.model):
        raise ConfigError("--tokenizer is for a server URL; a model folder has its own tokenizer")
    given = [name for name in BENCHMARK_FLAGS if getattr(args, name) is not None]
    if given and not args.benchmark:
        flags = ", ".join("-k" if n == "k" else "--" + n.replace("_", "-") for n in given)
        raise ConfigError(
            f"{flags}: only for --benchmark runs; without --benchmark, tirl eval evaluates the"
            " config's data.eval sets (set eval.* keys instead)"
        )
    for name, default in BENCHMARK_FLAGS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def _eval_config(args: argparse.Namespace, cfg):
    """The run config `tirl eval` samples with: the server at MODEL (engine openai), or the
    config's engine serving MODEL."""
    from dataclasses import replace

    if _is_url(args.model):
        options = {} if args.request_timeout_s is None else {"timeout_s": args.request_timeout_s}
        rollout = replace(cfg.rollout, engine="openai", urls=[args.model], engine_options=options)
        return replace(cfg, rollout=rollout)
    if args.request_timeout_s is not None:
        raise ConfigError("--request-timeout-s applies to a server URL, not to a model folder")
    return replace(cfg, model=replace(cfg.model, name_or_path=args.model))


def _policy(args: argparse.Namespace, cfg):
    """(the live model, or None where the engine loads MODEL itself or it is a server URL;
    tokenizer), checked before anything slow runs."""
    from tirl.models.tiny import load_policy, loading
    from tirl.rollout.engines import ENGINES

    if _is_url(args.model):
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
    """The sandbox and engine of `tirl eval` (`tirl.train.runtime`), closed on leaving."""
    from tirl.backends.engine import close_engine
    from tirl.rollout.runner import Rollout
    from tirl.train import runtime

    async with runtime.sandbox_for(cfg) as sandbox:
        engine = runtime.engine_for(cfg, model, tokenizer, eos_id)
        try:
            yield Rollout(engine, tokenizer, sandbox)
        finally:
            await close_engine(engine)


def cmd_eval(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    _check_eval_flags(args)
    cfg = _eval_config(args, _load_run_config(args.config, args.overrides))
    require_device(cfg.device)
    items = _benchmark_items(args) if args.benchmark else None  # before the model: fail fast
    model, tokenizer = _policy(args, cfg)
    if items is not None:
        return _eval_benchmarks(args, cfg, model, tokenizer, items)
    from tirl.eval.evaluate import evaluate_policy, first_failure
    from tirl.tasks import Mixture
    from tirl.tasks.prompts import PromptRenderer
    from tirl.train.pipeline import eval_sets
    from tirl.train.runtime import eval_settings, run_protocol

    sets = eval_sets(cfg, Mixture.from_entries(cfg.data.train, "data.train", cfg.seed))
    renderer = PromptRenderer(
        tokenizer, run_protocol(cfg), system=cfg.prompt.system, chat=cfg.prompt.chat
    )
    settings = eval_settings(cfg, use_tools=not args.no_tools)

    failures: list[str] = []

    async def run() -> dict:
        results = {}
        async with _eval_rollout(cfg, model, tokenizer, renderer.eos_id) as rollout:
            for name, tasks in sets.items():
                results[name], trajs = await evaluate_policy(
                    rollout,
                    tasks,
                    settings,
                    lambda t: renderer.prompt_ids(t.problem),
                    cfg.eval.samples_per_item,
                    cfg.eval.temperature,
                    f"eval {name}",
                )
                failures.append(first_failure(trajs))
        return results

    results = asyncio.run(run())
    print(json.dumps(results, indent=2))
    check_failed_share(
        sum(m["eval/failed"] for m in results.values()),
        sum(m["eval/samples"] for m in results.values()),
        cfg.eval.max_failed_share,
        "tirl eval",
        "rerun to evaluate again",
        next(filter(None, failures), ""),
    )  # FailedSamplesError: main prints it, exit code 1
    return 0


def _benchmark_items(args: argparse.Namespace) -> dict[str, tuple[list, str]]:
    """(items, source) of every --benchmark by its unique report name (`benchmark_keys`),
    loaded before any model work so a typo fails fast."""
    from tirl.eval.benchmark_eval import benchmark_keys, benchmark_source
    from tirl.eval.benchmarks import load_benchmark, load_races

    names = [n.strip() for spec in args.benchmark for n in spec.split(",") if n.strip()]
    keys = benchmark_keys(names)
    items = {}
    for name in dict.fromkeys(names):
        if keys[name] in items:
            continue  # the same file named twice
        try:
            loaded = (
                load_races(args.limit or 200)
                if name == "races"
                else load_benchmark(name, args.data_dir)
            )
        except (ValueError, ImportError) as e:
            raise ConfigError(f"--benchmark {name}: {e}") from None
        items[keys[name]] = (loaded[: args.limit] if args.limit else loaded, benchmark_source(name))
    return items


def _eval_benchmarks(args, cfg, model, tokenizer, items) -> int:
    """`tirl eval MODEL --benchmark ...`: resumable benchmark evaluation with the tool loop, in
    a locked --out folder; exit code 1 when too many samples failed (a rerun retries them)."""
    from tirl.eval.benchmark_eval import benchmark_metrics, run_benchmark, write_benchmark_report
    from tirl.files import lock_folder
    from tirl.rewards.verify import verify_answer
    from tirl.train.runtime import rollout_settings

    k = 1 if args.temperature == 0 else args.k
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
        async with _eval_rollout(cfg, model, tokenizer, tokenizer.eos_token_id) as rollout:
            for name, (its, source) in items.items():
                records = await run_benchmark(
                    rollout, name, its, settings, k, out_dir, verify_answer, source=source
                )
                results[name] = benchmark_metrics(records, k)
        return results

    from tirl.eval.viewer import load_trajectories, write_viewer

    with lock_folder(out_dir, "eval"):  # a second eval on this folder is refused, naming us
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


def cmd_serve(args: argparse.Namespace) -> int:
    key = _server_key(args)  # before the model loads: a refused bind fails at once
    from tirl.backends.server import serve

    check_model_source(args.model, "model")
    with _listen_errors(args):
        serve(
            args.model,
            args.host,
            args.port,
            args.max_batch,
            api_key=key,
            insecure_no_auth=args.insecure_no_auth,
        )
    return 0


@contextlib.contextmanager
def _listen_errors(args: argparse.Namespace):
    """A server that cannot listen where it was told: one line naming --host / --port."""
    try:
        yield
    except socket.gaierror as e:
        raise ConfigError(f"--host {args.host!r}: no such address here ({e.strerror})") from None
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise ConfigError(f"cannot listen on {args.host} port {args.port}: {e.strerror}") from None


def _server_key(args: argparse.Namespace) -> str | None:
    """The API key of `tirl serve` / `tirl sandbox serve` (tirl.httpauth), or None; refuses a
    non-loopback --host without one unless --insecure-no-auth."""
    from tirl.httpauth import APIKeyError, bind_refusal, key_from_env

    try:
        key = key_from_env(args.api_key_env)
    except APIKeyError as e:
        raise ConfigError(f"--api-key-env: {e}") from None
    refusal = bind_refusal(args.host, key, args.insecure_no_auth, "--api-key-env")
    if refusal:
        raise ConfigError(f"--host: {refusal}")
    return key


def _add_auth_args(p: argparse.ArgumentParser) -> None:
    """The API-key flags of the two servers (the key itself never goes on the command line,
    where `ps` would show it)."""
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the API key clients must send as"
        " 'Authorization: Bearer <key>' (default: TIRL_API_KEY, if set; naming a variable"
        " that is unset is an error)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without an API key (anyone who can reach the port"
        " can use the server)",
    )


def cmd_view(args: argparse.Namespace) -> int:
    from tirl.eval.viewer import find_tokenizer, load_trajectories, write_viewer

    path = args.path
    try:
        trajs = load_trajectories(path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not trajs:
        raise ConfigError(f"{path} holds no trajectories")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        from tirl.models.tiny import loading

        check_model_source(args.tokenizer, "--tokenizer", need_weights=False)
        tokenizer = loading(args.tokenizer, AutoTokenizer.from_pretrained)
    elif path.is_dir():
        tokenizer = find_tokenizer(path)
    out = args.output or (path if path.is_dir() else path.parent) / "viewer.html"
    write_viewer(trajs, out, f"tirl trajectories: {path}", tokenizer=tokenizer)
    print(f"wrote {out} ({len(trajs)} trajectories)")
    return 0


def cmd_sandbox_serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    key = _server_key(args)

    from tirl.sandbox.api import SandboxError
    from tirl.sandbox.config import SandboxConfig, modules_problem
    from tirl.sandbox.http import serve
    from tirl.sandbox.local import DEFAULT_PRELOAD, Sandbox

    if args.max_timeout_s < args.timeout_s:
        raise ConfigError(
            f"--max-timeout-s ({args.max_timeout_s}) must be at least --timeout-s ({args.timeout_s})"
        )
    preload = DEFAULT_PRELOAD
    if args.preload is not None:
        preload = tuple(m.strip() for m in args.preload.split(",") if m.strip())
    problem = modules_problem(list(preload))
    if problem:
        raise ConfigError(f"--preload {problem}")
    shape = SandboxConfig(  # the sandbox section every command reads (tirl.sandbox.config)
        timeout_s=args.timeout_s,
        memory_mb=args.memory_mb,
        preload=list(preload),
        cpu_s=args.cpu_s,
        kill_background=not args.keep_background,
    )
    limits = replace(shape.limits(), grace_s=args.grace_s, capture_chars=args.capture_chars)
    try:
        with _listen_errors(args):
            serve(
                Sandbox(limits, tuple(shape.preload), args.pool_size),
                args.host,
                args.port,
                args.max_timeout_s,
                args.idle_ttl_s,
                api_key=key,
                insecure_no_auth=args.insecure_no_auth,
            )
    except SandboxError as err:
        print(f"tirl: error: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="tirl",
        description="Train and evaluate language models that reason with a Python interpreter.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "config", nargs="?", help=f"YAML config (default: the bundled {DEFAULT_CONFIG})"
        )
        p.add_argument(
            "overrides",
            nargs="*",
            help="dotted overrides, e.g. rl.lr=1e-4 data.train[0].digits=4",
        )
        p.set_defaults(takes_overrides=True)  # also those after an option (_split_overrides)

    def add_resume_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--resume",
            action="store_true",
            help="continue the run in out_dir/name: finished phases are loaded, RL continues"
            " from its last checkpoint (rl.checkpoint_every), nothing is logged twice",
        )

    p = sub.add_parser(
        "quickstart",
        help="SFT -> RL -> eval of a tiny code-integrated model and a text-only baseline, with a report",
        description="Run the whole loop on CPU: demonstrations, SFT, RL with the interpreter, evaluation, report.",
    )
    add_config_args(p)
    add_resume_arg(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "train",
        help="the training pipeline (demonstrations -> SFT -> eval -> RL -> eval -> report) from"
        " a config: any task sources, engine and protocol",
        description="Run the pipeline a config describes (recipes/ holds examples; every key:"
        " tirl config --keys). Without a config, the bundled quickstart preset.",
    )
    add_config_args(p)
    add_resume_arg(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "ablate",
        help="RL under several switch combinations from one SFT model, same seeds, one report",
        description="Fine-tune once per seed, then run RL for every variant (a list of config"
        " overrides) and compare them on the held-out split. Presets: cir (each of CIR's six"
        " strategies removed in turn), agentmath, advantages.",
    )
    add_config_args(p)
    p.add_argument("--preset", help="cir, agentmath or advantages")
    p.add_argument(
        "--variant",
        action="append",
        help="NAME:key=value[,key=value...] (repeatable), added to the preset's variants",
    )
    p.add_argument(
        "--seeds", type=number(int, ">= 0"), nargs="+", default=[0], help="seeds (default: 0)"
    )
    p.add_argument(
        "--out", type=output_dir, default="runs/ablate", help="output folder (default runs/ablate)"
    )
    p.set_defaults(func=cmd_ablate)

    study = sub.add_parser(
        "study",
        help="studies that reproduce a paper's comparison at small scale",
        description="Studies that reproduce a paper's comparison at small scale.",
    )
    study_sub = study.add_subparsers(dest="study_command", required=True, metavar="STUDY")
    p = study_sub.add_parser(
        "races",
        help="RACES: individual vs composed environments, RACES-small, a size sweep; one report",
        description="Train the arms of RACES's composition study (individual, RACES, RACES-small,"
        " SEQUENTIAL sizes 2-5) from one SFT model per variant over several seeds, evaluate on"
        " held-out atomic tasks and compositions, and judge the paper's four claims. Config keys:"
        " study.* and run.* (default: the bundled races_study preset).",
    )
    add_config_args(p)
    p.add_argument(
        "--out", type=output_dir, default="runs/races_study",
        help="study folder (default runs/races_study)",
    )  # fmt: skip
    p.set_defaults(func=cmd_study_races)

    p = sub.add_parser(
        "eval", help="evaluate a saved model (folder or hub name) on the held-out split"
    )
    p.add_argument(
        "model",
        help="model folder (e.g. runs/quickstart/code/rl), hub name, or the URL of an"
        " OpenAI-compatible server (vLLM, SGLang, tirl serve)",
    )
    p.add_argument(
        "--tokenizer", help="with a server URL: the model's tokenizer (folder or hub name)"
    )
    add_config_args(p)
    p.add_argument("--no-tools", action="store_true", help="evaluate without the interpreter")
    p.add_argument(
        "--benchmark",
        action="append",
        help="math500, aime24, aime25, amc23, olymmath-easy, olymmath-hard, hmmt, a file, or"
        " races (repeatable or comma-separated); without it, the config's data.eval sets",
    )
    p.add_argument(
        "--data-dir", help="folder or file with the benchmark data (else $TIRL_BENCHMARK_DIR)"
    )
    p.add_argument(
        "-k",
        type=number(int, ">= 1"),
        help="samples per item when sampling, >= 1 (default 4)",
    )
    p.add_argument(
        "--temperature",
        type=number(float, "[0, 100]"),
        help="in [0, 100]; 0 decodes greedily (k = 1)",
    )
    p.add_argument(
        "--max-tokens",
        type=number(int, ">= 1"),
        help="model tokens per trajectory, >= 1 (default 512)",
    )
    p.add_argument(
        "--request-timeout-s",
        type=number(float, "(0, 86400]"),
        help="with a server URL: the longest one request may take before its sample counts as"
        " failed (default 600)",
    )
    p.add_argument(
        "--limit", type=number(int, ">= 1"), help="only the first N items of each benchmark"
    )
    p.add_argument(
        "--out",
        type=output_dir,
        help="results folder; rerunning resumes from it (default runs/eval)",
    )
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("config", help="print (or write) the resolved config")
    add_config_args(p)
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        help="write the resolved YAML here instead of printing it",
    )
    p.add_argument(
        "--keys",
        "--help-fields",
        action="store_true",
        help="list every key with its default, range and meaning, and each task source's keys",
    )
    p.set_defaults(func=cmd_config)

    sandbox = sub.add_parser(
        "sandbox", help="serve the Python sandbox to other machines or processes over HTTP"
    )
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    p = sandbox_sub.add_parser(
        "serve",
        help="serve sandbox sessions over HTTP until SIGTERM or Ctrl-C",
        description="Serve stateful sandbox sessions over a JSON HTTP API (see"
        " tirl.sandbox.http). Anyone who can use it can run code as you: with $TIRL_API_KEY"
        " set, every request must carry 'Authorization: Bearer <key>'; without a key it only"
        " binds loopback.",
    )
    p.add_argument(
        "--host", type=bind_host, default="127.0.0.1", help="address to bind (default: 127.0.0.1)"
    )
    _add_auth_args(p)
    p.add_argument(
        "--port",
        type=number(int, "[0, 65535]"),
        default=8765,
        help="port to bind; 0 picks a free one (default: 8765)",
    )
    p.add_argument(
        "--timeout-s",
        type=number(float, "(0, 86400]"),
        default=SANDBOX_DEFAULTS.timeout_s,
        help=f"default wall-clock limit per cell, in seconds (default: {SANDBOX_DEFAULTS.timeout_s:g})",
    )
    p.add_argument(
        "--max-timeout-s",
        type=number(float, "(0, 86400]"),
        default=60.0,
        help="cap on the timeout_s of a request, in seconds (default: 60)",
    )
    p.add_argument(
        "--grace-s",
        type=number(float, "(0, 3600]"),
        default=0.5,
        help="seconds between the interrupt and the kill (default: 0.5)",
    )
    p.add_argument(
        "--memory-mb",
        type=number(int, "[64, 1048576]"),
        default=SANDBOX_DEFAULTS.memory_mb,
        help=f"memory limit per session, in MB (default: {SANDBOX_DEFAULTS.memory_mb})",
    )
    p.add_argument(
        "--capture-chars",
        type=number(int, "[16, 100000000]"),
        default=8192,
        help="output the sandbox keeps per stream and cell, before a client's formatter cuts"
        " what the model is shown to its sandbox.max_output_chars (default: 8192)",
    )
    p.add_argument(
        "--pool-size",
        type=number(int, "[0, 4096]"),
        default=32,
        help="sessions forked ahead of requests and refilled in the background; size it to the"
        " largest burst of opens this server should answer at once (default: 32)",
    )
    p.add_argument(
        "--preload",
        help="comma-separated modules imported once and shared by all sessions; '' for none"
        " (default: math, numpy, sympy and other math modules)",
    )
    p.add_argument(
        "--idle-ttl-s",
        type=number(float, "(0, 31536000]"),
        default=600.0,
        help="close sessions idle this many seconds (default: 600)",
    )
    p.add_argument(
        "--cpu-s",
        type=number(int, "[1, 86400]"),
        help="CPU seconds per session over its life (RLIMIT_CPU; default: no cap)",
    )
    p.add_argument(
        "--keep-background",
        action="store_true",
        help="let processes a cell starts outlive the cell (default: they are ended)",
    )
    p.set_defaults(func=cmd_sandbox_serve, config=None, overrides=[])  # see _split_overrides

    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API (completions, chat, streaming)",
        description="Serve a model over an OpenAI-compatible API (see tirl.backends.server)."
        " With $TIRL_API_KEY set, every request must carry 'Authorization: Bearer <key>';"
        " without a key it only binds loopback.",
    )
    p.add_argument("model", help="model folder or hub name")
    p.add_argument(
        "--host", type=bind_host, default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    _add_auth_args(p)
    p.add_argument(
        "--port",
        type=number(int, "[0, 65535]"),
        default=8000,
        help="port; 0 picks a free one (default 8000)",
    )
    p.add_argument(
        "--max-batch",
        type=number(int, "[1, 100000]"),
        default=64,
        help="sequences decoded together (default 64)",
    )
    p.set_defaults(func=cmd_serve, config=None, overrides=[])

    p = sub.add_parser(
        "view", help="write an HTML viewer of trajectories (model vs interpreter tokens, loss mask)"
    )
    p.add_argument(
        "path", type=input_path, help="a run folder, or a .jsonl of trajectories / eval samples"
    )
    p.add_argument("--tokenizer", help="tokenizer folder or hub name, to show token boundaries")
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        help="the HTML file (default: viewer.html beside the input)",
    )
    p.set_defaults(func=cmd_view, config=None, overrides=[])

    add_envs_parser(sub)
    add_synth_parser(sub)
    add_verl_parser(sub)
    p = sub.add_parser(
        "openenv-serve",
        help="serve a task source as an OpenEnv environment (pip install 'tirl[openenv]')",
        description=openenv_server.__doc__.split("\n\n")[0],
    )
    openenv_server.add_arguments(p)
    p.set_defaults(func=openenv_server.run, config=None, overrides=[])
    return parser


def _split_overrides(args: argparse.Namespace, extra: list[str]) -> None:
    """Let the config path be omitted (`tirl quickstart rl.steps=5` is all overrides), and
    take overrides that come after an option (`tirl eval URL --tokenizer T eval.k=2`, which
    argparse leaves over: it matches a command's positionals once, before the option)."""
    for item in extra:
        if not getattr(args, "takes_overrides", False) or item.startswith("-"):
            raise ConfigError(f"unrecognized arguments: {' '.join(extra)} (see tirl --help)")
        if args.config is None and "=" not in item:
            args.config = item
        else:
            args.overrides = [*args.overrides, item]
    if args.config and "=" in args.config and not _is_file(args.config):
        args.overrides = [args.config, *args.overrides]
        args.config = None


def _is_file(text: str) -> bool:
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


# Errors of the machine rather than of tirl: one line each (with the file), no traceback.
_PATH_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR}
_PATH_ERRORS |= {errno.ENAMETOOLONG, errno.EEXIST}
_SPACE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _os_error_line(err: OSError) -> str:
    where = err.filename if err.filename is not None else ""
    text = f"{err.strerror or err}" + (f": {str(where)!r}" if where != "" else "")
    if err.errno in _SPACE_ERRORS:
        text += " (what was finished is kept; free space, then rerun with --resume)"
    return text


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    try:
        args, extra = build_parser().parse_known_args(argv)
        _split_overrides(args, extra)
        return args.func(args)
    except ConfigError as err:
        print(f"tirl: error: {err}", file=sys.stderr)
        return 2
    except (FailedSamplesError, WeightPushError, SandboxError) as err:
        # results and the last checkpoint are kept; a rerun (--resume) continues from them
        print(f"tirl: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.errno not in _PATH_ERRORS | _SPACE_ERRORS or os.environ.get("TIRL_DEBUG"):
            raise
        print(f"tirl: error: {_os_error_line(err)}", file=sys.stderr)
        return 2 if err.errno in _PATH_ERRORS else 1
    except KeyboardInterrupt:
        print("tirl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
