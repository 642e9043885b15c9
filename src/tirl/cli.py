"""The `tirl` command. Subcommands hold no logic: they parse, load a config and call in."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from importlib import resources
from pathlib import Path

from tirl.config import ConfigError, dump_yaml, load_config, to_dict

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
