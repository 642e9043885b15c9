"""Every extension point by the name docs/extending.md gives it, with what is registered there
now, plugins included (`tirl config --keys` prints it)."""

from __future__ import annotations

from collections.abc import Iterable


def registered() -> dict[str, list[str]]:
    """Extension point -> the names a config may give it, in the order the guide lists them."""
    from tirl.algos.advantages import ADVANTAGE_ESTIMATORS
    from tirl.algos.losses import POLICY_LOSSES
    from tirl.envs.registry import REGISTRY as ENVIRONMENTS
    from tirl.protocol import PROTOCOLS
    from tirl.rewards.reward import REWARDS
    from tirl.rollout.engines import ENGINES
    from tirl.sandbox.config import SANDBOX_TRANSPORTS
    from tirl.tasks.registry import SOURCES
    from tirl.tools import TOOLS

    points: dict[str, Iterable[str]] = {
        "task sources (data.*[].source)": SOURCES,
        "RACES environments (races source: envs)": ENVIRONMENTS.names(),
        "advantage estimators (rl.advantage)": ADVANTAGE_ESTIMATORS,
        "policy losses (rl.policy_loss)": POLICY_LOSSES,
        "rewards (rl.reward)": REWARDS,
        "protocols (protocol)": PROTOCOLS,
        "rollout engines (rollout.engine)": ENGINES,
        "sandbox transports (sandbox.kind)": SANDBOX_TRANSPORTS,
        "tools (tools)": TOOLS,
    }
    return {point: list(names) for point, names in points.items()}
