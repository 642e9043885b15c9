"""The run configuration: every switch of the quickstart, SFT and RL, with its meaning.

Loaded from YAML with dotted overrides by `tirl.config.load_config`; field docs here are the
reference documentation. Defaults are the quickstart's (`configs/quickstart.yaml`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tirl.config import ConfigError


@dataclass
class TaskConfig:
    """The arithmetic task family (`tirl.envs.arithmetic`)."""

    kinds: list[Literal["product", "mod", "chain"]] = field(
        default_factory=lambda: ["product", "mod", "chain"]
    )
    digits: int = 3  # digits of each operand
    test_items: int = 200  # held-out items evaluated

    def validate(self) -> None:
        if not self.kinds:
            raise ConfigError("task.kinds must name at least one kind")
        if not 1 <= self.digits <= 9:
            raise ConfigError(f"task.digits must be in 1..9, got {self.digits}")
        if self.test_items < 1:
            raise ConfigError(f"task.test_items must be >= 1, got {self.test_items}")


@dataclass
class ModelConfig:
    """The policy. With `name_or_path` unset, a tiny model and tokenizer are made from scratch;
    otherwise both are loaded with `from_pretrained` (a local folder or a hub name)."""

    name_or_path: str | None = None
    arch: Literal["qwen2", "gpt2"] = "qwen2"
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    max_positions: int = 192
    vocab_size: int = 384  # BPE vocabulary trained on the task corpus
    tokenizer_corpus_items: int = 2000  # train items whose texts train the tokenizer

    def validate(self) -> None:
        if self.hidden_size % self.heads:
            raise ConfigError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.heads ({self.heads})"
            )


@dataclass
class SandboxConfig:
    timeout_s: float = 5.0  # wall clock per code block
    memory_mb: int = 1024  # address-space limit per session
    max_output_chars: int = 128  # of interpreter output shown to the model (head + tail)
    preload: list[str] = field(default_factory=lambda: ["math", "fractions", "itertools"])


@dataclass
class SFTConfig:
    """Supervised fine-tuning on synthesized trajectories. Tool tokens carry loss mask 0."""

    steps: int = 800
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.0
    examples: int = 4000  # synthesized trajectories (the interpreter runs each one's code)
    # Share of the code variant's demonstrations that use the interpreter; the rest answer
    # in text. Below 1 the SFT model only sometimes reaches for the tool, and RL has to learn
    # that the tool pays (CIR's setting: RL learns when and how to call the interpreter).
    code_share: float = 0.5
    mask_tool_output: bool = True  # CIR §2.3.2: never fit interpreter tokens

    def validate(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.examples < 1:
            raise ConfigError("sft.steps must be >= 0, sft.batch_size and sft.examples >= 1")
        if not 0 <= self.code_share <= 1:
            raise ConfigError(f"sft.code_share must be in [0, 1], got {self.code_share}")


@dataclass
class RLStage:
    """One stage of AgentMath's multi-stage expansion (§3.3: context 48k -> 72k -> 96k, tool
    calls 48 -> 72 -> 96, partial-rollout segments 2 -> 3 -> 4): the model-token and
    tool-call limits while the stage lasts. With partial rollouts on, a trajectory spans up to
    max_model_tokens / rl.segment_tokens segments, so the segment count grows with the stage."""

    max_model_tokens: int
    tool_budget: int

    def validate(self) -> None:
        if self.max_model_tokens < 1 or self.tool_budget < 0:
            raise ConfigError(
                f"rl.stages entries need max_model_tokens >= 1 and tool_budget >= 0, got {self}"
            )


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

    steps: int = 45
    prompts_per_step: int = 8
    group_size: int = 8  # samples per prompt; GRPO normalizes within the group
    lr: float = 1e-4
    # Linear warm-up of the learning rate. A fresh Adam's first updates are close to
    # lr * sign(gradient) on every weight, which wrecks a fine-tuned policy at full lr.
    warmup_steps: int = 5
    temperature: float = 1.0
    max_model_tokens: int = 64  # model tokens per trajectory (tool tokens not counted)
    boundary: Literal["exact_match", "stop_token"] = "exact_match"  # CIR Figure 1
    advantage: Literal["grpo", "drgrpo", "reinforce++", "reinforce++-baseline", "rloo"] = "grpo"
    gamma: float = 1.0  # discount of the REINFORCE++ return, over model tokens only
    reward: Literal["binary", "zero_one", "composite"] = "binary"  # binary = CIR's +1 / -1
    # AgentMath's composite reward (tirl.rewards.reward.CompositeReward), used when
    # reward is "composite": R = R_acc + 1[R_acc = 1] * min(max, alpha + beta * N_code).
    composite_alpha: float = 0.0
    composite_beta: float = 0.05
    composite_max: float = 0.2
    # DAPO's soft overlong penalty, counted in model tokens; 0 turns it off.
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float | None = None  # dual clip for negative advantages (> 1); None = off
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0
    mask_tool_output: bool = True
    updates_per_step: int = 2  # optimizer steps per rollout batch (minibatches)
    micro_batch_size: int = 0  # sequences per forward pass (gradient accumulation); 0 = all
    max_grad_norm: float = 1.0
    bf16: bool = False  # autocast the update to bfloat16 (GPU only)
    # [fraction of training done, budget] pairs: the budget of the last pair reached applies.
    budget_schedule: list[list[float]] = field(
        default_factory=lambda: [[0.0, 2], [0.34, 3], [0.67, 4]]
    )
    # Partial rollouts (AgentMath §3): a trajectory samples at most `segment_tokens` model
    # tokens / `segment_tool_calls` calls per step and goes on in the next step, under the
    # new weights; 0 turns a budget off, both 0 turns partial rollouts off. Groups are trained
    # on once all their members have finished. `max_staleness`: a trajectory whose oldest
    # token is more than this many steps old restarts from its prompt.
    segment_tokens: int = 0
    segment_tool_calls: int = 0
    max_staleness: int | None = None
    adaptive_batch: bool = False
    max_refill_rounds: int = 3  # extra sampling rounds to refill dropped groups, per step
    # AgentMath's expansion; when set, the stages' limits replace max_model_tokens and
    # budget_schedule.
    stages: list[RLStage] = field(default_factory=list)
    expansion_threshold: float = 0.1
    checkpoint_every: int = 0  # steps between resumable checkpoints; 0 = only at the end

    def validate(self) -> None:
        if self.steps < 0 or self.prompts_per_step < 1 or self.updates_per_step < 1:
            raise ConfigError(
                "rl.steps must be >= 0, rl.prompts_per_step and rl.updates_per_step >= 1"
            )
        if self.composite_beta < 0:
            raise ConfigError(f"rl.composite_beta must be >= 0, got {self.composite_beta}")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ConfigError(
                f"rl.clip_low must be in [0, 1) and rl.clip_high >= 0, got {self.clip_low}, {self.clip_high}"
            )
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ConfigError(f"rl.clip_ratio_c must be > 1 (or null), got {self.clip_ratio_c}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"rl.gamma must be in (0, 1], got {self.gamma}")
        if self.group_size < 2:
            raise ConfigError(
                f"rl.group_size must be >= 2 for group-relative advantages, got {self.group_size}"
            )
        if self.temperature <= 0:
            raise ConfigError(
                f"rl.temperature must be > 0 for on-policy sampling, got {self.temperature}"
            )
        if self.overlong_buffer < 0 or self.overlong_buffer >= self.max_model_tokens:
            raise ConfigError(
                f"rl.overlong_buffer must be in [0, rl.max_model_tokens), got {self.overlong_buffer}"
            )
        if self.segment_tokens < 0 or self.segment_tool_calls < 0:
            raise ConfigError("rl.segment_tokens and rl.segment_tool_calls must be >= 0 (0 = off)")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"rl.max_staleness must be >= 0 or null, got {self.max_staleness}")
        if self.micro_batch_size < 0 or self.max_refill_rounds < 0 or self.checkpoint_every < 0:
            raise ConfigError(
                "rl.micro_batch_size, rl.max_refill_rounds and rl.checkpoint_every must be >= 0"
            )
        if not 0 <= self.expansion_threshold <= 1:
            raise ConfigError(
                f"rl.expansion_threshold must be in [0, 1], got {self.expansion_threshold}"
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

    samples_per_item: int = 4  # k of avg@k; 0 turns the sampled pass off
    temperature: float = 1.0
    max_model_tokens: int = 64
    tool_budget: int = 4
    saved_samples: int = 8  # trajectories kept per evaluation for the report


@dataclass
class RunConfig:
    """A quickstart run: code-integrated and text-only variants, SFT -> RL -> evaluation."""

    name: str = "quickstart"
    out_dir: str = "runs"
    seed: int = 0
    variants: list[Literal["code", "text"]] = field(default_factory=lambda: ["code", "text"])
    device: str = "cpu"
    threads: int = 0  # torch intra-op threads; 0 leaves torch's default
    rollout_batch: int = 128  # sequences decoded together
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log_tensorboard: bool = False
    log_wandb: bool = False

    def validate(self) -> None:
        if not self.variants:
            raise ConfigError("variants must name at least one of 'code', 'text'")
        if self.rl.bf16 and not self.device.startswith("cuda"):
            raise ConfigError(f"rl.bf16 needs a GPU (device: cuda), got device {self.device!r}")
