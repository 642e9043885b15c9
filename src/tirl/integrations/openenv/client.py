"""OpenEnv's WebSocket client (`openenv.core.EnvClient`) for tirl's environment server.

    async with TirlEnvClient(base_url="http://127.0.0.1:8000") as env:
        result = await env.reset(seed=7)           # result.observation.text: the problem
        result = await env.step(TirlAction(message="```python\\nprint(6 * 7)\\n```"))
        result = await env.step(TirlAction(message="The answer is \\\\boxed{42}."))
        result.reward, result.done, result.observation.correct

Each client is one WebSocket session on the server: its own episode and sandbox session.
`.sync()` gives OpenEnv's synchronous wrapper. Errors the server reports (a step before reset,
a malformed message, naming its fields) raise RuntimeError("Server error: ...") as in every
OpenEnv client. A server at capacity answers a new connection with its error and closes it;
OpenEnv's client then fails on its next send with a bare `ConnectionClosedOK received 1000
(OK)`. Here the error the server sent is read back and raised as the same one line
("Server error: the server is at capacity: ... (code: CAPACITY_REACHED)"), the closed
connection is dropped, and the next call connects afresh.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from websockets.exceptions import ConnectionClosed

from tirl.integrations.openenv.env import TirlAction, TirlObservation, TirlState


class TirlEnvClient(EnvClient[TirlAction, TirlObservation, TirlState]):
    """Typed client: actions are `TirlAction`s, results carry `TirlObservation`s."""

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return await super()._send_and_receive(message)
        except ConnectionClosed as e:
            ws, self._ws = self._ws, None  # closed: the next call connects afresh
            reason = f"the server closed the connection ({e})"
            try:  # what the server said before it closed (its capacity error)
                reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=1.0))
                if reply.get("type") == "error":
                    data = reply.get("data", {})
                    reason = f"{data.get('message')} (code: {data.get('code', 'UNKNOWN')})"
            except (ConnectionClosed, asyncio.TimeoutError, ValueError, AttributeError):
                pass
            raise RuntimeError(f"Server error: {reason}") from None
        except RuntimeError as e:
            if "(code: CAPACITY_REACHED)" in str(e):
                self._ws = None  # the server closes a refused connection: start afresh
            raise

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
