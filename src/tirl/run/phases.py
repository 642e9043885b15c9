"""The `sft:` and `rl:` sections of a run config: every switch of supervised fine-tuning and of
RL (CIR's and AgentMath's strategies), with its meaning and range, and the checks that tie
their names to the live registries (estimators, losses, rewards)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tirl.config import (
    ConfigError,
    check_keyword_params,
    keyword_params,
    path_problem,
    plain_values_problem,
    setting,
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
        check=path_problem,
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


# Config fields that are the parameters of a registered function of the same name when it has
# them: a policy loss that clips reads rl.clip_low / clip_high / clip_ratio_c.
POLICY_LOSS_FIELDS = ("clip_low", "clip_high", "clip_ratio_c")


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
        check=plain_values_problem,
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
        check=plain_values_problem,
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
        check=plain_values_problem,
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
    skip_zero_advantage: bool = setting(
        True,
        doc="leave rows whose advantage is 0 on every token (a GRPO group that scored alike)"
        " out of the update's forward and backward passes: they add exactly 0 to the"
        " gradient (kept in the loss's divisor); only where that holds: a policy loss marked"
        " zero_at_zero_advantage (ppo_clip), entropy_coef 0 and kl_coef 0. The actor/"
        " metrics are then means over the rows trained on (actor/trained_row_share)",
    )
    old_logprobs: Literal["auto", "trainer", "sampler"] = setting(
        "auto",
        doc="the PPO ratio's old log-probabilities: trainer = recomputed by the trainer before"
        " the update (one forward pass; the proximal policy when rollouts are stale or the"
        " sampler differs); sampler = the sampling engine's own, no pass (exact only when"
        " sampler and trainer agree: hf engine, same dtype, no partial rollouts; docs/vllm.md);"
        " auto = sampler where they agree (the hf engine, no partial rollouts, no rl.tis_cap,"
        " no bf16 update; off-policy too: then pi_old is the behaviour policy), else trainer"
        " (with rl.off_policy_steps >= 1 and rl.tis_cap the proximal policy of AReaL's"
        " decoupled PPO, rl.tis_cap truncating the behaviour weight)",
    )
    off_policy_steps: int = setting(
        0,
        ">= 0",
        "async RL with a staleness bound k: a batch is trained at most k policy versions after"
        " the one that sampled it (AReaL's max_head_offpolicyness, prime-rl's async_level);"
        " updates run in order in a thread of their own while the next steps sample on a"
        " copy of the weights, which gets a finished update's weights at a step boundary"
        " once k are pending (rl/staleness_mean); pi_old is the sampler's (with rl.tis_cap:"
        " AReaL's decoupled PPO); a step takes about max(sampling, update); 0 = on-policy; not with partial"
        " rollouts, torchrun or vLLM's sleep mode",
    )
    one_step_off_policy: bool = setting(
        False,
        doc="shorthand for rl.off_policy_steps: 1 (sample step n+1 while step n updates)",
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
        if self.one_step_off_policy and self.off_policy_steps > 1:
            raise ConfigError(
                "rl.one_step_off_policy is shorthand for rl.off_policy_steps: 1, but"
                f" rl.off_policy_steps is {self.off_policy_steps}: set one or the other",
                "rl.off_policy_steps",
            )
        if self.staleness_bound and (self.segment_tokens or self.segment_tool_calls):
            raise ConfigError(
                f"{self.off_policy_key} does not combine with partial rollouts"
                " (rl.segment_tokens / segment_tool_calls), which carry trajectories across"
                " updates already: set one or the other",
                self.off_policy_key,
            )
        self._check_algorithm_params()

    @property
    def staleness_bound(self) -> int:
        """k, the most policy versions a batch is trained after the one that sampled it:
        `off_policy_steps`, or 1 for `one_step_off_policy`; 0 is on-policy."""
        return max(self.off_policy_steps, int(self.one_step_off_policy))

    @property
    def off_policy_key(self) -> str:
        """The key that set the staleness bound, for the refusals that name it."""
        return "rl.one_step_off_policy" if self.one_step_off_policy else "rl.off_policy_steps"

    def _check_algorithm_params(self) -> None:
        """Each *_params name must be a keyword of the function or class it goes to. Only a
        non-empty dict imports its registry (torch, for the algos ones)."""
        if self.advantage_params:
            from tirl.algos.advantages import ADVANTAGE_ARGS, ADVANTAGE_ESTIMATORS

            what = f"advantage estimator {self.advantage!r}"
            fn = ADVANTAGE_ESTIMATORS[self.advantage]
            check_keyword_params(
                "rl.advantage_params", self.advantage_params, fn, what, ADVANTAGE_ARGS
            )
        if self.policy_loss_params:
            from tirl.algos.losses import POLICY_LOSS_ARGS, POLICY_LOSSES

            dedicated = {name: f"rl.{name}" for name in POLICY_LOSS_FIELDS}
            what = f"policy loss {self.policy_loss!r}"
            fn = POLICY_LOSSES[self.policy_loss]
            params = self.policy_loss_params
            check_keyword_params(
                "rl.policy_loss_params", params, fn, what, POLICY_LOSS_ARGS, dedicated
            )
        if self.reward_params:
            from tirl.rewards.reward import REWARDS, make_reward

            what = f"reward {self.reward!r}"
            check_keyword_params("rl.reward_params", self.reward_params, REWARDS[self.reward], what)
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
