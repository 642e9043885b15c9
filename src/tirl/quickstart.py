"""`tirl quickstart`: the whole loop on one CPU, for a code-integrated and a text-only model.

For each variant: make demonstrations (the code variant runs every demonstration's code in
the sandbox), SFT, evaluate, RL, evaluate. Then write a report comparing the two. The tiny
model and its tokenizer are made here from scratch, so nothing is downloaded.

Run folder:
    config.yaml            the resolved configuration
    metrics.jsonl          one line per training step (SFT and RL, both variants)
    eval.json              evaluation metrics per variant and phase
    <variant>/sft, /rl     checkpoints (save_pretrained: model + tokenizer)
    <variant>/rl_state     the RL trainer's checkpoint, for --resume
    samples/*.jsonl        evaluation trajectories
    report.md, report.html, plots/
    .tirl.lock             held while a run works in the folder (`tirl.train.run_folder`)

Nothing lost: checkpoints, models, samples and progress files are written whole or not at all
(`tirl.files`), a phase counts as finished only once its files are complete, and a resume after a
crash or a full disk redoes the phase that was cut off. Evaluation samples whose engine or
sandbox failed (finish_reason "error") are left out of every metric; more than
`eval.max_failed_share` of them stops the run (`FailedSamplesError`) before the evaluation is
recorded as done, so `--resume` evaluates again.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from tirl.backends.hf import HFEngine
from tirl.config import ConfigError, dump_yaml, load_config, to_dict
from tirl.envs.arithmetic import ArithmeticEnv, ArithmeticItem
from tirl.eval.evaluate import check_failed_share, evaluate
from tirl.eval.report import format_summary_table, summary_rows, write_report
from tirl.files import check_plain_name, read_jsonl, replacing, write_text
from tirl.models.tiny import (
    TinyModelSpec,
    build_model,
    is_saved_policy,
    load_policy,
    save_policy,
    train_tokenizer,
)
from tirl.protocol import get_protocol
from tirl.protocol.segments import Trajectory
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox
from tirl.synth import arithmetic as demos_lib
from tirl.train.config import RunConfig
from tirl.train.distributed import DistContext, broadcast_weights, init_from_env, shard_model
from tirl.train.metrics import MetricsLogger
from tirl.train.rl import RLTrainer
from tirl.train.run_folder import run_folder
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


def drop_records(logger: MetricsLogger, variant: str, phase: str, from_step: int = 0) -> None:
    """Remove `metrics.jsonl` records of a phase that is about to be run again from
    `from_step`, so a resumed run logs every step exactly once."""

    def keep(r: dict) -> bool:
        same = r.get("variant") == variant and r.get("phase") == phase
        return not (same and r.get("step", 0) >= from_step)

    logger.keep_only(keep)


class Quickstart:
    """The pipeline, phase by phase. With `resume`, finished phases are loaded from the run
    folder instead of being run again (a finished SFT or RL checkpoint, a finished
    evaluation), and an interrupted RL phase continues from its last checkpoint
    (`<variant>/rl_state`, every `rl.checkpoint_every` steps). An interrupted SFT starts over.
    """

    def __init__(
        self, cfg: RunConfig, run_dir: Path, resume: bool = False, dist: DistContext | None = None
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.resume = resume
        self.dist = dist
        self.is_main = dist is None or dist.is_main  # the one process that writes files
        self.env = ArithmeticEnv(tuple(cfg.task.kinds), cfg.task.digits, cfg.seed)
        self.logger = MetricsLogger(
            run_dir / "metrics.jsonl" if self.is_main else Path(os.devnull),
            cfg.log_tensorboard and self.is_main,
            cfg.log_wandb and self.is_main,
            run_name=cfg.name,
        )
        self.results: dict[str, dict] = {}
        self.samples: list[Trajectory] = []
        self.tokenizer = None  # set by run()

    async def run(self) -> dict:
        cfg = self.cfg
        limits = cfg.sandbox.limits()
        saved = [self.run_dir / v / "sft" for v in cfg.variants]
        saved = [path for path in saved if is_saved_policy(path)]
        if cfg.model.name_or_path:
            _, tokenizer = load_policy(cfg.model.name_or_path)
        elif self.resume and saved:
            _, tokenizer = load_policy(saved[0])  # the ids of the saved models
        else:
            tokenizer = make_tokenizer(cfg, self.env)
        self.tokenizer = tokenizer  # the report shows token boundaries with it
        async with Sandbox(limits, preload=tuple(cfg.sandbox.preload)) as sandbox:
            for variant in cfg.variants:
                await self.run_variant(variant, tokenizer, sandbox)
        self.logger.close()
        return self.results

    async def run_variant(self, variant: str, tokenizer, sandbox: Sandbox) -> None:
        use_tools = variant == "code"
        _seed_everything(self.cfg.seed)
        model = self.make_model(tokenizer)
        self.results[variant] = {}
        await self.sft(variant, model, tokenizer, sandbox, use_tools)
        if self.cfg.rl.steps > 0:
            await self.rl(variant, model, tokenizer, sandbox, use_tools, self.cfg)

    def make_model(self, tokenizer):
        cfg = self.cfg
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
        return model.to(cfg.device).eval()

    def rollout_for(self, model, tokenizer, sandbox: Sandbox, use_tools: bool) -> Rollout:
        engine = HFEngine(
            model, tokenizer.eos_token_id, max_batch=self.cfg.rollout_batch, seed=self.cfg.seed
        )
        return Rollout(engine, tokenizer, sandbox if use_tools else None)

    async def sft(self, variant: str, model, tokenizer, sandbox: Sandbox, use_tools: bool) -> None:
        """Demonstrations, SFT, checkpoint `<variant>/sft`, evaluation."""
        cfg = self.cfg
        if not self.load_finished(model, self.run_dir / variant / "sft"):
            await self.train_sft(variant, model, tokenizer, sandbox, use_tools)
        if self.is_main:
            rollout = self.rollout_for(model, tokenizer, sandbox, use_tools)
            await self.evaluate(variant, "sft", rollout, use_tools, cfg)
            rollout.engine.close()

    def load_finished(self, model, folder: Path) -> bool:
        """On resume, load the weights of a finished phase; False if it must run."""
        if not (self.resume and is_saved_policy(folder)):
            return False
        model.load_state_dict(load_policy(folder)[0].state_dict())
        return True

    async def train_sft(self, variant, model, tokenizer, sandbox, use_tools) -> None:
        cfg = self.cfg
        if self.is_main:
            drop_records(self.logger, variant, "sft")
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
        if self.is_main:
            save_policy(model, tokenizer, self.run_dir / variant / "sft")

    async def rl(
        self, variant: str, model, tokenizer, sandbox: Sandbox, use_tools: bool, cfg: RunConfig
    ) -> None:
        """RL with `cfg` (the run's, or an ablation's), checkpoint `<variant>/rl`, evaluation.

        Under torchrun, `model` stays a full copy that samples (the weight sync refreshes it)
        and a copy sharded with FSDP is trained, on every rank from rank 0's weights.
        """
        trained = model
        if self.dist is not None:
            broadcast_weights(model)
            trained = shard_model(copy.deepcopy(model))
        rollout = self.rollout_for(model, tokenizer, sandbox, use_tools)

        def rl_task(i: int) -> ArithmeticItem:  # prompts SFT never saw
            return self.env.item("train", cfg.sft.examples + i)

        trainer = RLTrainer(
            trained,
            rollout,
            rl_task,
            cfg.rl,
            pad_id=tokenizer.pad_token_id,
            use_tools=use_tools,
            max_output_chars=cfg.sandbox.max_output_chars,
            logger=self.logger,
            variant=variant,
            seed=cfg.seed,
            dist=self.dist,
        )
        state_dir = self.run_dir / variant / "rl_state"
        if not self.load_finished(model, self.run_dir / variant / "rl"):
            if self.resume and (state_dir / "trainer.pt").exists():
                trainer.load_checkpoint(state_dir)
            if self.is_main:
                drop_records(self.logger, variant, "rl", trainer.state.step)
            await trainer.train(checkpoint_dir=state_dir)
            if self.is_main:
                save_policy(model, tokenizer, self.run_dir / variant / "rl")
        if self.is_main:
            await self.evaluate(variant, "rl", rollout, use_tools, cfg)
        rollout.engine.close()

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
        protocol = get_protocol("cir_fences", cfg.rl.boundary)  # the mode RL will run in
        code_demos = iter(demos_lib.code_demonstrations(code_tasks, outputs, tokenizer, protocol))
        text_demos = iter(
            demos_lib.text_demonstrations([t for t, c in zip(tasks, with_code) if not c], tokenizer)
        )
        return [next(code_demos) if c else next(text_demos) for c in with_code]

    async def evaluate(
        self, variant: str, phase: str, rollout: Rollout, use_tools: bool, cfg: RunConfig
    ) -> None:
        progress = self.run_dir / "eval_progress.json"
        done = json.loads(progress.read_text()) if progress.exists() else {}
        samples_path = self.run_dir / "samples" / f"{variant}_{phase}.jsonl"
        if self.resume and phase in done.get(variant, {}) and samples_path.exists():
            metrics = done[variant][phase]
            trajs = [Trajectory.from_dict(d) for d in read_jsonl(samples_path)]
        else:
            tasks = self.env.items("test", cfg.task.test_items)
            label = f"{variant} eval ({phase})"
            metrics, trajs = await evaluate_policy(rollout, tasks, cfg, use_tools, label)
            for traj in trajs:
                traj.meta.update(variant=variant, phase=phase)
            write_text(samples_path, "".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
            # Too many failed samples: stop before the evaluation is recorded as done.
            check_failed_share(
                metrics["eval/failed"],
                metrics["eval/samples"],
                cfg.eval.max_failed_share,
                label,
                "rerun with --resume to evaluate again",
            )
            done.setdefault(variant, {})[phase] = metrics
            write_text(progress, json.dumps(done, indent=2))
        self.results.setdefault(variant, {})[phase] = metrics
        self.samples.extend(trajs[: self.cfg.eval.saved_samples])


async def evaluate_policy(
    rollout: Rollout, tasks: Sequence[ArithmeticItem], cfg: RunConfig, use_tools: bool, label: str
) -> tuple[dict, list[Trajectory]]:
    """A greedy pass ("eval/accuracy"), then avg@k with sampling ("eval/avg@k") when
    `cfg.eval.samples_per_item` > 0. Returns the merged metrics and the greedy trajectories."""
    greedy = RolloutSettings(
        max_model_tokens=cfg.eval.max_model_tokens,
        tool_budget=cfg.eval.tool_budget,
        temperature=0.0,
        use_tools=use_tools,
        max_output_chars=cfg.sandbox.max_output_chars,
        protocol=get_protocol("cir_fences", cfg.rl.boundary),  # as the policy was trained
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
                "eval/failed": metrics["eval/failed"] + sampled["eval/failed"],
                "eval/samples": metrics["eval/samples"] + sampled["eval/samples"],
                "time/eval_s": metrics["time/eval_s"] + sampled["time/eval_s"],
            }
        )
    return metrics, trajs


def check_same_config(cfg: RunConfig, run_dir: Path) -> None:
    """A run folder is resumed only with the config that made it."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"cannot resume {run_dir}: it has no config.yaml (no run started there)")
    saved = load_config(RunConfig, saved_path)
    diffs = [
        key for key, value in _flat(to_dict(cfg)).items() if _flat(to_dict(saved)).get(key) != value
    ]
    if diffs:
        raise ConfigError(
            f"cannot resume {run_dir}: its config.yaml differs in {', '.join(diffs)}; resume with"
            f" the same config (or start a new run under another name)"
        )


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_quickstart(
    cfg: RunConfig, overwrite: bool = True, resume: bool = False
) -> tuple[Path, dict]:
    """Run everything and write the report; returns the run folder and the eval results.
    With `resume`, continue the run in the run folder (see `Quickstart`). A fresh run clears
    only what an earlier run wrote in the folder (`tirl.train.run_folder`); with `overwrite`
    False it refuses a folder that holds a run instead. The folder is locked while the run
    works in it: a second run or resume on it is refused (ConfigError) naming this one."""
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    check_plain_name(cfg.name, "name")
    run_dir = Path(cfg.out_dir) / cfg.name
    if resume:
        check_same_config(cfg, run_dir)  # before the lock: nothing is written for a bad resume
    elif not overwrite and (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} holds a run: pass --resume, or choose another name")
    with run_folder(cfg.out_dir, cfg.name, resume=resume) as run_dir:
        if resume:
            check_same_config(cfg, run_dir)  # again, now that no other run can change it
        return _run_in(cfg, run_dir, resume)


def _run_in(cfg: RunConfig, run_dir: Path, resume: bool) -> tuple[Path, dict]:
    dist = init_from_env(cfg.device)  # under torchrun: RL is sharded, rank 0 writes files
    if dist is None or dist.is_main:
        with replacing(run_dir / "config.yaml") as tmp:
            dump_yaml(cfg, tmp)
    start = time.perf_counter()
    quickstart = Quickstart(cfg, run_dir, resume=resume, dist=dist)
    results = asyncio.run(quickstart.run())  # {variant: {phase: metrics}}
    wall_s = time.perf_counter() - start
    if dist is not None:
        torch.distributed.destroy_process_group()
        if not dist.is_main:
            return run_dir, {"wall_s": wall_s}
    write_text(run_dir / "eval.json", json.dumps({**results, "wall_s": wall_s}, indent=2))
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
