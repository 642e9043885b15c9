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

DEFAULT_CONFIG = "quickstart.yaml"


def _bundled_config(name: str) -> Path:
    return Path(str(resources.files("tirl") / "configs" / name))


def _load_run_config(path: str | None, overrides: list[str]):
    from tirl.train.config import RunConfig

    return load_config(RunConfig, path or _bundled_config(DEFAULT_CONFIG), overrides)


def cmd_quickstart(args: argparse.Namespace) -> int:
    from tirl.quickstart import run_quickstart

    cfg = _load_run_config(args.config, args.overrides)
    run_dir, results = run_quickstart(cfg)
    print(f"\nrun folder: {run_dir}\nreport:     {run_dir / 'report.html'}  (and report.md)")
    print(f"wall time:  {results['wall_s']:.0f} s")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    cfg = _load_run_config(args.config, args.overrides)
    if args.output:
        dump_yaml(cfg, args.output)
    else:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from tirl.backends.hf import HFEngine
    from tirl.envs.arithmetic import ArithmeticEnv
    from tirl.models.tiny import load_policy
    from tirl.quickstart import evaluate_policy
    from tirl.rollout.runner import Rollout
    from tirl.sandbox import Sandbox, SandboxLimits

    hf_logging.set_verbosity_error()
    cfg = _load_run_config(args.config, args.overrides)
    if not Path(args.model).exists() and "/" not in args.model:
        raise ConfigError(f"model {args.model!r} is neither a folder nor a hub name (owner/name)")
    model, tokenizer = load_policy(args.model)
    model.to(cfg.device).eval()
    tasks = ArithmeticEnv(tuple(cfg.task.kinds), cfg.task.digits, cfg.seed).items(
        "test", cfg.task.test_items
    )
    limits = SandboxLimits(timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb)

    async def run() -> dict:
        async with Sandbox(limits, preload=tuple(cfg.sandbox.preload)) as sandbox:
            engine = HFEngine(
                model, tokenizer.eos_token_id, max_batch=cfg.rollout_batch, seed=cfg.seed
            )
            metrics, _ = await evaluate_policy(
                Rollout(engine, tokenizer, sandbox), tasks, cfg, not args.no_tools, "eval"
            )
            engine.close()
            return metrics

    print(json.dumps(asyncio.run(run()), indent=2))
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

    p = sub.add_parser(
        "quickstart",
        help="SFT -> RL -> eval of a tiny code-integrated model and a text-only baseline, with a report",
        description="Run the whole loop on CPU: demonstrations, SFT, RL with the interpreter, evaluation, report.",
    )
    add_config_args(p)
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser("train", help="the same pipeline as quickstart, from your own config")
    add_config_args(p)
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser(
        "eval", help="evaluate a saved model (folder or hub name) on the held-out split"
    )
    p.add_argument("model", help="model folder (e.g. runs/quickstart/code/rl) or hub name")
    add_config_args(p)
    p.add_argument("--no-tools", action="store_true", help="evaluate without the interpreter")
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

    add_envs_parser(sub)
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
