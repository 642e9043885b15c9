"""What `tirl eval` runs (the command, `tirl.cli.eval`, only parses and calls these): a saved
model, a hub name, or OpenAI-compatible servers, evaluated on the config's data.eval sets
(`evaluate_sets`) or on the benchmarks `tirl.eval.benchmark_eval.benchmark_tasks` reads,
resumably, in a locked folder (`eval_benchmarks`). The sandbox, the engine and the rollout settings come from
`tirl.train.runtime`, as in training.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path

from tirl.cliargs import check_model_source
from tirl.config import ConfigError
from tirl.eval.evaluate import check_failed_share


def is_url(model: str) -> bool:
    return model.startswith(("http://", "https://"))


def eval_config(args: argparse.Namespace, cfg):
    """The run config `tirl eval` samples with: the server at MODEL (engine openai), or the
    config's engine serving MODEL."""
    from dataclasses import replace

    if is_url(args.model):
        options = {} if args.request_timeout_s is None else {"timeout_s": args.request_timeout_s}
        rollout = replace(cfg.rollout, engine="openai", urls=[args.model], engine_options=options)
        return replace(cfg, rollout=rollout)
    if args.request_timeout_s is not None:
        raise ConfigError("--request-timeout-s applies to a server URL, not to a model folder")
    return replace(cfg, model=replace(cfg.model, name_or_path=args.model))


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


def evaluate_sets(cfg, model, tokenizer, use_tools: bool) -> int:
    """`tirl eval MODEL` without --benchmark: the config's data.eval sets, as the training
    pipeline evaluates them; prints the metrics, and exit code 1 (FailedSamplesError) when too
    many samples failed."""
    from tirl.eval.evaluate import evaluate_policy, first_failure
    from tirl.tasks import Mixture
    from tirl.tasks.prompts import PromptRenderer
    from tirl.train.pipeline import eval_sets
    from tirl.train.runtime import eval_settings, run_protocol

    sets = eval_sets(cfg, Mixture.from_entries(cfg.data.train, "data.train", cfg.seed))
    renderer = PromptRenderer(
        tokenizer, run_protocol(cfg), system=cfg.prompt.system, chat=cfg.prompt.chat
    )
    settings = eval_settings(cfg, use_tools=use_tools)

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
                    seed=cfg.seed,
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


def eval_benchmarks(args, cfg, model, tokenizer, items) -> int:
    """`tirl eval MODEL --benchmark ...`: resumable benchmark evaluation with the tool loop, in
    a locked --out folder; exit code 1 when too many samples failed (a rerun retries them)."""
    from tirl.eval.benchmark_eval import benchmark_metrics, run_benchmark, write_benchmark_report
    from tirl.files import lock_folder
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
                    rollout, name, its, settings, k, out_dir, source=source, seed=cfg.seed
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
