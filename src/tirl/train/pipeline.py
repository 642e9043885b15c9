"""`tirl train CONFIG`: the one training pipeline, for any task sources, engine and protocol.

For each variant (`code`: the interpreter is on; `text`: a text-only baseline): evaluate the
model as loaded (phase `base`, with `eval.base`), make the demonstrations, SFT, evaluate, RL,
evaluate. Then write a report comparing them. `tirl
quickstart` is this pipeline with the bundled preset `tirl/presets/quickstart.yaml` (arithmetic,
a tiny model and tokenizer made from scratch, nothing downloaded).

What is read from the config:
- tasks: `data.train`, a weighted mixture of registered task sources (`tirl.tasks`). SFT's
  demonstrations are the mixture's first `sft.examples` train items; RL task i is item
  `sft.examples + i` (prompts SFT never saw). With `sft.stages`, each stage's demonstrations
  are its own mixture's first items, trained on in order for the stage's steps, and RL starts
  at the first data.train position past every item a stage saw (`first_rl_position`).
  `data.eval` names the evaluation sets.
- prompts: `prompt.chat` / `prompt.system` (`tirl.tasks.prompts.PromptRenderer`: plain text or
  the tokenizer's chat template, always as token ids); `protocol` (markdown fences or
  AgentMath tags) with `protocol.boundary`, the same in SFT, RL and evaluation.
- demonstrations: `sft.data` (a `tirl synth` file, recorded outputs, for the code variant), or
  each source's teacher-free `demonstration(task, use_tools)`: a `sft.code_share` share of the
  code variant's use the interpreter (their code run in the sandbox), the rest answer in text.
- scoring: every trajectory is scored by its own task (`tirl.tasks.scoring`); RL rewards follow
  `rl.reward` (`task`: the scorer's reward, e.g. RACES's partial credit).
- engine: `rollout.engine` (`tirl.train.engines`); only `hf` receives the trained weights.

Run folder:
    config.yaml            the resolved configuration
    metrics.jsonl          one line per training step (SFT and RL, both variants); RL-time
                           evaluations (`eval.every_rl_steps`) as phase "rl_eval"
    <variant>/metrics.jsonl, /eval_progress.json   with `parallel_variants`: each variant's
                           own, merged into metrics.jsonl when every variant is done
    eval.json              {variant: {phase: {eval set: metrics}}}
    <variant>/sft, /rl     checkpoints (save_pretrained: model + tokenizer)
    <variant>/rl_state     the RL trainer's checkpoint, for --resume
    samples/<variant>_<phase>_<set>.jsonl   evaluation trajectories
    report.md, report.html, plots/
    .tirl.lock             held while a run works in the folder (`tirl.train.run_folder`)

Nothing lost: checkpoints, models, samples and progress files are written whole or not at all
(`tirl.files`), a phase counts as finished only once its files are complete, and a resume after
a crash or a full disk redoes the phase that was cut off. Evaluation samples whose engine or
sandbox failed are left out of every metric; more than `eval.max_failed_share` of them stops the
run (`FailedSamplesError`) before the evaluation is recorded as done, so `--resume` evaluates
again.

Evaluation and the report are `tirl.eval`'s; `train` does not import `eval`
(docs/architecture.md), so the caller hands them in as an `Evaluation` (`tirl.cli` does).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import random
import threading
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging

from tirl.backends.engine import close_engine
from tirl.config import ConfigError, dump_yaml, load_config, to_dict
from tirl.cpu import configure_threads
from tirl.files import check_plain_name, json_text, read_jsonl, replacing, write_text
from tirl.models.lora import add_lora
from tirl.models.saved import load_saved_weights
from tirl.models.tiny import (
    TinyModelSpec,
    build_model,
    is_saved_policy,
    load_policy,
    loading,
    save_policy,
    set_gradient_checkpointing,
    tiny_config,
    train_tokenizer,
)
from tirl.plugins import load_plugins
from tirl.protocol import Protocol
from tirl.protocol.segments import Trajectory
from tirl.rollout.engines import ENGINES
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.run import build
from tirl.run.build import eval_sets, run_protocol
from tirl.run.config import RunConfig
from tirl.run.evaluation import AgentRollouts, Evaluation
from tirl.sandbox import SandboxClient
from tirl.tasks import Mixture, Task
from tirl.tasks.base import Code
from tirl.tasks.demos import demo_segment_texts, demo_trajectory, run_demo_codes
from tirl.tasks.prompts import PLAIN_TEMPLATE, PromptRenderer
from tirl.train.apart import run_apart
from tirl.train.curriculum import check_bucket_fields
from tirl.train.distributed import (
    DistContext,
    broadcast_weights,
    fsdp_policy,
    init_from_env,
    leave_process_group,
    shard_model,
)
from tirl.train.feed import RolloutFeed
from tirl.train.metrics import MetricsLogger
from tirl.train.rl import RLTrainer
from tirl.train.run_folder import run_folder
from tirl.train.sft import train_sft, train_sft_stages

# The tokenizer's texts: train items far past any run's for sources that make an item at any
# position at no cost (arithmetic hashes its seed from the index; the quickstart's tokenizer has
# always been trained on these); other sources generate or read in order, so their first items.
TOKENIZER_CORPUS_START = 10**7
FAR_CORPUS_SOURCES = ("arithmetic",)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def make_tokenizer(cfg: RunConfig, mixture: Mixture, protocol: Protocol):
    """Train the BPE tokenizer on prompts and both demonstration styles of train items (see
    `TOKENIZER_CORPUS_START`), each source by its weight. A source without a demonstrator gives
    its prompt and reference answer. With `prompt.chat`, a chat tokenizer (`train_tokenizer`)."""
    n = cfg.model.tokenizer_corpus_items
    texts = []
    for source, weight in zip(mixture.sources, mixture.weights):
        start = TOKENIZER_CORPUS_START if source.name in FAR_CORPUS_SOURCES else 0
        for j in range(max(1, round(n * weight))):
            task = source.item("train", start + j)
            prompt = PLAIN_TEMPLATE.format(problem=task.problem)
            for use_tools in (True, False):
                parts = source.demonstration(task, use_tools)
                if parts is None:
                    texts.append(prompt + task.answer)
                    break
                outputs = [task.answer for p in parts if isinstance(p, Code)]
                texts.append(
                    prompt + "".join(t for _, t in demo_segment_texts(protocol, parts, outputs))
                )
    # prompt.chat: the tiny tokenizer carries a chat template (Qwen2.5's turns), so chat
    # prompts and an agent program's chat calls (rollout.agent) work with it too
    return train_tokenizer(
        texts, vocab_size=cfg.model.vocab_size, chat_template=cfg.prompt.chat is True
    )


def first_rl_position(cfg: RunConfig, mixture: Mixture, stages: list[Mixture]) -> int:
    """The data.train position of RL's first task. Without `sft.stages`, `sft.examples` (SFT
    saw the items before it). With them, the first position past every item a stage's
    demonstrations came from: an item is its source's (same keys) train index, so where a stage
    shares a source with data.train, RL starts after the last index of it the stage used."""
    if not cfg.sft.stages:
        return cfg.sft.examples
    seen: dict[str, int] = {}  # a source's repr (name and every key) -> indices a stage used
    for stage, mix in zip(cfg.sft.stages, stages):
        for position in range(stage.examples or cfg.sft.examples):
            s, index = mix.turn(position)
            key = repr(mix.sources[s])
            seen[key] = max(seen.get(key, 0), index + 1)
    need = [seen.get(repr(source), 0) for source in mixture.sources]
    counts = [0] * len(mixture.sources)
    position = 0
    while any(c < n for c, n in zip(counts, need)):
        counts[mixture.turn(position)[0]] += 1
        position += 1
    return position


def tiny_spec(cfg: RunConfig) -> TinyModelSpec:
    m = cfg.model
    return TinyModelSpec(m.arch, m.hidden_size, m.layers, m.heads, m.max_positions)


def with_lora(model, cfg: RunConfig):
    """`model` with `model.lora`'s adapters, every other weight frozen; a target the model
    does not have is a ConfigError naming it."""
    lora = cfg.model.lora
    try:
        return add_lora(model, lora.rank, lora.alpha, lora.dropout, lora.targets)
    except ValueError as e:  # peft: a target the model does not have
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"model.lora.targets {lora.targets}: {first}", "model.lora") from None


def check_lora_targets(cfg: RunConfig) -> None:
    """`model.lora.targets` the model has, checked before the run folder is made, on a copy of
    the model without weights (torch's meta device: built from its config in a few seconds).
    'all-linear' fits every model, and LoRA off checks nothing."""
    lora = cfg.model.lora
    if not lora.rank or lora.targets == ["all-linear"]:
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    if cfg.model.name_or_path:
        config = loading(cfg.model.name_or_path, AutoConfig.from_pretrained)
    else:
        config = tiny_config(tiny_spec(cfg), cfg.model.vocab_size, 0, 1)
    with torch.device("meta"):
        with_lora(AutoModelForCausalLM.from_config(config), cfg)


def drop_records(logger: MetricsLogger, variant: str, phase: str, from_step: int = 0) -> None:
    """Remove `metrics.jsonl` records of a phase that is about to be run again from
    `from_step`, so a resumed run logs every step exactly once."""

    def keep(r: dict) -> bool:
        same = r.get("variant") == variant and r.get("phase") == phase
        return not (same and r.get("step", 0) >= from_step)

    logger.keep_only(keep)


class Pipeline:
    """The pipeline, phase by phase. With `resume`, finished phases are loaded from the run
    folder instead of being run again (a finished SFT or RL checkpoint, a finished
    evaluation), and an interrupted RL phase continues from its last checkpoint
    (`<variant>/rl_state`, every `rl.checkpoint_every` steps). An interrupted SFT starts over.
    """

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        evaluation: Evaluation,
        resume: bool = False,
        dist: DistContext | None = None,
        own_files: bool = False,
        agents: AgentRollouts | None = None,
    ) -> None:
        """`own_files`: this pipeline runs one variant beside others (`parallel_variants`), and
        logs to `<variant>/metrics.jsonl` and `<variant>/eval_progress.json`. `agents`: RL's
        rollout when `rollout.agent.command` is set (`tirl.apps.agents.agent_rollout`: an
        agent program through the training gateway), made from tirl's own rollout, the task
        stream and the config."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.evaluation = evaluation
        self.agents = agents
        if cfg.rollout.agent.command and agents is None:
            raise ConfigError(
                "rollout.agent.command: this caller cannot run an agent program (tirl train can)",
                "rollout.agent.command",
            )
        self.resume = resume
        self.dist = dist
        self.is_main = dist is None or dist.is_main  # the one process that writes files
        self.mixture = Mixture.from_entries(cfg.data.train, "data.train", cfg.seed)
        self.stage_mixtures = [
            Mixture.from_entries(stage.data, f"sft.stages[{k}].data", cfg.seed)
            for k, stage in enumerate(cfg.sft.stages)
        ]
        self.rl_start = first_rl_position(cfg, self.mixture, self.stage_mixtures)
        if cfg.rl.curriculum.enabled and cfg.rl.steps > 0:  # a bad key now, not after SFT
            check_bucket_fields(cfg.rl.curriculum, self.mixture.item("train", self.rl_start))
        self.eval_tasks = eval_sets(cfg, self.mixture)
        logs = run_dir / cfg.variants[0] if own_files else run_dir
        self.progress_path = logs / "eval_progress.json"
        self.logger = MetricsLogger(
            logs / "metrics.jsonl" if self.is_main else Path(os.devnull),
            cfg.log_tensorboard and self.is_main,
            cfg.log_wandb and self.is_main,
            run_name=cfg.name,
        )
        self.results: dict[str, dict] = {}
        self.samples: list[Trajectory] = []
        self.tokenizer = None  # set by prepare()
        self.renderer: PromptRenderer | None = None

    # ------------------------------------------------------------------ setup
    @property
    def trains_here(self) -> bool:
        """True when the policy lives in this process: the engine samples it or receives its
        weights (hf, vllm); else the run evaluates servers only."""
        from tirl.rollout.engines import ENGINES

        return ENGINES[self.cfg.rollout.engine].receives_weights

    def prepare(self, tokenizer=None) -> None:
        """The tokenizer (loaded, a saved run's on resume, or trained on the task corpus) and
        the prompt renderer."""
        cfg = self.cfg
        if tokenizer is None:
            saved = [self.run_dir / v / "sft" for v in cfg.variants]
            saved = [path for path in saved if is_saved_policy(path)]
            if cfg.model.name_or_path:
                from transformers import AutoTokenizer

                tokenizer = loading(cfg.model.name_or_path, AutoTokenizer.from_pretrained)
                if tokenizer.pad_token_id is None:
                    tokenizer.pad_token = tokenizer.eos_token
            elif self.resume and saved:
                _, tokenizer = load_policy(saved[0])  # the ids of the saved models
            else:
                tokenizer = make_tokenizer(cfg, self.mixture, run_protocol(cfg))
        self.tokenizer = tokenizer  # the report shows token boundaries with it
        self.renderer = PromptRenderer(
            tokenizer, run_protocol(cfg), system=cfg.prompt.system, chat=cfg.prompt.chat
        )

    async def run(self, tokenizer=None) -> dict:
        cfg = self.cfg
        # The sandbox first: an unreachable server or cluster is one line before any work.
        async with build.sandbox_for(cfg) as sandbox:
            self.prepare(tokenizer)
            for variant in cfg.variants:
                await self.run_variant(variant, sandbox)
        self.logger.close()
        return self.results

    async def run_variant(self, variant: str, sandbox: SandboxClient) -> None:
        use_tools = variant == "code"
        seed_everything(self.cfg.seed)
        model = self.make_model() if self.trains_here else None
        self.results[variant] = {}
        if self.cfg.eval.base and self.is_main:  # the model as loaded, before any training
            await self.evaluate_model(variant, "base", model, sandbox, use_tools)
        await self.sft(variant, model, sandbox, use_tools)
        if self.cfg.rl.steps > 0:
            await self.rl(variant, model, sandbox, use_tools, self.cfg)

    def make_model(self):
        """The policy: loaded from `model.name_or_path` or a tiny one from scratch, its weights
        in `model.dtype`, with gradient checkpointing when asked for."""
        cfg = self.cfg
        if cfg.model.name_or_path:
            model, _ = load_policy(cfg.model.name_or_path, dtype=cfg.model.dtype)
        else:
            model = build_model(self.tokenizer, tiny_spec(cfg), cfg.seed, dtype=cfg.model.dtype)
        if cfg.model.lora.rank:
            if self.dist is not None:
                raise ConfigError(
                    "model.lora.rank: LoRA does not run under torchrun here (FSDP shards the"
                    " frozen base too); train adapters at scale with verl (docs/verl.md)",
                    "model.lora.rank",
                )
            model = with_lora(model, cfg)
        set_gradient_checkpointing(model, cfg.model.gradient_checkpointing)
        return model.to(cfg.device).eval()

    def prompt_ids(self, task: Task) -> list[int]:
        return self.renderer.prompt_ids(task.problem)

    def rollout_for(self, variant: str, model, sandbox: SandboxClient, use_tools: bool) -> Rollout:
        """The run's engine over `model` (`tirl.run.build`); an engine that serves a saved
        model starts from `model` saved in `<variant>/engine_policy`."""
        return build.rollout_for(
            self.cfg,
            model,
            self.tokenizer,
            self.renderer.eos_id,
            sandbox if use_tools else None,
            self.run_dir / variant / "engine_policy",
        )

    # ------------------------------------------------------------------ phases
    async def sft(self, variant: str, model, sandbox: SandboxClient, use_tools: bool) -> None:
        """Demonstrations, SFT, checkpoint `<variant>/sft`, evaluation."""
        if model is not None and not self.load_finished(model, self.run_dir / variant / "sft"):
            await self.train_sft(variant, model, sandbox, use_tools)
        if self.is_main:
            await self.evaluate_model(variant, "sft", model, sandbox, use_tools)

    async def evaluate_model(self, variant, phase, model, sandbox, use_tools) -> None:
        """Every eval set, sampled from `model` as it is now, recorded as `phase`."""
        rollout = self.rollout_for(variant, model, sandbox, use_tools)
        try:
            await self.evaluate(variant, phase, rollout, use_tools, self.cfg)
        finally:
            await close_engine(rollout.engine)

    def load_finished(self, model, folder: Path) -> bool:
        """On resume, load the weights of a finished phase; False if it must run."""
        if not (self.resume and is_saved_policy(folder)):
            return False
        load_saved_weights(model, folder)
        return True

    async def train_sft(self, variant: str, model, sandbox: SandboxClient, use_tools: bool) -> None:
        cfg = self.cfg
        if self.is_main:
            drop_records(self.logger, variant, "sft")
        if cfg.sft.stages:
            stages = []
            for k, (stage, mix) in enumerate(zip(cfg.sft.stages, self.stage_mixtures)):
                n = stage.examples or cfg.sft.examples
                where = f"sft.stages[{k}].data"
                demos = await self.demonstrations(use_tools, sandbox, mix, n, where)
                stages.append((demos, stage.steps))
            train_sft_stages(
                model,
                stages,
                cfg.sft,
                pad_id=self.tokenizer.pad_token_id,
                seed=cfg.seed,
                logger=self.logger,
                variant=variant,
            )
        elif cfg.sft.steps > 0:
            demos = await self.demonstrations(use_tools, sandbox)
            train_sft(
                model,
                demos,
                cfg.sft,
                pad_id=self.tokenizer.pad_token_id,
                seed=cfg.seed,
                logger=self.logger,
                variant=variant,
            )
        if self.is_main:
            save_policy(model, self.tokenizer, self.run_dir / variant / "sft")

    async def rl(
        self, variant: str, model, sandbox: SandboxClient, use_tools: bool, cfg: RunConfig
    ):
        """RL with `cfg` (the run's, or an ablation's), checkpoint `<variant>/rl`, evaluation.

        Under torchrun, `model` stays a full copy that samples (the weight sync refreshes it)
        and a copy sharded with FSDP is trained, on every rank from rank 0's weights.
        """
        trained = model
        if self.dist is not None:
            broadcast_weights(model)
            trained = shard_model(copy.deepcopy(model), fsdp_policy(cfg.rl))
        finished = self.load_finished(model, self.run_dir / variant / "rl")
        rollout = self.rollout_for(variant, model, sandbox, use_tools)
        first = self.rl_start

        def rl_task(i: int) -> Task:  # prompts SFT never saw
            return self.mixture.item("train", first + i)

        sampler = rollout
        if cfg.rollout.agent.command:  # the agent program samples, through the gateway
            sampler = self.agents(rollout, rl_task, cfg)
        feed = RolloutFeed(
            sampler, rl_task, cfg.rl, prompt_of=self.prompt_ids, seed=cfg.seed, dist=self.dist
        )
        trainer = RLTrainer(
            trained,
            feed,
            settings=build.rl_settings(cfg, use_tools),
            pad_id=self.tokenizer.pad_token_id,
            logger=self.logger,
            variant=variant,
            capabilities=build.engine_capabilities(cfg),
        )
        state_dir = self.run_dir / variant / "rl_state"
        try:
            if not finished:
                if self.resume and (state_dir / "trainer.pt").exists():
                    trainer.load_checkpoint(state_dir)
                if self.is_main:
                    drop_records(self.logger, variant, "rl", trainer.state.step)
                    drop_records(self.logger, variant, "rl_eval", trainer.state.step + 1)
                await self.train_rl(variant, trainer, rollout, use_tools, cfg, state_dir)
                if self.is_main:
                    save_policy(model, self.tokenizer, self.run_dir / variant / "rl")
            if self.is_main:
                await self.evaluate(variant, "rl", rollout, use_tools, cfg)
        finally:
            await close_engine(rollout.engine)

    async def train_rl(self, variant, trainer, rollout, use_tools, cfg, state_dir) -> None:
        """All RL steps; every `eval.every_rl_steps` a greedy pass over each eval set, logged
        as `eval/<set>/...` with phase "rl_eval" at the step count reached."""
        every = cfg.eval.every_rl_steps
        steps = cfg.rl.steps
        while trainer.state.step < steps:
            until = steps if not every else min(steps, (trainer.state.step // every + 1) * every)
            await trainer.train(until=until, checkpoint_dir=state_dir)
            if every and trainer.state.step < steps and self.is_main:
                await self.evaluate_during_rl(variant, trainer.state.step, rollout, use_tools)

    async def evaluate_during_rl(self, variant, step, rollout, use_tools) -> None:
        record: dict = {"variant": variant, "phase": "rl_eval", "step": step}
        for name, tasks in self.eval_tasks.items():
            metrics, _ = await self.evaluation.evaluate_policy(
                rollout, tasks, self.eval_settings(use_tools, self.cfg), self.prompt_ids, 0,
                label=f"{variant} eval {name} (rl step {step})",
            )  # fmt: skip
            record.update({f"eval/{name}/{k[len('eval/'):]}": v for k, v in metrics.items()
                           if k.startswith("eval/")})  # fmt: skip
        self.logger.log(record)

    # ------------------------------------------------------------------ demonstrations
    async def demonstrations(
        self,
        use_tools: bool,
        sandbox: SandboxClient,
        mixture: Mixture | None = None,
        n: int | None = None,
        where: str = "data.train",
    ) -> list[Trajectory]:
        """SFT data: the `sft.data` file for the code variant, else the sources' own
        demonstrations of the first `n` (sft.examples) train items of `mixture` (data.train's,
        or an SFT stage's, named `where`): for the code variant a `sft.code_share` share with
        the interpreter (their code run in the sandbox) and text answers for the rest."""
        cfg = self.cfg
        if use_tools and cfg.sft.data is not None:
            return self.file_demonstrations(cfg.sft.data)
        mixture = self.mixture if mixture is None else mixture
        n = cfg.sft.examples if n is None else n
        tasks = mixture.items("train", n)
        if use_tools:
            # data.train's picks as they always were; a stage's keyed by its name
            pick = random.Random(cfg.seed if where == "data.train" else f"{cfg.seed}:{where}")
            with_code = [pick.random() < cfg.sft.code_share for _ in tasks]
        else:
            with_code = [False] * n
        parts_list = []
        for i, (task, code) in enumerate(zip(tasks, with_code)):
            parts = mixture.source_of(i).demonstration(task, code)
            if parts is None:  # checked at load; a source may still refuse one item
                raise ConfigError(
                    f"{where}: source {task.source!r} has no demonstration for {task.id}:"
                    " set sft.data to a tirl synth file or sft.steps: 0"
                )
            parts_list.append(parts)
        outputs = await run_demo_codes(
            sandbox, parts_list, cfg.sandbox.max_output_chars, names=[t.id for t in tasks]
        )
        return [
            demo_trajectory(self.renderer, t.problem, parts, out, {"question": t.problem})
            for t, parts, out in zip(tasks, parts_list, outputs)
        ]

    def file_demonstrations(self, path: str) -> list[Trajectory]:
        """The first `sft.examples` demonstrations of a `tirl synth` file, with their recorded
        interpreter outputs, in the run's protocol and prompt style."""
        from tirl.tasks.sft_file import read_sft_file

        demos = read_sft_file(path, run_protocol(self.cfg))[: self.cfg.sft.examples]
        if not demos:
            raise ConfigError(f"sft.data {path}: holds no demonstrations", "sft.data")
        return [
            demo_trajectory(self.renderer, problem, parts, None, {"question": problem})
            for problem, parts in demos
        ]

    # ------------------------------------------------------------------ evaluation
    def eval_settings(self, use_tools: bool, cfg: RunConfig) -> RolloutSettings:
        return build.eval_settings(cfg, use_tools)  # in the protocol the policy learned

    async def evaluate(
        self, variant: str, phase: str, rollout: Rollout, use_tools: bool, cfg: RunConfig
    ) -> None:
        """Every eval set after `phase`: greedy, then avg@k. A set already evaluated is read
        back on resume."""
        progress = self.progress_path
        done = json.loads(progress.read_text()) if progress.exists() else {}
        for name, tasks in self.eval_tasks.items():
            samples_path = self.run_dir / "samples" / f"{variant}_{phase}_{name}.jsonl"
            finished = done.get(variant, {}).get(phase, {})
            if self.resume and name in finished and samples_path.exists():
                metrics = finished[name]
                trajs = [Trajectory.from_dict(d) for d in read_jsonl(samples_path)]
            else:
                label = f"{variant} eval {name} ({phase})"
                metrics, trajs = await self.evaluation.evaluate_policy(
                    rollout,
                    tasks,
                    self.eval_settings(use_tools, cfg),
                    self.prompt_ids,
                    cfg.eval.samples_per_item,
                    cfg.eval.temperature,
                    label,
                    seed=cfg.seed,
                )
                for traj in trajs:
                    traj.meta.update(variant=variant, phase=phase, eval_set=name)
                write_text(samples_path, "".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
                # Too many failed samples: stop before the evaluation is recorded as done.
                self.evaluation.check_failed_share(
                    metrics["eval/failed"],
                    metrics["eval/samples"],
                    cfg.eval.max_failed_share,
                    label,
                    "rerun with --resume to evaluate again",
                    self.evaluation.first_failure(trajs),
                )
                done.setdefault(variant, {}).setdefault(phase, {})[name] = metrics
                write_text(progress, json.dumps(done, indent=2))
            self.results.setdefault(variant, {}).setdefault(phase, {})[name] = metrics
            self.samples.extend(trajs[: self.cfg.eval.saved_samples])


# ---------------------------------------------------------------------- running a config


def check_same_config(cfg: RunConfig, run_dir: Path) -> None:
    """A run folder is resumed only with the config that made it."""
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise ConfigError(f"cannot resume {run_dir}: it has no config.yaml (no run started there)")
    saved = load_config(RunConfig, saved_path)
    ours, theirs = flat_keys(to_dict(cfg)), flat_keys(to_dict(saved))
    diffs = [key for key, value in ours.items() if theirs.get(key) != value]
    if diffs:
        raise ConfigError(
            f"cannot resume {run_dir}: its config.yaml differs in {', '.join(diffs)}; resume with"
            f" the same config (or start a new run under another name)"
        )


def flat_keys(data: dict, prefix: str = "") -> dict:
    """Nested dicts as one dict by dotted key (lists stay values)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat_keys(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def quiet_transformers(cfg: RunConfig) -> None:
    """Quiet transformers' logs, and set torch's threads (`threads`; `tirl.cpu`)."""
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    configure_threads(cfg.threads)


def run_training(
    cfg: RunConfig,
    evaluation: Evaluation,
    overwrite: bool = True,
    resume: bool = False,
    agents: AgentRollouts | None = None,
) -> tuple[Path, dict]:
    """Run everything and write the report; returns the run folder and the eval results.
    With `resume`, continue the run in the run folder (see `Pipeline`). A fresh run clears
    only what an earlier run wrote in the folder (`tirl.train.run_folder`); with `overwrite`
    False it refuses a folder that holds a run instead. The folder is locked while the run
    works in it: a second run or resume on it is refused (ConfigError) naming this one.
    `agents`: RL's sampler for `rollout.agent` (`Pipeline`)."""
    quiet_transformers(cfg)
    check_plain_name(cfg.name, "name")
    check_lora_targets(cfg)
    run_dir = Path(cfg.out_dir) / cfg.name
    if resume:
        check_same_config(cfg, run_dir)  # before the lock: nothing is written for a bad resume
    elif not overwrite and (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} holds a run: pass --resume, or choose another name")
    with run_folder(cfg.out_dir, cfg.name, resume=resume) as run_dir:
        if resume:
            check_same_config(cfg, run_dir)  # again, now that no other run can change it
        return _run_in(cfg, run_dir, evaluation, resume, agents)


def _run_in(
    cfg: RunConfig, run_dir: Path, evaluation: Evaluation, resume: bool, agents
) -> tuple[Path, dict]:
    dist = init_from_env(cfg.device)  # under torchrun: RL is sharded, rank 0 writes files
    if dist is not None and not ENGINES.get_entry(cfg.rollout.engine).under_torchrun:
        raise ConfigError(
            f"rollout.engine {cfg.rollout.engine} does not run under torchrun: every rank"
            " samples with the hf engine there (vLLM across GPUs is verl's: docs/verl.md)",
            "rollout.engine",
        )
    if dist is None or dist.is_main:
        with replacing(run_dir / "config.yaml") as tmp:
            dump_yaml(cfg, tmp)
    start = time.perf_counter()
    pipeline = Pipeline(cfg, run_dir, evaluation, resume=resume, dist=dist, agents=agents)
    if runs_apart(cfg, dist):
        results = run_variants_apart(pipeline)
    else:
        results = asyncio.run(pipeline.run())  # {variant: {phase: {eval set: metrics}}}
    wall_s = time.perf_counter() - start
    samples, tokenizer = pipeline.samples, pipeline.tokenizer
    if dist is not None:
        del pipeline  # its models hold the group (see leave_process_group)
        leave_process_group()
        if not dist.is_main:
            return run_dir, {"wall_s": wall_s}
    write_text(run_dir / "eval.json", json_text({**results, "wall_s": wall_s}))
    evaluation.write_report(
        run_dir,
        eval_results=results,
        metrics_path=run_dir / "metrics.jsonl",
        samples=samples,
        config=to_dict(cfg),
        tokenizer=tokenizer,
        title=f"tirl train: {cfg.name}",
    )
    print(evaluation.summary_table(results, run_dir))
    return run_dir, {**results, "wall_s": wall_s}


def runs_apart(cfg: RunConfig, dist: DistContext | None) -> bool:
    """Whether `parallel_variants` applies: several variants on the CPU, one process per run
    (not torchrun's ranks), and no W&B (whose one run a child could not share)."""
    alone = dist is None and not cfg.log_wandb
    return cfg.parallel_variants and len(cfg.variants) > 1 and cfg.device == "cpu" and alone


def run_variants_apart(pipeline: Pipeline) -> dict:
    """`parallel_variants`: each variant's pipeline in a process of its own (`tirl.train.apart`),
    all from the tokenizer made here. Each logs to its own `<variant>/metrics.jsonl`; these are
    then written one after the other into `metrics.jsonl`, as a run of one variant after the
    other would have logged them. The children's saved samples go into `pipeline.samples`."""
    cfg, run_dir = pipeline.cfg, pipeline.run_dir
    pipeline.prepare()
    pipeline.logger.close()  # the children log; this process writes the merged file at the end
    # Only what a child uses: the report's functions stay here (and need not pickle).
    evaluation = dataclasses.replace(pipeline.evaluation, write_report=None, summary_table=None)
    jobs = [
        (dataclasses.replace(cfg, variants=[v]), run_dir, evaluation, pipeline.resume,
         pipeline.tokenizer, pipeline.agents)
        for v in cfg.variants
    ]  # fmt: skip
    outs = run_apart(_run_one_variant, jobs, [f"variant {v}" for v in cfg.variants])
    results: dict = {}
    for variant_results, samples in outs:
        results.update(variant_results)
        pipeline.samples += [Trajectory.from_dict(d) for d in samples]
    logs = [run_dir / v / "metrics.jsonl" for v in cfg.variants]
    write_text(run_dir / "metrics.jsonl", "".join(p.read_text() for p in logs if p.exists()))
    return results


def _run_one_variant(cfg: RunConfig, run_dir: Path, evaluation, resume: bool, tokenizer, agents):
    """One variant of `run_variants_apart`, in its child process: (results, saved samples)."""
    # tqdm's default lock holds a multiprocessing semaphore, which a spawned child leaves to
    # the parent's resource tracker ("leaked semaphore" at exit); a thread lock is enough here.
    tqdm.set_lock(threading.RLock())
    load_plugins(cfg.plugins)  # a spawned process starts with only the built-in entries
    quiet_transformers(cfg)
    pipeline = Pipeline(cfg, run_dir, evaluation, resume=resume, own_files=True, agents=agents)
    results = asyncio.run(pipeline.run(tokenizer))
    return results, [t.to_dict() for t in pipeline.samples]
