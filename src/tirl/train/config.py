"""The run configuration: every switch of the quickstart, SFT and RL, with its meaning and range.

Loaded from YAML with dotted overrides by `tirl.config.load_config`. Each field is declared with
`setting(default, range, doc)`: the doc and range here are the reference documentation
(`tirl config --keys` prints them), and both are checked when the config is loaded, before
anything is imported or written. Defaults are the quickstart's (`configs/quickstart.yaml`).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Literal

from tirl.config import ConfigError, setting

# Devices torch names; whether one is present is checked when the run starts.
_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps|xpu(:\d+)?")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
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


def _path_problem(path: str) -> str | None:
    if not path.strip():
        return "must not be empty"
    return "must be at most 4096 bytes" if len(path.encode()) > 4096 else None


def _device_problem(device: str) -> str | None:
    if _DEVICE.fullmatch(device):
        return None
    return "must be a torch device: cpu, cuda, cuda:N, mps or xpu"


def _modules_problem(modules: list[str]) -> str | None:
    for name in modules:
        if not _MODULE.fullmatch(name):
            return f"must list module names; {name!r} is not one"
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"must list installed modules; there is no module {name!r}"
    return None


@dataclass
class TaskConfig:
    """The arithmetic task family (`tirl.envs.arithmetic`)."""

    kinds: list[Literal["product", "mod", "chain"]] = setting(
        factory=lambda: ["product", "mod", "chain"], doc="problem kinds mixed in the task stream"
    )
    digits: int = setting(3, "[1, 9]", "digits of each operand")
    test_items: int = setting(200, ">= 1", "held-out items evaluated")

    def validate(self) -> None:
        if not self.kinds:
            raise ConfigError("task.kinds must name at least one kind")


@dataclass
class ModelConfig:
    """The policy. With `name_or_path` unset, a tiny model and tokenizer are made from scratch;
    otherwise both are loaded with `from_pretrained` (a local folder or a hub name)."""

    name_or_path: str | None = setting(
        None, doc="a model folder or hub name; null makes a tiny model", check=_path_problem
    )
    arch: Literal["qwen2", "gpt2"] = setting("qwen2", doc="architecture of the tiny model")
    hidden_size: int = setting(128, "[2, 65536]", "width of the tiny model")
    layers: int = setting(4, "[1, 1024]", "transformer blocks")
    heads: int = setting(4, "[1, 1024]", "attention heads; must divide hidden_size")
    max_positions: int = setting(
        192, "[16, 1048576]", "context length: prompt, model and interpreter tokens together"
    )
    vocab_size: int = setting(
        384, "[258, 1000000]", "BPE vocabulary trained on the task corpus (256 bytes + 2 special)"
    )
    tokenizer_corpus_items: int = setting(
        2000, ">= 1", "train items whose texts train the tokenizer"
    )

    def validate(self) -> None:
        if self.hidden_size % self.heads:
            raise ConfigError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.heads ({self.heads})"
            )
        if self.arch == "qwen2" and (self.hidden_size // self.heads) % 2:
            raise ConfigError(
                f"model.hidden_size / model.heads ({self.hidden_size // self.heads}) must be even"
                " for qwen2's rotary embeddings"
            )


@dataclass
class SandboxConfig:
    timeout_s: float = setting(5.0, "(0, 3600]", "wall clock per code block, in seconds")
    memory_mb: int = setting(1024, "[64, 1048576]", "address-space limit per session, in MB")
    max_output_chars: int = setting(
        128, "[16, 10000000]", "interpreter output shown to the model (head + tail)"
    )
    preload: list[str] = setting(
        factory=lambda: ["math", "fractions", "itertools"],
        doc="modules imported once in the sandbox's parent and shared by every session",
        check=_modules_problem,
    )
    cpu_s: int | None = setting(
        None, "[1, 86400]", "CPU seconds per session over its life (RLIMIT_CPU); null = no cap"
    )
    kill_background: bool = setting(
        True, doc="end the processes a cell leaves running when the cell returns"
    )

    def limits(self):
        """These settings as `tirl.sandbox.SandboxLimits`."""
        from tirl.sandbox import SandboxLimits

        return SandboxLimits(
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            cpu_s=self.cpu_s,
            kill_background=self.kill_background,
        )


@dataclass
class SFTConfig:
    """Supervised fine-tuning on synthesized trajectories. Tool tokens carry loss mask 0."""

    steps: int = setting(800, ">= 0", "optimizer steps; 0 skips SFT")
    batch_size: int = setting(64, ">= 1", "trajectories per step")
    lr: float = setting(1e-3, "(0, 1]", "peak learning rate (AdamW)")
    warmup_steps: int = setting(10, ">= 0", "linear warm-up of the learning rate, in steps")
    weight_decay: float = setting(0.0, "[0, 1]", "AdamW weight decay")
    examples: int = setting(
        4000, ">= 1", "synthesized trajectories (the interpreter runs each one's code)"
    )
    # Below 1 the SFT model only sometimes reaches for the tool, and RL has to learn that the
    # tool pays (CIR's setting: RL learns when and how to call the interpreter).
    code_share: float = setting(
        0.5, "[0, 1]", "share of the code variant's demonstrations that use the interpreter"
    )
    mask_tool_output: bool = setting(True, doc="CIR §2.3.2: never fit interpreter tokens")


@dataclass
class RLStage:
    """One stage of AgentMath's multi-stage expansion (§3.3: context 48k -> 72k -> 96k, tool
    calls 48 -> 72 -> 96, partial-rollout segments 2 -> 3 -> 4): the model-token and
    tool-call limits while the stage lasts. With partial rollouts on, a trajectory spans up to
    max_model_tokens / rl.segment_tokens segments, so the segment count grows with the stage."""

    max_model_tokens: int = setting(range=">= 1", doc="model tokens per trajectory in this stage")
    tool_budget: int = setting(range=">= 0", doc="tool calls per trajectory in this stage")


@dataclass
class RLConfig:
    """On-policy RL with every CIR and AgentMath strategy as a switch.

    CIR's six strategies (§2.3.2): `boundary` "exact_match" (code runs the moment its block
    closes), `mask_tool_output` (interpreter tokens out of the loss), `entropy_coef` 0 (no
    entropy bonus), `kl_coef` 0 (no KL), `clip_low`/`clip_high` 0.2 / 0.28 (clip-higher,
    DAPO), and `budget_schedule` (interaction budget 2 -> 3 -> 4). CIR trains REINFORCE++
    with a +1 / -1 reward: `advantage: reinforce++`, `reward: binary`.

    AgentMath's (§3.2-3.3): `adaptive_batch` (drop groups whose rewards are all equal and
    refill from fresh prompts), `reward: composite`, and `stages` with `expansion_threshold`
    (move to the next stage whenever the truncation rate exceeds 10%).
    """

    steps: int = setting(45, ">= 0", "RL steps (rollout batch + updates); 0 skips RL")
    prompts_per_step: int = setting(8, ">= 1", "groups (prompts) per step")
    group_size: int = setting(
        8, ">= 2", "samples per prompt; group-relative advantages need at least 2"
    )
    lr: float = setting(1e-4, "(0, 1]", "peak learning rate (AdamW)")
    # A fresh Adam's first updates are close to lr * sign(gradient) on every weight, which
    # wrecks a fine-tuned policy at full lr.
    warmup_steps: int = setting(5, ">= 0", "linear warm-up of the learning rate, in RL steps")
    temperature: float = setting(1.0, "(0, 100]", "sampling temperature (on-policy: > 0)")
    max_model_tokens: int = setting(
        64, ">= 1", "model tokens per trajectory (tool tokens not counted)"
    )
    boundary: Literal["exact_match", "stop_token"] = setting(
        "exact_match", doc="how a code block's end is detected (CIR Figure 1)"
    )
    advantage: Literal["grpo", "drgrpo", "reinforce++", "reinforce++-baseline", "rloo"] = setting(
        "grpo", doc="advantage estimator (tirl.algos.advantages)"
    )
    gamma: float = setting(1.0, "(0, 1]", "discount of the REINFORCE++ return, over model tokens")
    reward: Literal["binary", "zero_one", "composite"] = setting(
        "binary", doc="binary = CIR's +1 / -1; composite = AgentMath's"
    )
    # AgentMath's composite reward (tirl.rewards.reward.CompositeReward), used when reward is
    # "composite": R = R_acc + 1[R_acc = 1] * min(max, alpha + beta * N_code).
    composite_alpha: float = setting(0.0, "[0, 100]", "composite reward: alpha")
    composite_beta: float = setting(0.05, "[0, 100]", "composite reward: beta per code call")
    composite_max: float = setting(0.2, "[0, 100]", "composite reward: cap of the tool bonus")
    overlong_buffer: int = setting(
        0, ">= 0", "DAPO's soft overlong penalty zone, in model tokens; 0 turns it off"
    )
    overlong_penalty: float = setting(1.0, "[0, 100]", "penalty at the hard limit")
    clip_low: float = setting(0.2, "[0, 1)", "PPO clip below 1 (ratio >= 1 - clip_low)")
    clip_high: float = setting(0.28, "[0, 100]", "PPO clip above 1; > clip_low is clip-higher")
    clip_ratio_c: float | None = setting(
        None, "(1, 1000]", "dual clip for negative advantages; null turns it off"
    )
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = setting("token-mean", doc="how token losses are averaged (tirl.algos.losses)")
    kl_coef: float = setting(0.0, "[0, 100]", "KL penalty to the initial policy; 0 = off (CIR)")
    kl_estimator: Literal["k1", "k2", "k3"] = setting("k3", doc="KL estimator")
    entropy_coef: float = setting(0.0, "[0, 100]", "entropy bonus; 0 = off (CIR)")
    mask_tool_output: bool = setting(True, doc="interpreter tokens out of the loss (CIR)")
    updates_per_step: int = setting(2, ">= 1", "optimizer steps per rollout batch (minibatches)")
    micro_batch_size: int = setting(
        0, ">= 0", "sequences per forward pass (gradient accumulation); 0 = all"
    )
    max_grad_norm: float = setting(1.0, "> 0", "gradient-norm clip")
    bf16: bool = setting(False, doc="autocast the update to bfloat16 (GPU only)")
    budget_schedule: list[list[float]] = setting(
        factory=lambda: [[0.0, 2], [0.34, 3], [0.67, 4]],
        doc="[fraction of training done, tool budget] pairs; the last pair reached applies",
    )
    # Partial rollouts (AgentMath §3): a trajectory samples at most `segment_tokens` model
    # tokens / `segment_tool_calls` calls per step and goes on in the next step, under the new
    # weights. Groups are trained on once all their members have finished.
    segment_tokens: int = setting(
        0, ">= 0", "partial rollouts: model tokens per step and trajectory; 0 = off"
    )
    segment_tool_calls: int = setting(
        0, ">= 0", "partial rollouts: tool calls per step and trajectory; 0 = off"
    )
    max_staleness: int | None = setting(
        None,
        ">= 0",
        "partial rollouts: a trajectory older than this many steps restarts; null = no bound",
    )
    adaptive_batch: bool = setting(
        False, doc="drop groups whose rewards are all equal and refill (AgentMath §3.2)"
    )
    max_refill_rounds: int = setting(
        3,
        ">= 0",
        "adaptive batches: the cap on extra sampling rounds per step; a step still short of a"
        " full batch after them does not update, and its groups wait for the next step",
    )
    stages: list[RLStage] = setting(
        factory=list,
        doc="AgentMath's expansion stages; when set they replace max_model_tokens and"
        " budget_schedule",
    )
    expansion_threshold: float = setting(
        0.1,
        "[0, 1]",
        "move to the next stage when the truncation rate over every trajectory sampled in a"
        " step (kept or dropped) exceeds this",
    )
    checkpoint_every: int = setting(
        0, ">= 0", "steps between resumable checkpoints; 0 = only at the end"
    )

    def validate(self) -> None:
        if self.overlong_buffer >= self.max_model_tokens:
            raise ConfigError(
                f"rl.overlong_buffer must be in [0, rl.max_model_tokens), got {self.overlong_buffer}"
            )
        if not self.budget_schedule:
            raise ConfigError("rl.budget_schedule needs at least one [fraction, budget] pair")
        for pair in self.budget_schedule:
            if len(pair) != 2 or not 0 <= pair[0] <= 1 or pair[1] < 0 or pair[1] != int(pair[1]):
                raise ConfigError(
                    f"rl.budget_schedule entries must be [fraction in 0..1, budget >= 0 integer], got {pair}"
                )
        fractions = [p[0] for p in self.budget_schedule]
        if fractions != sorted(fractions) or fractions[0] != 0:
            raise ConfigError(
                f"rl.budget_schedule must start at fraction 0 and increase, got {fractions}"
            )


@dataclass
class EvalConfig:
    """Held-out evaluation: a greedy pass ("eval/accuracy") and, when `samples_per_item` > 0,
    avg@k at `temperature` ("eval/avg@k", as CIR's avg@16 at temperature 1.0)."""

    samples_per_item: int = setting(4, ">= 0", "k of avg@k; 0 turns the sampled pass off")
    temperature: float = setting(1.0, "(0, 100]", "temperature of the sampled pass")
    max_model_tokens: int = setting(64, ">= 1", "model tokens per trajectory")
    tool_budget: int = setting(4, ">= 0", "tool calls per trajectory")
    saved_samples: int = setting(8, ">= 0", "trajectories kept per evaluation for the report")
    max_failed_share: float = setting(
        0.01,
        "[0, 1]",
        "share of evaluation samples that may fail (engine, server or sandbox errors) before"
        " tirl eval / the run exits non-zero; failed samples are left out of every metric and"
        " retried by a rerun or --resume",
    )


@dataclass
class RunConfig:
    """A quickstart run: code-integrated and text-only variants, SFT -> RL -> evaluation."""

    name: str = setting(
        "quickstart", doc="run folder name, inside out_dir (a plain name)", check=run_name_problem
    )
    out_dir: str = setting("runs", doc="folder that holds run folders", check=_path_problem)
    seed: int = setting(0, ">= 0", "seeds the model, the tasks and every sampled trajectory")
    variants: list[Literal["code", "text"]] = setting(
        factory=lambda: ["code", "text"], doc="code-integrated and/or text-only runs"
    )
    device: str = setting("cpu", doc="torch device: cpu, cuda, cuda:N, mps", check=_device_problem)
    threads: int = setting(0, "[0, 4096]", "torch intra-op threads; 0 leaves torch's default")
    rollout_batch: int = setting(128, ">= 1", "sequences decoded together")
    task: TaskConfig = setting(factory=TaskConfig, doc="the task family")
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
        longest = max(self.rl.max_model_tokens, self.eval.max_model_tokens)
        longest = max([longest, *(s.max_model_tokens for s in self.rl.stages)])
        if self.model.name_or_path is None and self.model.max_positions <= longest:
            raise ConfigError(
                f"model.max_positions ({self.model.max_positions}) must exceed the longest"
                f" model-token limit ({longest}): the prompt and tool output need room too"
            )
