"""tirl's rollout as a verl agent loop: `TirlAgentLoop`, registered in verl as "tirl".

verl 0.9.1 runs one agent loop per sample inside its `AgentLoopWorker`s (Ray actors; verl
`experimental/agent_loop/agent_loop.py`). This loop runs ONE tirl trajectory per sample:

1. the task is rebuilt from the row (`extra_info.tirl_task`, written by `tirl verl data`;
   `tirl.integrations.verl.data.task_of_row`), and the prompt ids are tirl's own
   (`PromptRenderer` with the row's prompt settings, which must be the run config's): the
   same ids tirl's SFT and evaluation use, plain prompts included. The row's `prompt` column
   holds the same messages; verl only uses it to filter long prompts;
2. `tirl.rollout.Rollout` drives generate -> exact-match boundary -> sandbox -> append over
   verl's server client (`tirl.integrations.verl.engine.VerlServerEngine`: server stops, one
   sticky request id per trajectory, the finish reason inferred), with the worker process's
   sandbox (below);
3. the reward is computed here, from the model's text only (`tirl.tasks.scoring`, architecture.md
   invariant 3) with the run's reward (`rl.reward`, and on training rows DAPO's overlong
   penalty over model tokens when `rl.overlong_buffer` > 0), and returned as `reward_score`. verl then never
   calls its reward managers for these samples (`AgentLoopWorker._compute_score` runs only
   when `reward_score` is None), so its naive / DAPO managers, which decode tool output and
   count tool tokens in lengths, are bypassed;
4. the output: `response_ids` = model and interpreter ids after the prompt, `response_mask`
   1 on model ids and 0 on interpreter ids (`rl.mask_tool_output`), `response_logprobs` the
   server's on model ids and 0.0 on interpreter ids (when verl asked for log-probs), cut to
   `rollout.response_length` (the engine never samples past it, so a cut only drops the tail
   of a tool output; scores and statistics are computed on the cut trajectory). `acc` and the
   tool statistics go into `extra_fields["reward_extra_info"]` (verl's validation metrics and
   dumps read them), the finish reason and policy versions into `extra_fields`.

CIR's budget schedule (§3.1, 2 -> 3 -> 4): every response carries the version of the weights
that sampled it (`TokenOutput.extra_fields["global_steps"]`: the number of weight updates
pushed to the servers; in verl's synchronous trainer the rollout of step s reports s - 1, as
tirl's own trainer counts steps done). When a code block closes, its budget is
`budget_at(rl.budget_schedule, version / rl.steps)` for the version that wrote it: constant
within a step of the synchronous trainer, per request under the fully-async one (whose version
counts parameter syncs, so its `rl.steps` must be the number of syncs). Validation rows (the
task's split is "test") use `eval.max_model_tokens` and `eval.tool_budget`, as tirl's own
evaluation; training rows `rl.max_model_tokens`.

AgentMath's stage expansion (§3.3; `rl.stages`, `rl.expansion_threshold`): a training
trajectory takes the model-token limit and tool budget of the stage the run's board gives it
when it starts, and reports whether it was truncated under the policy version that started it;
the board (`tirl.integrations.verl.stages`: a named Ray actor shared by every worker) moves the
stage on when a version's truncation rate exceeds the threshold. With stages, the budget
schedule is not used (as in tirl's own trainer).

Pass-rate curriculum (`rl.curriculum`): a training row that `tirl.integrations.verl.curriculum.
CurriculumDataset` drew carries its trainer position in `extra_info`; the loop reports each of
its samples' (position, correct) to the run's board, a named Ray actor the dataset reads before
its next draw. Validation rows and rows of verl's own dataset report nothing.

Sandbox: one per worker process, made on first use and shared by its trajectories
(`worker_sandbox`): a local `tirl.sandbox.Sandbox` by default (sessions forked on the node the
worker runs on), a `RaySandboxPool` of `tirl.sandbox.actors` actors spread over verl's Ray
cluster, or `HTTPSandbox` over `tirl sandbox serve` URLs; limits from the run config's
`sandbox` section. Closed when the process exits.

How verl finds the loop: verl instantiates agent loops from `_agent_loop_registry`, which
`@register(name)` fills when this module is imported, and which the worker also fills from
`actor_rollout_ref.rollout.agent.agent_loop_config_path` (a YAML list of
`{name, _target_}`, imported by Hydra). So either of:

    actor_rollout_ref.model.external_lib=tirl.integrations.verl.agent_loop
        (verl's HFModelConfig imports it in every worker that builds the model config,
        AgentLoopWorker included; no file needed)
    actor_rollout_ref.rollout.agent.agent_loop_config_path=/abs/agent_loops.yaml
        with `- {name: tirl, _target_: tirl.integrations.verl.agent_loop.TirlAgentLoop}`
        (`AGENT_LOOP_YAML`; the file must be readable on every node; tirl's tests
        register the loop this way)

and rows with `agent_name: tirl` (or `actor_rollout_ref.rollout.agent.default_agent_loop=tirl`).

The verl config keys this loop reads (Hydra: `+tirl.<key>=...`, they are not in verl's schema):

    tirl.config            path of the tirl run config (`RunConfig` YAML), required
    tirl.overrides         list of `key=value` overrides applied to it (default none)
    tirl.sandbox.kind      local | ray | http (default local)
    tirl.sandbox.urls      `tirl sandbox serve` base URLs (kind http)
    tirl.sandbox.actors    sandbox actors of a RaySandboxPool (kind ray, default 1)
    tirl.start_stage       the expansion stage a resumed run starts from (default 0; the
                           board is not in verl's checkpoints)

and from verl's own: `actor_rollout_ref.rollout.{prompt_length, response_length, name,
full_determinism}`, `actor_rollout_ref.model.path` (its generation config's end-of-sequence
ids). From the run config: `protocol` (name and boundary), `prompt.chat`, `prompt.system`,
`variants` (exactly one: code or text), `sandbox.*`, `rl.{steps, max_model_tokens,
budget_schedule, reward, reward_params, composite_*, overlong_buffer, overlong_penalty,
mask_tool_output, stages, expansion_threshold}`, `eval.{max_model_tokens, tool_budget}`.
Sampling (temperature, top_p, top_k, log-probs, greedy validation) comes from verl's sampling
parameters.

A trajectory whose engine request or sandbox start failed is not trained on with a made-up
reward: the loop raises, and verl's step fails with the error (architecture.md invariant 6; the
sandbox's own failures, a timeout or a crash, reach the model as text and are not errors).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tirl.config import ConfigError, from_dict
from tirl.integrations.verl import require_verl

require_verl()

from omegaconf import OmegaConf  # noqa: E402  (verl's config library, after the version check)
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopOutput,
    register,
)
from verl.utils.rollout_trace import rollout_trace_op  # noqa: E402

from tirl.integrations.verl.config import (  # noqa: E402
    AGENT_LOOP_NAME,
    TIRL_SECTION,
    run_config_from_verl,
)
from tirl.integrations.verl.curriculum import report_sample  # noqa: E402
from tirl.integrations.verl.data import (  # noqa: E402
    PromptSettings,
    prompt_settings_of_row,
    same_prompt,
    task_of_row,
)
from tirl.integrations.verl.engine import PARAM_NAMES, VerlServerEngine, new_request_id  # noqa: E402
from tirl.integrations.verl.estimators import register_estimators  # noqa: E402
from tirl.integrations.verl.stages import SharedStages, StageView, shared_stages  # noqa: E402
from tirl.protocol import Protocol, get_protocol  # noqa: E402
from tirl.protocol.segments import Segment, SegmentKind, Trajectory  # noqa: E402
from tirl.rewards.reward import configured_reward  # noqa: E402
from tirl.rewards.toolstats import tool_stats  # noqa: E402
from tirl.rollout.limits import budget_at, is_truncated  # noqa: E402
from tirl.rollout.runner import Rollout  # noqa: E402
from tirl.run.build import rollout_settings  # noqa: E402
from tirl.run.config import RunConfig  # noqa: E402
from tirl.sandbox import SandboxClient  # noqa: E402
from tirl.sandbox.config import SandboxConfig, make_sandbox  # noqa: E402
from tirl.tasks.scoring import score_trajectory  # noqa: E402
from tirl.tools import toolset_protocol  # noqa: E402

AGENT_LOOP_YAML = (
    f"- name: {AGENT_LOOP_NAME}\n  _target_: tirl.integrations.verl.agent_loop.TirlAgentLoop\n"
)
SECTION_KEYS = ("config", "overrides", "sandbox", "start_stage")  # what `tirl.*` may hold
EVAL_SPLIT = "test"  # tasks of this split are validation rows (`tirl verl data`'s data.eval)
ERROR_FINISHES = ("error", "cancelled")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class LoopSetup:
    """Everything a worker process's trajectories share, read once from verl's config."""

    run: RunConfig
    protocol: Protocol
    prompt: PromptSettings
    use_tools: bool
    reward: Callable[[Trajectory], float]
    sandbox: SandboxConfig  # the run's `sandbox` section, with verl's `tirl.sandbox` keys over it
    start_stage: int = 0

    def stages(self) -> SharedStages:
        """The run's expansion-stage board (only with `rl.stages`)."""
        rl = self.run.rl
        return shared_stages(
            self.run.name, rl.expansion_threshold, len(rl.stages), self.start_stage
        )

    async def limits(self, evaluating: bool) -> TrajectoryLimits:
        """The limits of a trajectory starting now (with stages: the board as it is now)."""
        staged = bool(self.run.rl.stages) and not evaluating
        return TrajectoryLimits(
            self.run, evaluating, await self.stages().view() if staged else None
        )


@dataclass(frozen=True)
class TrajectoryLimits:
    """A trajectory's model-token limit and tool budget, given the policy versions its engine
    has seen so far: evaluation's (validation rows); the expansion stage of the version it
    started under (`rl.stages`, `view` is the board it read); or `rl.max_model_tokens` and
    CIR's budget schedule at the newest version."""

    run: RunConfig
    evaluating: bool
    view: StageView | None = None

    def stage(self, engine: VerlServerEngine) -> int | None:
        return None if self.view is None else self.view.stage(engine.min_version)

    def model_tokens(self, engine: VerlServerEngine) -> int:
        if self.evaluating:
            return self.run.eval.max_model_tokens
        if self.view is not None:
            return self.run.rl.stages[self.stage(engine)].max_model_tokens
        return self.run.rl.max_model_tokens

    def tool_budget(self, engine: VerlServerEngine) -> int:
        if self.evaluating:
            return self.run.eval.tool_budget
        rl = self.run.rl
        if self.view is not None:
            return rl.stages[self.stage(engine)].tool_budget
        return scheduled_budget(rl.budget_schedule, engine.policy_version, rl.steps)


def scheduled_budget(schedule: list[list[float]], version: int | None, total_steps: int) -> int:
    """CIR's tool budget for weights of policy `version` (None: not reported, taken as 0):
    `budget_at(schedule, version / total_steps)`."""
    return budget_at(schedule, (version or 0) / max(1, total_steps))


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def loop_setup(trainer_config: Any) -> LoopSetup:
    """The loop's setup from verl's whole config (its `tirl` section); ConfigError naming the
    key when something is wrong. Cached per process: verl builds a loop per sample."""
    section = _plain(trainer_config.get(TIRL_SECTION)) if trainer_config is not None else None
    return _setup_from(json.dumps(section, sort_keys=True, default=str))


@functools.lru_cache(maxsize=8)
def _setup_from(section_json: str) -> LoopSetup:
    section = json.loads(section_json)
    if not isinstance(section, dict):
        section = {}
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key {TIRL_SECTION}.{unknown[0]} (the loop reads"
            f" {', '.join(f'{TIRL_SECTION}.{k}' for k in SECTION_KEYS)})",
            f"{TIRL_SECTION}.{unknown[0]}",
        )
    run = run_config_from_verl({TIRL_SECTION: section})
    # `+tirl.sandbox.kind=ray` and the like place the sandbox for this launch: verl's keys
    # over the run config's own sandbox section (one shape, tirl.sandbox.config).
    over = section.get("sandbox") or {}
    if not isinstance(over, dict):
        raise ConfigError(f"{TIRL_SECTION}.sandbox must be a mapping", f"{TIRL_SECTION}.sandbox")
    sandbox = from_dict(
        SandboxConfig, {**dataclasses.asdict(run.sandbox), **over}, f"{TIRL_SECTION}.sandbox"
    )
    if len(run.variants) != 1:
        raise ConfigError(
            f"variants: one verl launch trains one policy, so the run config must name exactly"
            f" one of code / text, got {run.variants}",
            "variants",
        )
    start_stage = section.get("start_stage", 0)
    if not isinstance(start_stage, int) or not 0 <= start_stage < max(1, len(run.rl.stages)):
        raise ConfigError(
            f"{TIRL_SECTION}.start_stage must be a stage index of rl.stages"
            f" (0 to {max(0, len(run.rl.stages) - 1)}), got {start_stage!r}",
            f"{TIRL_SECTION}.start_stage",
        )
    # the run's tools: their blocks are detected, the enabled ones run (tirl.tools)
    protocol = toolset_protocol(get_protocol(run.protocol.name, run.protocol.boundary), run.tools)
    return LoopSetup(
        run=run,
        protocol=protocol,
        prompt=PromptSettings(protocol, run.prompt.chat, run.prompt.system),
        use_tools=run.variants[0] == "code",
        reward=configured_reward(run.rl.reward, run.rl.reward_kwargs()),
        sandbox=sandbox,
        start_stage=start_stage,
    )


# ---------------------------------------------------------------- the sandbox of a process


@dataclass
class _WorkerSandbox:
    loop: asyncio.AbstractEventLoop
    client: SandboxClient
    started: asyncio.Task


_SANDBOXES: dict[tuple, _WorkerSandbox] = {}


async def worker_sandbox(cfg: SandboxConfig) -> SandboxClient:
    """This process's sandbox for `cfg` (`sandbox.kind`: local, a RaySandboxPool in verl's Ray
    cluster, or `tirl sandbox serve` servers), started on first use (concurrent callers wait
    for the one start). A sandbox belongs to the event loop that started it, so a process that
    runs a new event loop (tests do) gets a new one."""
    loop = asyncio.get_running_loop()
    key = (json.dumps(dataclasses.asdict(cfg), sort_keys=True), id(loop))
    entry = _SANDBOXES.get(key)
    if entry is None or entry.loop is not loop:
        if entry is not None:  # a loop that is gone, whose id this one reuses
            _end(entry)
        client = make_sandbox(cfg)
        entry = _WorkerSandbox(loop, client, loop.create_task(client.start()))
        _SANDBOXES[key] = entry
        _close_at_exit()
    try:
        await asyncio.shield(entry.started)
    except Exception:
        if _SANDBOXES.get(key) is entry:
            del _SANDBOXES[key]
        raise
    return entry.client


async def close_worker_sandboxes() -> None:
    """Close the sandboxes this process started from the running event loop."""
    loop = asyncio.get_running_loop()
    for key, entry in list(_SANDBOXES.items()):
        if entry.loop is loop:
            del _SANDBOXES[key]
            with contextlib.suppress(Exception):
                await entry.client.close()


@functools.cache
def _close_at_exit() -> None:
    atexit.register(_close_all)


def _close_all() -> None:
    """At exit: every sandbox this process still holds."""
    for key, entry in list(_SANDBOXES.items()):
        del _SANDBOXES[key]
        _end(entry)


def _end(entry: _WorkerSandbox) -> None:
    """Close a sandbox on its own loop when that loop can still run; otherwise end a local
    sandbox's zygote (its sessions die with it). A RaySandboxPool's actors are owned by this
    process, so Ray ends them with it."""
    if not entry.loop.is_closed() and not entry.loop.is_running():
        with contextlib.suppress(Exception):
            entry.loop.run_until_complete(entry.client.close())
            return
    pid = getattr(entry.client, "zygote_pid", None)
    if pid:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


# ---------------------------------------------------------------- one trajectory


def cut_response(traj: Trajectory, max_response: int, decode: Callable) -> Trajectory:
    """`traj` with at most `max_response` ids after the prompt (verl's response tensor); a
    segment cut in two keeps its head, and a cut trajectory ends with "length". The tool
    calls are kept as they ran."""
    kept: list[Segment] = []
    room = max_response
    for seg in traj.segments:
        if seg.kind is SegmentKind.PROMPT:
            kept.append(seg)
            continue
        if room <= 0:
            break
        if len(seg.ids) > room:
            logprobs = None if seg.logprobs is None else seg.logprobs[:room]
            seg = Segment(seg.kind, seg.ids[:room], decode(seg.ids[:room]), logprobs)
        kept.append(seg)
        room -= len(seg.ids)
    if len(kept) == len(traj.segments) and all(a is b for a, b in zip(kept, traj.segments)):
        return traj
    meta = dict(traj.meta, response_cut=True)
    return Trajectory(kept, list(traj.tool_calls), "length", meta, task_id=traj.task_id)


def response_arrays(
    traj: Trajectory, mask_tool_output: bool = True
) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt ids, response ids, response mask, response log-probs) of `traj`: mask 1 on
    model ids (0 on interpreter ids unless `mask_tool_output` is off), log-prob 0.0 on
    interpreter ids and wherever the sampler gave none."""
    prompt = [i for s in traj.segments if s.kind is SegmentKind.PROMPT for i in s.ids]
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for seg in traj.response_segments:
        model = seg.kind is SegmentKind.MODEL
        ids += seg.ids
        mask += [1 if model or not mask_tool_output else 0] * len(seg.ids)
        logprobs += seg.logprobs if model and seg.logprobs is not None else [0.0] * len(seg.ids)
    return prompt, ids, mask, logprobs


def reward_extra_info(traj: Trajectory, budget: int, max_model_tokens: int) -> dict[str, float]:
    """`acc` and the tool statistics as numbers (verl averages them per data source in its
    validation metrics, so every sample has the same keys and no None)."""
    stats = tool_stats(traj)
    return {
        "acc": float(traj.correct),
        "tool_calls": float(stats["num_calls"]),
        "tool_ok": float(stats["num_ok"]),
        "tool_errors": float(stats["num_error"]),
        "tool_skipped": float(stats["num_skipped"]),
        "tool_void": float(stats["num_void"]),
        "model_tokens": float(stats["model_tokens"]),
        "tool_tokens": float(stats["tool_tokens"]),
        "truncated": float(is_truncated(traj)),
        "tool_budget": float(budget),
        "max_model_tokens": float(max_model_tokens),
    }


@functools.lru_cache(maxsize=8)
def _generation_eos_ids(model_path: str, use_shm: bool) -> tuple[int, ...]:
    """The end-of-sequence ids of the model's generation config (vLLM stops at them too)."""
    from verl.utils.fs import copy_to_local
    from verl.utils.model import get_generation_config

    try:
        config = get_generation_config(copy_to_local(model_path, use_shm=use_shm))
    except Exception:  # no generation config: the tokenizer's own ids still apply
        return ()
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        return ()
    return tuple(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos]))


@register(AGENT_LOOP_NAME)
class TirlAgentLoop(AgentLoopBase):
    """One tirl trajectory per verl sample (the module docstring says how and why)."""

    _renderers: dict = {}  # (id(tokenizer), PromptSettings) -> (tokenizer, PromptRenderer)

    @rollout_trace_op  # verl's rollout tracing (weave / mlflow), as its own loops do
    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        setup = loop_setup(self.config)
        extra_info = _plain(row.get("extra_info"))
        task = task_of_row(extra_info)
        row_prompt = prompt_settings_of_row(extra_info)
        if not same_prompt(row_prompt, setup.prompt):
            raise ConfigError(
                f"verl row {extra_info.get('index', '?')} (task {task.id}) was exported with"
                f" {_describe(row_prompt)}, but the run config says {_describe(setup.prompt)};"
                " export the data with the run's config"
            )
        renderer = self._renderer(setup.prompt)
        prompt_ids = renderer.prompt_ids(task.problem)
        prompt_length = self.rollout_config.prompt_length
        if len(prompt_ids) > prompt_length:
            raise ConfigError(
                f"verl row {extra_info.get('index', '?')} (task {task.id}): the prompt has"
                f" {len(prompt_ids)} tokens, more than rollout.prompt_length {prompt_length};"
                " raise data.max_prompt_length or set data.filter_overlong_prompts=True"
            )
        evaluating = task.split == EVAL_SPLIT
        limits = await setup.limits(evaluating)
        sandbox = None
        if setup.use_tools:
            sandbox = await worker_sandbox(setup.sandbox)

        response_length = self.rollout_config.response_length
        engine = self._engine(sampling_params, renderer.eos_id, row.get("priority", 0))
        rollout = Rollout(
            engine,
            self.tokenizer,
            sandbox,
            tool_budget_now=lambda: limits.tool_budget(engine),
            max_model_tokens_now=lambda: limits.model_tokens(engine),
        )
        engine.on_version = functools.partial(setattr, rollout, "policy_version")
        settings = rollout_settings(
            setup.run,
            setup.use_tools,
            max_model_tokens=limits.model_tokens(engine),
            tool_budget=limits.tool_budget(engine),
            temperature=float(sampling_params.get("temperature", 1.0)),
        )
        traj = await rollout.run(prompt_ids, settings)
        if traj.finish_reason in ERROR_FINISHES:
            raise RuntimeError(
                f"tirl agent loop, task {task.id}: the trajectory ended with"
                f" {traj.finish_reason}: {traj.meta.get('error')}"
            )
        traj = cut_response(traj, response_length, rollout.decode)
        max_model_tokens = limits.model_tokens(engine)
        if limits.view is not None:
            await setup.stages().report(
                _started_under(engine, task), is_truncated(traj), limits.stage(engine)
            )

        start = time.perf_counter()
        score_trajectory(traj, task)
        reward = setup.reward(traj)
        if not evaluating:  # a curriculum row's result feeds the next draws
            await report_sample(extra_info, bool(traj.correct))
        rl = setup.run.rl
        if not evaluating and rl.overlong_buffer > 0:
            reward += _overlong(traj.num_model_tokens, max_model_tokens, rl)
        score_s = time.perf_counter() - start

        prompt, ids, mask, logprobs = response_arrays(traj, rl.mask_tool_output)
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=ids,
            response_mask=mask,
            response_logprobs=logprobs if sampling_params.get("logprobs") else None,
            reward_score=float(reward),
            num_turns=1 + len(traj.response_segments),
            metrics={
                "generate_sequences": engine.generate_s,
                "tool_calls": sum(c.duration_s for c in traj.tool_calls),
                "compute_score": score_s,
                "num_preempted": -1 if engine.num_preempted is None else engine.num_preempted,
            },
            extra_fields={
                "reward_extra_info": reward_extra_info(
                    traj, limits.tool_budget(engine), max_model_tokens
                ),
                "finish_reason": traj.finish_reason,
                "task_id": task.id,
                "policy_version": engine.policy_version,
                "min_global_steps": engine.min_version,
                "max_global_steps": max(engine.versions) if engine.versions else None,
                "turn_scores": [],  # verl's default keys, kept so batches concatenate
                "tool_rewards": [],
            },
        )

    # ------------------------------------------------------------------ helpers
    def _engine(self, sampling_params: Mapping[str, Any], eos_id: int, priority: Any):
        rollout_config = self.rollout_config
        model = self.config.actor_rollout_ref.model
        eos_ids = {eos_id, self.tokenizer.eos_token_id}
        eos_ids.update(_generation_eos_ids(str(model.path), bool(model.get("use_shm", False))))
        priority = int(priority)
        request_id = new_request_id
        if rollout_config.get("full_determinism", False):  # as verl's own loops name requests
            request_id = lambda: f"det-{priority}"  # noqa: E731
        name = rollout_config.get("name")
        return VerlServerEngine(
            self.server_manager,
            self.tokenizer,
            sampling_params={k: v for k, v in sampling_params.items() if k != "temperature"},
            eos_ids=eos_ids,
            max_response_tokens=rollout_config.response_length,
            backend=name if name in PARAM_NAMES else "vllm",
            request_id=request_id,
            request_kwargs={"priority": priority},
        )

    def _renderer(self, settings: PromptSettings):
        key = (id(self.tokenizer), settings)
        cached = self._renderers.get(key)
        if cached is None or cached[0] is not self.tokenizer:
            cached = (self.tokenizer, settings.renderer(self.tokenizer))
            self._renderers[key] = cached
        return cached[1]


def _started_under(engine: VerlServerEngine, task) -> int:
    """The policy version a trajectory started under (what its stage-board report counts for);
    stage expansion cannot count steps without it."""
    if engine.min_version is None:
        raise RuntimeError(
            f"tirl agent loop, task {task.id}: rl.stages needs the policy version of every"
            " response (verl's extra_fields['global_steps']), and the server reported none"
        )
    return engine.min_version


def _describe(settings: PromptSettings) -> str:
    p = settings.protocol
    return (
        f"protocol {p.name} ({p.boundary.value}), prompt.chat {settings.chat},"
        f" prompt.system {settings.system!r}"
    )


def _overlong(model_tokens: int, max_model_tokens: int, rl) -> float:
    import torch

    from tirl.algos.overlong import overlong_penalty

    lengths = torch.tensor([model_tokens])
    return float(
        overlong_penalty(lengths, max_model_tokens, rl.overlong_buffer, rl.overlong_penalty)
    )


# verl computes advantages in its trainer process, which imports this module through
# `actor_rollout_ref.model.external_lib` (what `tirl verl config` sets): the estimators tirl
# adds (`tirl_reinforce_plus_plus`, ...) must be registered there too.
register_estimators()
