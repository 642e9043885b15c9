"""The `tirl` command. Subcommands hold no logic: they parse, load a config and call in."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from importlib import resources
from pathlib import Path

from tirl.config import ConfigError, dump_yaml, load_config, to_dict
from tirl.envs.cli import add_envs_parser
from tirl.synth.cli import add_synth_parser

DEFAULT_CONFIG = "quickstart.yaml"


def _bundled_config(name: str) -> Path:
    return Path(str(resources.files("tirl") / "configs" / name))


def _load_run_config(path: str | None, overrides: list[str]):
    from tirl.train.config import RunConfig

    return load_config(RunConfig, path or _bundled_config(DEFAULT_CONFIG), overrides)


def cmd_quickstart(args: argparse.Namespace) -> int:
    from tirl.quickstart import run_quickstart

    cfg = _load_run_config(args.config, args.overrides)
    run_dir, results = run_quickstart(cfg, resume=args.resume)
    print(f"\nrun folder: {run_dir}\nreport:     {run_dir / 'report.html'}  (and report.md)")
    print(f"wall time:  {results['wall_s']:.0f} s")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from tirl.train.ablate import PRESET_NOTES, parse_variants, run_ablation

    cfg = _load_run_config(args.config, args.overrides)
    variants = parse_variants(args.preset, args.variant or [])
    note = PRESET_NOTES.get(args.preset or "", "")
    out = run_ablation(cfg, variants, args.seeds, Path(args.out), note)
    print(f"\nablation folder: {out}\ntable: {out / 'ablation.md'}  curves: {out / 'report.html'}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    cfg = _load_run_config(args.config, args.overrides)
    if args.output:
        dump_yaml(cfg, args.output)
    else:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def _is_url(model: str) -> bool:
    return model.startswith(("http://", "https://"))


def _policy(args: argparse.Namespace, cfg):
    """(model or None for a server URL, tokenizer), checked before anything slow runs."""
    from tirl.models.tiny import load_policy

    if _is_url(args.model):
        if not args.tokenizer:
            raise ConfigError("a server URL needs --tokenizer (a folder or hub name) to tokenize")
        from transformers import AutoTokenizer

        return None, AutoTokenizer.from_pretrained(args.tokenizer)
    if not Path(args.model).exists() and "/" not in args.model:
        raise ConfigError(f"model {args.model!r} is neither a folder, a hub name nor a URL")
    model, tokenizer = load_policy(args.model)
    return model.to(cfg.device).eval(), tokenizer


class _Engine:
    """The HF engine for a local model, the OpenAI-compatible client for a server URL."""

    def __init__(self, args, cfg, model, tokenizer) -> None:
        from tirl.backends.hf import HFEngine
        from tirl.backends.openai import OpenAIEngine

        if model is None:
            self.engine = OpenAIEngine(args.model, tokenizer, seed=cfg.seed)
        else:
            self.engine = HFEngine(
                model, tokenizer.eos_token_id, max_batch=cfg.rollout_batch, seed=cfg.seed
            )

    async def __aenter__(self):
        return self.engine

    async def __aexit__(self, *exc) -> None:
        if hasattr(self.engine, "aclose"):
            await self.engine.aclose()
        else:
            self.engine.close()


def cmd_eval(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from tirl.envs.arithmetic import ArithmeticEnv
    from tirl.quickstart import evaluate_policy
    from tirl.rollout.runner import Rollout
    from tirl.sandbox import Sandbox, SandboxLimits

    hf_logging.set_verbosity_error()
    cfg = _load_run_config(args.config, args.overrides)
    items = _benchmark_items(args) if args.benchmark else None  # before the model: fail fast
    model, tokenizer = _policy(args, cfg)
    limits = SandboxLimits(timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb)
    if items is not None:
        return _eval_benchmarks(args, cfg, model, tokenizer, limits, items)
    tasks = ArithmeticEnv(tuple(cfg.task.kinds), cfg.task.digits, cfg.seed).items(
        "test", cfg.task.test_items
    )

    async def run() -> dict:
        async with Sandbox(limits, preload=tuple(cfg.sandbox.preload)) as sandbox:
            async with _Engine(args, cfg, model, tokenizer) as engine:
                metrics, _ = await evaluate_policy(
                    Rollout(engine, tokenizer, sandbox), tasks, cfg, not args.no_tools, "eval"
                )
            return metrics

    print(json.dumps(asyncio.run(run()), indent=2))
    return 0


def _benchmark_items(args: argparse.Namespace) -> dict[str, list]:
    """The items of every --benchmark, loaded before any model work so a typo fails fast."""
    from tirl.eval.benchmarks import load_benchmark, load_races

    items = {}
    for name in (n.strip() for spec in args.benchmark for n in spec.split(",") if n.strip()):
        try:
            loaded = (
                load_races(args.limit or 200)
                if name == "races"
                else load_benchmark(name, args.data_dir)
            )
        except (ValueError, ImportError) as e:
            raise ConfigError(f"--benchmark {name}: {e}") from None
        key = Path(name).stem if Path(name).suffix in (".jsonl", ".parquet") else name
        items[key] = loaded[: args.limit] if args.limit else loaded
    return items


def _eval_benchmarks(args, cfg, model, tokenizer, limits, items) -> int:
    """`tirl eval MODEL --benchmark ...`: resumable benchmark evaluation with the tool loop."""
    from tirl.eval.benchmark_eval import benchmark_metrics, run_benchmark, write_benchmark_report
    from tirl.rewards.verify import verify_answer
    from tirl.rollout.runner import Rollout, RolloutSettings
    from tirl.sandbox import Sandbox

    k = 1 if args.temperature == 0 else args.k
    settings = RolloutSettings(
        max_model_tokens=args.max_tokens,
        tool_budget=cfg.eval.tool_budget,
        temperature=args.temperature,
        use_tools=not args.no_tools,
        max_output_chars=cfg.sandbox.max_output_chars,
    )
    out_dir = Path(args.out)

    async def run() -> dict:
        results = {}
        async with Sandbox(limits, preload=tuple(cfg.sandbox.preload)) as sandbox:
            async with _Engine(args, cfg, model, tokenizer) as engine:
                rollout = Rollout(engine, tokenizer, sandbox)
                for name, its in items.items():
                    records = await run_benchmark(
                        rollout, name, its, settings, k, out_dir, verify_answer
                    )
                    results[name] = benchmark_metrics(records, k)
        return results

    results = asyncio.run(run())
    paths = write_benchmark_report(results, out_dir, f"tirl eval {args.model}")
    from tirl.eval.viewer import load_trajectories, write_viewer

    trajs = load_trajectories(out_dir)
    paths.append(write_viewer(trajs, out_dir / "viewer.html", "tirl eval", tokenizer=tokenizer))
    print((out_dir / "report.md").read_text())
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tirl.backends.server import serve

    if not Path(args.model).exists() and "/" not in args.model:
        raise ConfigError(f"model {args.model!r} is neither a folder nor a hub name")
    if not 0 <= args.port <= 65535 or args.max_batch < 1:
        raise ConfigError("--port must be in 0..65535 and --max-batch at least 1")
    serve(args.model, args.host, args.port, args.max_batch)
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from tirl.eval.viewer import find_tokenizer, load_trajectories, write_viewer

    path = Path(args.path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist (give a run folder or a trajectories .jsonl)")
    trajs = load_trajectories(path)
    if not trajs:
        raise ConfigError(f"{path} holds no trajectories")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    elif path.is_dir():
        tokenizer = find_tokenizer(path)
    out = (
        Path(args.output)
        if args.output
        else (path if path.is_dir() else path.parent) / "viewer.html"
    )
    write_viewer(trajs, out, f"tirl trajectories: {path}", tokenizer=tokenizer)
    print(f"wrote {out} ({len(trajs)} trajectories)")
    return 0


def _flag_number(args: argparse.Namespace, name: str, cast: type, allow_zero: bool = False):
    """Flag --NAME as a positive (or non-negative) `cast`. Flags are parsed here rather than by
    argparse so that a bad value is a one-line ConfigError naming the flag."""
    raw = getattr(args, name)
    flag = "--" + name.replace("_", "-")
    sign = "a non-negative" if allow_zero else "a positive"
    expected = f"{sign} {'integer' if cast is int else 'number'}"
    try:
        value = cast(raw)
    except ValueError:
        raise ConfigError(f"{flag} must be {expected}, got {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{flag} must be {expected}, got {raw!r}")
    return value


def cmd_sandbox_serve(args: argparse.Namespace) -> int:
    import importlib.util

    from tirl.sandbox.api import SandboxError
    from tirl.sandbox.http import serve
    from tirl.sandbox.local import DEFAULT_PRELOAD, Sandbox, SandboxLimits

    port = _flag_number(args, "port", int, allow_zero=True)
    if port > 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port!r}")
    limits = SandboxLimits(
        timeout_s=_flag_number(args, "timeout_s", float),
        grace_s=_flag_number(args, "grace_s", float),
        memory_mb=_flag_number(args, "memory_mb", int),
        max_output_chars=_flag_number(args, "max_output_chars", int),
    )
    max_timeout_s = _flag_number(args, "max_timeout_s", float)
    if max_timeout_s < limits.timeout_s:
        raise ConfigError(
            f"--max-timeout-s ({args.max_timeout_s}) must be at least --timeout-s ({args.timeout_s})"
        )
    preload = DEFAULT_PRELOAD
    if args.preload is not None:
        preload = tuple(m.strip() for m in args.preload.split(",") if m.strip())
    for module in preload:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(f"--preload: there is no module named {module!r} to preload")
    pool_size = _flag_number(args, "pool_size", int, allow_zero=True)
    idle_ttl_s = _flag_number(args, "idle_ttl_s", float)
    try:
        serve(Sandbox(limits, preload, pool_size), args.host, port, max_timeout_s, idle_ttl_s)
    except SandboxError as err:
        print(f"tirl: error: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tirl",
        description="Train and evaluate language models that reason with a Python interpreter.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "config", nargs="?", help=f"YAML config (default: the bundled {DEFAULT_CONFIG})"
        )
        p.add_argument(
            "overrides", nargs="*", help="dotted overrides, e.g. rl.lr=1e-4 task.digits=4"
        )

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
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser("train", help="the same pipeline as quickstart, from your own config")
    add_config_args(p)
    add_resume_arg(p)
    p.set_defaults(func=cmd_quickstart)

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
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default: 0)")
    p.add_argument("--out", default="runs/ablate", help="output folder (default runs/ablate)")
    p.set_defaults(func=cmd_ablate)

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
        " races (repeatable or comma-separated); without it, the config's arithmetic test split",
    )
    p.add_argument(
        "--data-dir", help="folder or file with the benchmark data (else $TIRL_BENCHMARK_DIR)"
    )
    p.add_argument("-k", type=int, default=4, help="samples per item when sampling (default 4)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 decodes greedily (k = 1)")
    p.add_argument("--max-tokens", type=int, default=512, help="model tokens per trajectory")
    p.add_argument("--limit", type=int, help="only the first N items of each benchmark")
    p.add_argument(
        "--out",
        default="runs/eval",
        help="results folder; rerunning resumes from it (default runs/eval)",
    )
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("config", help="print (or write) the resolved config")
    add_config_args(p)
    p.add_argument("-o", "--output", help="write the resolved YAML here instead of printing it")
    p.set_defaults(func=cmd_config)

    sandbox = sub.add_parser(
        "sandbox", help="serve the Python sandbox to other machines or processes over HTTP"
    )
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    p = sandbox_sub.add_parser(
        "serve",
        help="serve sandbox sessions over HTTP until SIGTERM or Ctrl-C",
        description="Serve stateful sandbox sessions over a JSON HTTP API (see"
        " tirl.sandbox.http). There is no authentication: keep it on 127.0.0.1 or a"
        " private network.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument(
        "--port", default="8765", help="port to bind; 0 picks a free one (default: 8765)"
    )
    p.add_argument(
        "--timeout-s",
        default="5",
        help="default wall-clock limit per cell, in seconds (default: 5)",
    )
    p.add_argument(
        "--max-timeout-s",
        default="60",
        help="cap on the timeout_s of a request, in seconds (default: 60)",
    )
    p.add_argument(
        "--grace-s", default="0.5", help="seconds between the interrupt and the kill (default: 0.5)"
    )
    p.add_argument(
        "--memory-mb", default="1024", help="memory limit per session, in MB (default: 1024)"
    )
    p.add_argument(
        "--max-output-chars", default="8192", help="output kept per stream and cell (default: 8192)"
    )
    p.add_argument(
        "--pool-size", default="4", help="sessions forked ahead of requests (default: 4)"
    )
    p.add_argument(
        "--preload",
        help="comma-separated modules imported once and shared by all sessions; '' for none"
        " (default: math, numpy, sympy and other math modules)",
    )
    p.add_argument(
        "--idle-ttl-s", default="600", help="close sessions idle this many seconds (default: 600)"
    )
    p.set_defaults(func=cmd_sandbox_serve, config=None, overrides=[])  # see _split_overrides

    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible completions API")
    p.add_argument("model", help="model folder or hub name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    p.add_argument("--max-batch", type=int, default=64, help="sequences decoded together")
    p.set_defaults(func=cmd_serve, config=None, overrides=[])

    p = sub.add_parser(
        "view", help="write an HTML viewer of trajectories (model vs interpreter tokens, loss mask)"
    )
    p.add_argument("path", help="a run folder, or a .jsonl of trajectories / eval samples")
    p.add_argument("--tokenizer", help="tokenizer folder or hub name, to show token boundaries")
    p.add_argument("-o", "--output", help="the HTML file (default: viewer.html beside the input)")
    p.set_defaults(func=cmd_view, config=None, overrides=[])

    add_envs_parser(sub)
    add_synth_parser(sub)
    return parser


def _split_overrides(args: argparse.Namespace) -> None:
    """Let the config path be omitted: `tirl quickstart rl.steps=5` is all overrides."""
    if args.config and "=" in args.config and not Path(args.config).exists():
        args.overrides = [args.config, *args.overrides]
        args.config = None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _split_overrides(args)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"tirl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tirl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
