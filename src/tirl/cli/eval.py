"""`tirl eval MODEL`: a saved model, a hub name or OpenAI-compatible servers, evaluated on the
config's data.eval sets or on benchmarks, with the same flags on both roads (-k, --temperature,
--max-tokens, --out). What it runs is `tirl.apps.evaluate`."""

from __future__ import annotations

import argparse

from tirl.cli.common import add_config_args, load_run_config
from tirl.cliargs import number, output_dir, require_device
from tirl.config import ConfigError

# The defaults of the flags both roads take (argparse dest -> default) on a --benchmark run;
# on the config's sets a flag left out keeps the config's eval.* value, and no --out writes
# nothing.
BENCHMARK_DEFAULTS = {"k": 4, "temperature": 1.0, "max_tokens": 512, "out": "runs/eval"}
# The flags of --benchmark runs alone: given without --benchmark they would be ignored, so they
# are refused instead.
BENCHMARK_ONLY = ("limit", "data_dir")


def _check_eval_flags(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen evaluation would ignore; fill the benchmark defaults."""
    from tirl.apps.evaluate import is_url

    if args.tokenizer is not None and not is_url(args.model):
        raise ConfigError("--tokenizer is for a server URL; a model folder has its own tokenizer")
    if is_url(args.model) and not args.tokenizer:
        raise ConfigError("a server URL needs --tokenizer (a folder or hub name) to tokenize")
    given = [name for name in BENCHMARK_ONLY if getattr(args, name) is not None]
    if given and not args.benchmark:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise ConfigError(
            f"{flags}: only for --benchmark runs; without --benchmark, tirl eval evaluates the"
            " config's data.eval sets (set their items in data.eval)"
        )
    if args.benchmark:
        for name, default in BENCHMARK_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)


def cmd_eval(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    from tirl.apps import evaluate as run
    from tirl.eval.benchmark_eval import benchmark_tasks

    hf_logging.set_verbosity_error()
    _check_eval_flags(args)
    # MODEL is model.name_or_path before the config is checked: every check sees that model
    cfg = run.eval_config(args, load_run_config(args.config, run.eval_overrides(args)))
    if args.out is not None:
        run.check_out_folder(args.out)  # a run's folder, or one in use: refused before loading
    require_device(cfg.device)
    # the benchmarks are read before the model loads: a typo fails fast
    items = benchmark_tasks(args.benchmark, args.data_dir, args.limit) if args.benchmark else None
    model, tokenizer = run.eval_policy(args, cfg)
    if items is not None:
        return run.eval_benchmarks(args, cfg, model, tokenizer, items)
    return run.evaluate_sets(
        cfg, model, tokenizer, not args.no_tools, out=args.out, title=f"tirl eval {args.model}"
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a saved model (folder or hub name) or a server on the config's data.eval"
        " sets, or on benchmarks with --benchmark",
        description="Without --benchmark: the config's data.eval sets, a greedy pass then"
        " eval.samples_per_item samples per item; the metrics are printed, and written with the"
        " samples, a report and a trajectory viewer only with --out. MODEL is the config's"
        " model.name_or_path (an override naming another model is refused); the loaded model's"
        " own context bounds each trajectory. With --benchmark: resumable benchmark runs into"
        " --out (default runs/eval). --out never goes into a training run's folder.",
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
        help="math500, aime24, aime25, amc23, olymmath-easy, olymmath-hard, hmmt, a file,"
        " rg:<reasoning-gym dataset> (e.g. rg:gsm_symbolic; --limit items), or"
        " races (repeatable or comma-separated); without it, the config's data.eval sets",
    )
    p.add_argument(
        "--data-dir",
        help="folder or file with the benchmark data (else $TIRL_BENCHMARK_DIR; --benchmark only)",
    )
    p.add_argument(
        "-k",
        type=number(int, ">= 1"),
        help="samples per item when sampling, >= 1 (--benchmark: default 4; else"
        " eval.samples_per_item, default the config's)",
    )
    p.add_argument(
        "--temperature",
        type=number(float, "[0, 100]"),
        help="of the sampled pass, in [0, 100]; 0 decodes greedily only (--benchmark: k = 1,"
        " default 1.0; else eval.temperature, 0 = eval.samples_per_item 0)",
    )
    p.add_argument(
        "--max-tokens",
        type=number(int, ">= 1"),
        help="model tokens per trajectory, >= 1 (--benchmark: default 512; else"
        " eval.max_model_tokens); the model's own context bounds it too",
    )
    p.add_argument(
        "--request-timeout-s",
        type=number(float, "(0, 86400]"),
        help="with a server URL: the longest one request may take before its sample counts as"
        " failed (default 600)",
    )
    p.add_argument(
        "--limit",
        type=number(int, ">= 1"),
        help="only the first N items of each benchmark (--benchmark only)",
    )
    p.add_argument(
        "--out",
        type=output_dir,
        help="results folder, locked while eval runs; never a training run's folder or one"
        " inside it. --benchmark: rerunning resumes from it (default runs/eval); else"
        " eval.json, samples/<set>.jsonl, report.md and viewer.html (default: none, the"
        " metrics are only printed)",
    )
    p.set_defaults(func=cmd_eval)
