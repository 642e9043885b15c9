"""The environment `vf-eval tirl-verifiers` runs: verifiers' single-agent env, with tirl's
harness and the local runtime as the agent's defaults.

verifiers 0.4.0 resolves a run's env from the taskset id: the one `Env` subclass the taskset's
module exports, else `SingleAgentEnv` (verifiers/v1/utils/loaders.py `environment_class`).
Its seat's harness, left unpinned, is the taskset's own; but a flag under
`--env.agent.harness.*` pins it, and a pinned harness without an id is verifiers' `bash`
(`AgentConfig._resolve_harness`), which has no `python` field: `--env.agent.harness.python
true` alone failed with "Extra inputs are not permitted". Here the seat's declared default
names tirl's harness, so such flags merge onto it (`merge_agent_defaults`), and its runtime is
verifiers' local subprocess one: tirl's harness runs its loop in the eval's process and its
code in tirl's own sandbox, so the default (Prime's hosted sandboxes, which need `prime login`)
is never wanted. `--env.agent.harness.id` or `--env.agent.runtime.type` still choose others.
"""

from __future__ import annotations

import verifiers.v1 as vf

from tirl.integrations.verifiers.harness import TirlHarnessConfig

TASKSET_ID = "tirl-verifiers"


def default_agent() -> vf.AgentConfig:
    """The seat's declared default. Built without validation: validating it resolves the
    harness id by importing `tirl_verifiers`, the module that is importing this one."""
    return vf.AgentConfig.model_construct(
        harness=TirlHarnessConfig(id=TASKSET_ID), runtime=vf.SubprocessConfig()
    )


class TirlEnvConfig(vf.SingleAgentEnvConfig):
    """`SingleAgentEnvConfig` whose `agent` seat defaults to tirl's harness, run locally."""

    agent: vf.AgentConfig = default_agent()
    """The one seat; `--env.agent.harness.python true` gives it tirl's Python sandbox."""


class TirlEnv(vf.SingleAgentEnv, vf.Env[TirlEnvConfig]):
    """verifiers' single-agent env over `TirlEnvConfig` (see the module doc)."""
