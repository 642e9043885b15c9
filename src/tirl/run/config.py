"""The run configuration of `tirl train`, `eval`, `ablate` and `study`: every switch of a run
(tasks, prompts, engine, model, sandbox, SFT, RL, evaluation), with its meaning and range. Each
section with a component of its own lives beside it (`tirl.models.config`,
`tirl.protocol.config`, `tirl.rollout.config`, `tirl.sandbox.config`; SFT and RL in
`tirl.run.phases`); the sections of the run as a whole are here.

Loaded from YAML with dotted overrides by `tirl.config.load_config`. Each field is declared with
`setting(default, range, doc)`: the doc and range here are the reference documentation
(`tirl config --keys` prints them), and both are checked when the config is loaded, before
anything is imported or written. Defaults are the quickstart's (`tirl/presets/quickstart.yaml`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from tirl.config import ConfigError, check_keyword_params, path_problem, setting
from tirl.models.config import ModelConfig
from tirl.protocol.config import ProtocolConfig
from tirl.rollout.config import RolloutConfig
from tirl.run.phases import (
    CurriculumConfig,
    RLConfig,
    RLStage,
    SFTConfig,
    SFTStage,
)
from tirl.sandbox.config import SandboxConfig

__all__ = [
    "CurriculumConfig",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "PromptConfig",
    "ProtocolConfig",
    "RLConfig",
    "RLStage",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SFTStage",
    "SandboxConfig",
]

# Devices torch names; whether one is present is checked when the run starts.
_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?")
MAX_NAME_BYTES = 255  # a file name on every common file system


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run folder inside out_dir, or None. A run folder is created,
    locked and (on a fresh run) cleared, so its name must stay one level inside out_dir."""
    if not name.strip():
        return "must not be empty"
    if name in (".", "..") or "/" in name or "\\" in name:
        return "must be a plain folder name (no '/', '\\', '.' or '..')"
    if len(name.encode()) > MAX_NAME_BYTES:
        return f"must be at most {MAX_NAME_BYTES} bytes"
    return None


def _device_problem(device: str) -> str | None:
    if _DEVICE.fullmatch(device):
        return None
    return "must be a torch device: cpu, cuda, cuda:N, mps or xpu"


DEFAULT_EVAL_SET = "heldout"
_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _protocol_problem(name: str) -> str | None:
    from tirl.protocol import PROTOCOLS  # the registry: no copied list of names here

    return PROTOCOLS.problem(name)


def _tools_problem(names: list[str]) -> str | None:
    from tirl.tools import tools_problem  # the registry: no copied list of names here

    return tools_problem(names)


def eval_set_problem(entry: dict) -> str | None:
    """Why a data.eval entry's own keys are wrong, or None (its source is checked apart)."""
    name = entry.get("name")
    if not isinstance(name, str) or not _SET_NAME.fullmatch(name) or len(name) > 100:
        return f"name must be a plain name (letters, digits, _ . -), got {name!r}"
    items = entry.get("items", 200)
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        return f"items must be an int >= 1, got {items!r}"
    return None


@dataclass
class DataConfig:
    """What the run trains and evaluates on: task sources by name (`tirl.tasks`, listed by
    `tirl envs list`-style registries: arithmetic, races, dataset, benchmark, ...).

    `train` is a weighted mixture of source entries `{source: NAME, weight: W, ...its keys}`;
    SFT demonstrations are its first `sft.examples` train items and RL continues the same
    stream after them (prompts SFT never saw); with `sft.stages`, SFT draws from the stages'
    mixtures and RL starts past every item they used. `eval` lists the evaluation sets, each
    `{name: NAME, items: N}` plus optionally a source entry's keys: without `source` it is the
    held-out `test` split of the train mixture; with one, that source's `test` split.
    """

    train: list[dict[str, Any]] = setting(
        factory=lambda: [{"source": "arithmetic"}],
        doc="task sources mixed for SFT and RL: [{source: NAME, weight: W, ...its keys}]",
    )
    eval: list[dict[str, Any]] = setting(
        factory=lambda: [{"name": DEFAULT_EVAL_SET, "items": 200}],
        doc="evaluation sets: [{name, items, and optionally source: NAME ...its keys}]; no"
        " source = the train mixture's held-out test split",
    )

    def validate(self) -> None:
        if not self.eval:
            raise ConfigError("data.eval must list at least one evaluation set", "data.eval")
        names = []
        for i, entry in enumerate(self.eval):
            problem = eval_set_problem(entry)
            if problem:
                raise ConfigError(f"data.eval[{i}].{problem}", f"data.eval[{i}]")
            names.append(entry["name"])
        if len(set(names)) != len(names):
            raise ConfigError(f"data.eval names must differ, got {names}", "data.eval")


@dataclass
class PromptConfig:
    """How a task's problem becomes the prompt (`tirl.tasks.prompts.PromptRenderer`)."""

    chat: bool | None = setting(
        None,
        doc="wrap the problem in the tokenizer's chat template; null = when the tokenizer has"
        " one (the tiny model's has one only with true: Qwen2.5's turns; else plain 'Problem:"
        " ... Solution:' text)",
    )
    system: str | None = setting(
        None, doc="system message of the chat template (with chat); null = the protocol's own"
    )


@dataclass
class EvalConfig:
    """Held-out evaluation: a greedy pass ("eval/accuracy") and, when `samples_per_item` > 0,
    avg@k at `temperature` ("eval/avg@k", as CIR's avg@16 at temperature 1.0), each sample
    seeded by the run's `seed`, its item and its number."""

    base: bool = setting(
        False,
        doc="also evaluate the model as loaded, before SFT (phase base): what SFT and RL add"
        " to a pretrained model",
    )
    samples_per_item: int = setting(4, ">= 0", "k of avg@k; 0 turns the sampled pass off")
    temperature: float = setting(1.0, "(0, 100]", "temperature of the sampled pass")
    max_model_tokens: int = setting(64, ">= 1", "model tokens per trajectory")
    tool_budget: int = setting(4, ">= 0", "tool calls per trajectory")
    saved_samples: int = setting(8, ">= 0", "trajectories kept per evaluation for the report")
    every_rl_steps: int = setting(
        0,
        ">= 0",
        "also evaluate every data.eval set (greedy pass) every this many RL steps, logged as"
        " eval/<name>/... in metrics.jsonl (phase rl_eval); 0 = only after SFT and after RL",
    )
    max_failed_share: float = setting(
        0.01,
        "[0, 1]",
        "share of evaluation samples that may fail (engine, server or sandbox errors) before"
        " tirl eval / the run exits non-zero; failed samples are left out of every metric and"
        " retried by a rerun or --resume",
    )


@dataclass
class RunConfig:
    """A training run: code-integrated and/or text-only variants, each demonstrations -> SFT ->
    evaluation -> RL -> evaluation (`tirl.train.pipeline`)."""

    plugins: list[str] = setting(
        factory=list,
        doc="modules (or .py files, relative to the config file) imported before the config is"
        " checked, to register sources, environments, estimators, losses, rewards, protocols,"
        " engines, transports or tools of your own (tirl.plugins; docs/extending.md)",
    )
    name: str = setting(
        "quickstart", doc="run folder name, inside out_dir (a plain name)", check=run_name_problem
    )
    out_dir: str = setting("runs", doc="folder that holds run folders", check=path_problem)
    seed: int = setting(0, ">= 0", "seeds the model, the tasks and every sampled trajectory")
    variants: list[Literal["code", "text"]] = setting(
        factory=lambda: ["code", "text"], doc="code-integrated and/or text-only runs"
    )
    device: str = setting("cpu", doc="torch device: cpu, cuda, cuda:N, mps", check=_device_problem)
    threads: int = setting(
        0,
        "[0, 4096]",
        "torch intra-op threads; 0 = the cores other processes leave free, re-chosen between"
        " steps (tirl.cpu: beside a busy neighbour torch's one thread per core ran 3-5x slower,"
        " this ~1.7-2.4x); N fixes N (arithmetic independent of the machine's load)",
    )
    parallel_variants: bool = setting(
        False,
        doc="train the variants at once, each in a process of its own sharing the cores (a small"
        " model's step does not use two cores well, BENCHMARKS.md); each logs to"
        " <variant>/metrics.jsonl, merged into metrics.jsonl when all are done. On the CPU only,"
        " without log_wandb (one W&B run) and torchrun: elsewhere one variant after the other",
    )
    rollout_batch: int = setting(128, ">= 1", "sequences decoded together (hf engine)")
    protocol: ProtocolConfig = setting(
        factory=ProtocolConfig,
        doc="how code is written and its end detected, in SFT, RL and eval alike (a name alone,"
        " protocol: agentmath_tags, sets protocol.name)",
    )
    tools: list[str] = setting(
        factory=lambda: ["python"],
        doc="the tools the model may call (tirl.tools): python (```python / <code> blocks),"
        " shell (```bash / <bash> blocks, run in the same sandbox session); a block for a"
        " registered tool that is not listed is answered with one line and not run",
        check=_tools_problem,
    )
    data: DataConfig = setting(factory=DataConfig, doc="task sources for training and eval")
    prompt: PromptConfig = setting(factory=PromptConfig, doc="how problems become prompts")
    rollout: RolloutConfig = setting(factory=RolloutConfig, doc="the sampling engine")
    model: ModelConfig = setting(factory=ModelConfig, doc="the policy")
    sandbox: SandboxConfig = setting(factory=SandboxConfig, doc="the Python sandbox")
    sft: SFTConfig = setting(factory=SFTConfig, doc="supervised fine-tuning")
    rl: RLConfig = setting(factory=RLConfig, doc="reinforcement learning")
    eval: EvalConfig = setting(factory=EvalConfig, doc="held-out evaluation")
    log_tensorboard: bool = setting(False, doc="also log to TensorBoard (the tensorboard extra)")
    log_wandb: bool = setting(False, doc="also log to Weights & Biases (the wandb extra)")

    def validate(self) -> None:
        if not self.variants:
            raise ConfigError("variants must name at least one of 'code', 'text'")
        if len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"variants must not repeat a variant, got {self.variants}")
        if self.rl.bf16 and not self.device.startswith("cuda"):
            raise ConfigError(f"rl.bf16 needs a GPU (device: cuda), got device {self.device!r}")
        if self.model.dtype == "float16" and not self.device.startswith("cuda"):
            raise ConfigError(
                f"model.dtype float16 needs a GPU (device: cuda), got device {self.device!r};"
                " use float32 or bfloat16",
                "model.dtype",
            )
        longest = max(self.rl.max_model_tokens, self.eval.max_model_tokens)
        longest = max([longest, *(s.max_model_tokens for s in self.rl.stages)])
        if self.model.name_or_path is None and self.model.max_positions <= longest:
            raise ConfigError(
                f"model.max_positions ({self.model.max_positions}) must exceed the longest"
                f" model-token limit ({longest}): the prompt and tool output need room too"
            )
        if self.model.lora.rank and not self._engine_kind().receives_weights:
            raise ConfigError(
                f"model.lora.rank: rollout.engine {self.rollout.engine} samples a server's own"
                " weights, which cannot take the adapters trained here; LoRA needs an engine"
                " that receives the trained weights (hf, vllm)",
                "model.lora.rank",
            )
        self.check_engine()
        self.check_agent()
        self.check_data()

    def _engine_kind(self):
        from tirl.rollout.engines import ENGINES

        return ENGINES[self.rollout.engine]

    def check_engine(self) -> None:
        """An engine that cannot receive the trained weights serves evaluation only: training
        with it would sample from stale weights, so such a run fails here, at load."""
        engine = self.rollout.engine
        kind = self._engine_kind()
        if not kind.receives_weights and (self.rl.steps > 0 or self.sft.total_steps > 0):
            raise ConfigError(
                f"rollout.engine {engine} cannot receive the trained weights, so training would"
                f" sample from stale ones; set rl.steps: 0 and sft.steps: 0 to evaluate"
                f" model.name_or_path only, or use rollout.engine hf or vllm",
                "rollout.engine",
            )
        if ("urls" in kind.needs) != bool(self.rollout.urls):
            raise ConfigError(
                f"rollout.urls must list the servers' URLs for engine {engine}"
                if "urls" in kind.needs
                else f"rollout.urls is read only by engines that are clients, not {engine}",
                "rollout.urls",
            )
        if not kind.receives_weights and not self.model.name_or_path:
            raise ConfigError(
                f"rollout.engine {engine} needs model.name_or_path (the served model's tokenizer)",
                "model.name_or_path",
            )
        what = f"engine {engine!r}"
        check_keyword_params(
            "rollout.engine_options", self.rollout.engine_options, kind.build, what, ("spec",)
        )
        problem = kind.check(self.rollout.engine_options, self.device) if kind.check else None
        if problem:  # attributed to the options where it is about one of them
            about_options = problem.startswith("engine_options.")
            key = "rollout.engine_options" if about_options else "rollout.engine"
            raise ConfigError(f"rollout.engine {engine}: {problem}", key)

    def check_agent(self) -> None:
        """`rollout.agent`: the program samples RL's trajectories whole, with its own tools."""
        agent = self.rollout.agent
        if not agent.command:
            return
        where = "rollout.agent.command"
        if any(not isinstance(part, str) or not part for part in agent.command):
            raise ConfigError(
                f"{where}: a list of non-empty strings, e.g. [python, agent.py]", where
            )
        if self.rl.segment_tokens or self.rl.segment_tool_calls:
            raise ConfigError(
                f"{where}: an agent program's runs cannot be cut into partial rollouts"
                " (rl.segment_tokens, rl.segment_tool_calls)",
                where,
            )
        if self.variants != ["code"]:
            raise ConfigError(
                f"{where}: the program runs its own tools, so there is no text-only variant to"
                f" train beside it; set variants: [code] (got {self.variants})",
                where,
            )

    def check_data(self) -> None:
        """Build every task source now (an unknown source, a bad key, a weight <= 0 or a file
        that cannot be read is a one-line error naming its key), and check that SFT has
        demonstrations."""
        from tirl.tasks import Mixture, make_source
        from tirl.tasks.registry import EVAL_ENTRY_KEYS

        mixture = Mixture.from_entries(self.data.train, "data.train", self.seed)
        for i, entry in enumerate(self.data.eval):
            source = {k: v for k, v in entry.items() if k not in EVAL_ENTRY_KEYS}
            if source:
                make_source(source, f"data.eval[{i}]", self.seed)
        stages = [
            Mixture.from_entries(stage.data, f"sft.stages[{k}].data", self.seed)
            for k, stage in enumerate(self.sft.stages)
        ]
        if self.sft.stages and self.sft.data is not None:
            raise ConfigError(
                "sft.stages: stages draw the sources' built-in demonstrations, so they cannot be"
                " combined with sft.data; drop one of them",
                "sft.stages",
            )
        if self.sft.total_steps == 0:
            return
        wanted = set()  # use_tools values of the built-in demonstrations SFT will ask for
        if self.sft.data is not None and "code" in self.variants:
            from tirl.protocol import get_protocol
            from tirl.tasks.sft_file import read_sft_records
            from tirl.tools import toolset_protocol

            protocol = get_protocol(self.protocol.name, self.protocol.boundary)
            read_sft_records(self.sft.data, toolset_protocol(protocol, self.tools))
        elif "code" in self.variants:
            wanted |= {True} if self.sft.code_share > 0 else set()
            wanted |= {False} if self.sft.code_share < 1 else set()
        if "text" in self.variants:
            wanted.add(False)
        if self.sft.stages:  # SFT's demonstrations come from the stages' sources only
            mixes = [(f"sft.stages[{k}].data", st.data, m) for k, (st, m) in
                     enumerate(zip(self.sft.stages, stages))]  # fmt: skip
            fix = "name a source that has them in this stage"
        else:
            mixes = [("data.train", self.data.train, mixture)]
            fix = "variants: [code]" if self.sft.data else "sft.data to a tirl synth file"
            fix = f"set {fix} or sft.steps: 0"
        for where, entries, mix in mixes:
            for i, (entry, source) in enumerate(zip(entries, mix.sources)):
                task = source.item("train", 0)
                if any(source.demonstration(task, use_tools) is None for use_tools in wanted):
                    raise ConfigError(
                        f"{where}[{i}] ({entry.get('source')}) has no built-in demonstrations:"
                        f" {fix}",
                        f"{where}[{i}]",
                    )
