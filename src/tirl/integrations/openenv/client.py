"""OpenEnv's WebSocket client (`openenv.core.EnvClient`) for tirl's environment server.

    async with TirlEnvClient(base_url="http://127.0.0.1:8000") as env:
        result = await env.reset(seed=7)           # result.observation.text: the problem
        result = await env.step(TirlAction(message="```python\\nprint(6 * 7)\\n```"))
        result = await env.step(TirlAction(message="The answer is \\\\boxed{42}."))
        result.reward, result.done, result.observation.correct

Each client is one WebSocket session on the server: its own episode and sandbox session.
`.sync()` gives OpenEnv's synchronous wrapper. Errors the server reports (a step before reset,
a malformed message) raise RuntimeError("Server error: ...") as in every OpenEnv client.
"""

from __future__ import annotations

from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult

from tirl.integrations.openenv.env import TirlAction, TirlObservation, TirlState


class TirlEnvClient(EnvClient[TirlAction, TirlObservation, TirlState]):
    """Typed client: actions are `TirlAction`s, results carry `TirlObservation`s."""

    def _step_payload(self, action: TirlAction | str) -> dict[str, Any]:
        if isinstance(action, str):
            action = TirlAction(message=action)
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TirlObservation]:
        observation = TirlObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
        )
        return StepResult(observation, payload.get("reward"), bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> TirlState:
        return TirlState(**payload)
