"""`tirl eval MODEL`: a saved model, a hub name or OpenAI-compatible servers, evaluated on the
config's data.eval sets or on benchmarks. What it runs is `tirl.apps.evaluate`."""

from __future__ import annotations

import argparse

from tirl.cli.common import add_config_args, load_run_config
from tirl.cliargs import number, output_dir, require_device
from tirl.config import ConfigError

# The flags of `tirl eval --benchmark` runs (argparse dest -> default): given without
# --benchmark they would be ignored, so they are refused instead.
BENCHMARK_FLAGS = {"k": 4, "temperature": 1.0, "max_tokens": 512, "limit": None,
                   "out": "runs/eval", "data_dir": None}  # fmt: skip


def _check_eval_flags(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen evaluation would ignore; fill the benchmark defaults."""
    from tirl.apps.evaluate import is_url

    if args.tokenizer is not None and not is_url(args.model):
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


def cmd_eval(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from tirl.apps import evaluate as run
    from tirl.eval.benchmark_eval import benchmark_tasks

    hf_logging.set_verbosity_error()
    _check_eval_flags(args)
    cfg = run.eval_config(args, load_run_config(args.config, args.overrides))
    require_device(cfg.device)
    # the benchmarks are read before the model loads: a typo fails fast
    items = benchmark_tasks(args.benchmark, args.data_dir, args.limit) if args.benchmark else None
    model, tokenizer = run.eval_policy(args, cfg)
    if items is not None:
        return run.eval_benchmarks(args, cfg, model, tokenizer, items)
    return run.evaluate_sets(cfg, model, tokenizer, use_tools=not args.no_tools)


def add_parser(sub) -> None:
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
