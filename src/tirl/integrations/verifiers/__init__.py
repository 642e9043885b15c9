"""tirl and PrimeIntellect's `verifiers` (0.4.0, its v1 API), both directions.

Export: `TirlTaskset` (taskset.py) serves any tirl task source as a verifiers taskset whose
reward is the task's own scorer; `TirlHarness` (harness.py) is the program the agent runs:
one reply (single-turn) or, with `python` on, turns whose code blocks run in a tirl sandbox
session that lives for the rollout. verifiers finds both by the taskset id `tirl-verifiers`
(the top-level module `tirl_verifiers`, which re-exports them; verifiers/v1/utils/loaders.py
imports a taskset id as a module and takes the one Taskset, and Harness, it exports), e.g.

    vf-eval tirl-verifiers --env.taskset.source '{"source": "races"}' -n 8 ...

Import: the task source `verifiers` (`tirl.tasks.sources.verifiers_env`).

Needs `pip install 'tirl[verifiers]'`. Nothing here reaches the network by itself: the model
endpoint, the runtime and the client are the caller's (verifiers' defaults are Prime's hosted
inference and sandboxes: point them elsewhere).
"""

from tirl.integrations.verifiers.env import TirlEnv, TirlEnvConfig
from tirl.integrations.verifiers.harness import TirlHarness, TirlHarnessConfig
from tirl.integrations.verifiers.taskset import (
    TirlData,
    TirlTaskBehaviour,
    TirlTaskset,
    TirlTasksetConfig,
)

__all__ = [
    "TirlData",
    "TirlEnv",
    "TirlEnvConfig",
    "TirlHarness",
    "TirlHarnessConfig",
    "TirlTaskBehaviour",
    "TirlTaskset",
    "TirlTasksetConfig",
]
