"""`tirl quickstart`: the whole loop on one CPU, for a code-integrated and a text-only model.

For each variant: make demonstrations (the code variant runs every demonstration's code in
the sandbox), SFT, evaluate, RL, evaluate. Then write a report comparing the two. The tiny
model and its tokenizer are made here from scratch, so nothing is downloaded.

Run folder:
    config.yaml            the resolved configuration
    metrics.jsonl          one line per training step (SFT and RL, both variants)
    eval.json              evaluation metrics per variant and phase
    <variant>/sft, /rl     checkpoints (save_pretrained: model + tokenizer)
    samples/*.jsonl        evaluation trajectories
    report.md, report.html, plots/
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from tirl.backends.hf import HFEngine
from tirl.config import dump_yaml, to_dict
from tirl.envs.arithmetic import ArithmeticEnv, Task
from tirl.eval.evaluate import evaluate
from tirl.eval.report import format_summary_table, summary_rows, write_report
from tirl.models.tiny import TinyModelSpec, build_model, load_policy, save_policy, train_tokenizer
from tirl.protocol.segments import Trajectory
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.synth import arithmetic as demos_lib
from tirl.train.config import RunConfig
from tirl.train.metrics import MetricsLogger
from tirl.train.rl import RLTrainer
from tirl.train.sft import train_sft


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def make_tokenizer(cfg: RunConfig, env: ArithmeticEnv):
    """Train the BPE tokenizer on texts of both demonstration formats."""
    tasks = env.items("train", cfg.model.tokenizer_corpus_items, start=10**7)
    texts = []
    for task in tasks:
        texts.append("".join(t for _, t in demos_lib.demonstration_texts(task, task.answer)))
        texts.append("".join(t for _, t in demos_lib.text_only_texts(task)))
    return train_tokenizer(texts, vocab_size=cfg.model.vocab_size)


class Quickstart:
    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.env = ArithmeticEnv(tuple(cfg.task.kinds), cfg.task.digits, cfg.seed)
        self.logger = MetricsLogger(
            run_dir / "metrics.jsonl", cfg.log_tensorboard, cfg.log_wandb, run_name=cfg.name
        )
        self.results: dict[str, dict] = {}
        self.samples: list[Trajectory] = []
        self.tokenizer = None  # set by run()

    async def run(self) -> dict:
        cfg = self.cfg
        limits = SandboxLimits(timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb)
        if cfg.model.name_or_path:
            _, tokenizer = load_policy(cfg.model.name_or_path)
        else:
            tokenizer = make_tokenizer(cfg, self.env)
        self.tokenizer = tokenizer  # the report shows token boundaries with it
        async with Sandbox(limits, preload=tuple(cfg.sandbox.preload)) as sandbox:
            for variant in cfg.variants:
                await self.run_variant(variant, tokenizer, sandbox)
        self.logger.close()
        return self.results

    async def run_variant(self, variant: str, tokenizer, sandbox: Sandbox) -> None:
        cfg = self.cfg
        use_tools = variant == "code"
        _seed_everything(cfg.seed)
        if cfg.model.name_or_path:
            model, _ = load_policy(cfg.model.name_or_path)
        else:
            spec = TinyModelSpec(
                cfg.model.arch,
                cfg.model.hidden_size,
                cfg.model.layers,
                cfg.model.heads,
                cfg.model.max_positions,
            )
            model = build_model(tokenizer, spec, cfg.seed)
        model.to(cfg.device).eval()
        engine = HFEngine(model, tokenizer.eos_token_id, max_batch=cfg.rollout_batch, seed=cfg.seed)
        rollout = Rollout(engine, tokenizer, sandbox if use_tools else None)
        self.results[variant] = {}

        demos = await self.demonstrations(use_tools, tokenizer, sandbox)
        train_sft(
            model,
            demos,
            cfg.sft,
            pad_id=tokenizer.pad_token_id,
            seed=cfg.seed,
            logger=self.logger,
            variant=variant,
        )
        save_policy(model, tokenizer, self.run_dir / variant / "sft")
        await self.evaluate(variant, "sft", rollout, use_tools)

        if cfg.rl.steps > 0:
            rl_tasks = self.env.stream("train", start=cfg.sft.examples)  # prompts SFT never saw
            trainer = RLTrainer(
                model,
                rollout,
                rl_tasks,
                cfg.rl,
                pad_id=tokenizer.pad_token_id,
                use_tools=use_tools,
                max_output_chars=cfg.sandbox.max_output_chars,
                logger=self.logger,
                variant=variant,
            )
            await trainer.train()
            save_policy(model, tokenizer, self.run_dir / variant / "rl")
            await self.evaluate(variant, "rl", rollout, use_tools)
        engine.close()

    async def demonstrations(
        self, use_tools: bool, tokenizer, sandbox: Sandbox
    ) -> list[Trajectory]:
        """SFT data: for the code variant, a `sft.code_share` share of tool-using
        demonstrations (their code run in the sandbox) and text answers for the rest."""
        cfg = self.cfg
        tasks = self.env.items("train", cfg.sft.examples)
        if not use_tools:
            return demos_lib.text_demonstrations(tasks, tokenizer)
        pick = random.Random(cfg.seed)
        with_code = [pick.random() < cfg.sft.code_share for _ in tasks]
        code_tasks = [t for t, c in zip(tasks, with_code) if c]
        outputs = await demos_lib.run_codes(sandbox, code_tasks, cfg.sandbox.max_output_chars)
        code_demos = iter(demos_lib.code_demonstrations(code_tasks, outputs, tokenizer))
        text_demos = iter(
            demos_lib.text_demonstrations([t for t, c in zip(tasks, with_code) if not c], tokenizer)
        )
        return [next(code_demos) if c else next(text_demos) for c in with_code]

    async def evaluate(self, variant: str, phase: str, rollout: Rollout, use_tools: bool) -> None:
        tasks = self.env.items("test", self.cfg.task.test_items)
        metrics, trajs = await evaluate_policy(
            rollout, tasks, self.cfg, use_tools, f"{variant} eval ({phase})"
        )
        self.results[variant][phase] = metrics
        samples_dir = self.run_dir / "samples"
        samples_dir.mkdir(exist_ok=True)
        with (samples_dir / f"{variant}_{phase}.jsonl").open("w") as f:
            for traj in trajs:
                traj.meta.update(variant=variant, phase=phase)
                f.write(json.dumps(traj.to_dict()) + "\n")
        self.samples.extend(trajs[: self.cfg.eval.saved_samples])


async def evaluate_policy(
    rollout: Rollout, tasks: Sequence[Task], cfg: RunConfig, use_tools: bool, label: str
) -> tuple[dict, list[Trajectory]]:
    """A greedy pass ("eval/accuracy"), then avg@k with sampling ("eval/avg@k") when
    `cfg.eval.samples_per_item` > 0. Returns the merged metrics and the greedy trajectories."""
    greedy = RolloutSettings(
        max_model_tokens=cfg.eval.max_model_tokens,
        tool_budget=cfg.eval.tool_budget,
        temperature=0.0,
        use_tools=use_tools,
        max_output_chars=cfg.sandbox.max_output_chars,
    )
    metrics, trajs = await evaluate(rollout, tasks, greedy, progress=f"{label}, greedy")
    k = cfg.eval.samples_per_item
    if k > 0:
        sampled, _ = await evaluate(
            rollout,
            tasks,
            replace(greedy, temperature=cfg.eval.temperature),
            k,
            progress=f"{label}, avg@{k}",
        )
        metrics.update(
            {
                "eval/avg@k": sampled["eval/accuracy"],
                "eval/pass@k": sampled["eval/pass@k"],
                "eval/k": sampled["eval/k"],
                "eval/temperature": sampled["eval/temperature"],
                "time/eval_s": metrics["time/eval_s"] + sampled["time/eval_s"],
            }
        )
    return metrics, trajs


def run_quickstart(cfg: RunConfig, overwrite: bool = True) -> tuple[Path, dict]:
    """Run everything and write the report; returns the run folder and the eval results."""
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    run_dir = Path(cfg.out_dir) / cfg.name
    if run_dir.exists() and overwrite:
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    quickstart = Quickstart(cfg, run_dir)
    results = asyncio.run(quickstart.run())  # {variant: {phase: metrics}}
    wall_s = time.perf_counter() - start
    (run_dir / "eval.json").write_text(json.dumps({**results, "wall_s": wall_s}, indent=2))
    write_report(
        run_dir,
        eval_results=results,
        metrics_path=run_dir / "metrics.jsonl",
        samples=quickstart.samples,
        config=to_dict(cfg),
        tokenizer=quickstart.tokenizer,
    )
    print(format_summary_table(summary_rows(results)))
    return run_dir, {**results, "wall_s": wall_s}
