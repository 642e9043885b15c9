"""The training gateway: an OpenAI-compatible endpoint that records what an agent's model did.

An unmodified agent program (the `openai` SDK in a plain script) is pointed at a session's
base URL, `http://127.0.0.1:PORT/sessions/<id>/v1`: that is the only change it needs. Every
call it makes is answered by the policy behind the gateway and recorded, with the exact prompt
ids the policy was fed, the ids it sampled, their log-probs and the finish reason
(`tirl.rollout.sessions.RecordedCall`). When the program is done the session becomes one
`Trajectory` (`collect`), token-faithful or refused (`tirl.rollout.sessions`).

Routes (the session id is an unguessable token; an unknown or collected one is a 404):

- `POST /sessions/<id>/v1/chat/completions`, `POST /sessions/<id>/v1/completions`: exactly
  what `tirl serve` accepts and answers (`tirl.apps.server_requests`, `tirl.apps.server`,
  whose request checks and engine path this reuses), but one choice per call (`n` 1, one
  prompt): a session is one conversation;
- `GET /sessions/<id>/v1/models` (and `/models/<name>`);
- `POST /sessions/<id>/reward` with `{"reward": <finite number>}`: the program's own reward
  (the last one posted counts);
- `POST /sessions/<id>/end`: the program says it is done (the caller may also end a session
  itself, e.g. when the program's process exits);
- `GET /health`, as `tirl serve`'s.

Token in: a call's prompt text (the chat template's rendering, or a completion's prompt text)
that continues the previous call's prompt text and the text the gateway returned for it gets
the previous prompt ids + the sampled ids, unchanged, and only the rest is tokenized
(`splice_prompt`); so a re-tokenization of the model's own text (a different BPE merge, a
special token the returned text skips, a cut stop string) never changes what the model is
conditioned on. Where the text does not continue it (the agent edited the assistant's text,
the template renders an earlier turn or the end of a turn differently from what was
sampled), the prompt is tokenized whole, the call is answered, and the session is refused
when collected, naming the call, the token position and the differing tokens: the
divergence is reported, never repaired.

In-process API: `async with gateway.serving() as url`, then `gateway.open_session(task)`,
run the program with `session.base_url`, `await session.ended.wait()` or
`gateway.end_session(id)`, and `gateway.collect(id)`. `run_agents` does all of it for a batch
of tasks with one agent subprocess each and returns scored trajectories.

Limits: loopback only (`serving` refuses any other address) and no API key (the session id is
the capability); log-probs are those of the unscaled policy, so an agent sampling at another
temperature is off-policy unless `temperature` pins it; calls of one session must not
overlap (a session with two calls in flight at once is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from tirl.apps.server import CompletionServer, error_response
from tirl.apps.server_requests import (
    BadRequest,
    GenerationRequest,
    parse_body,
    parse_chat,
    parse_completion,
    plain_encoder,
)
from tirl.backends.hf import HFEngine
from tirl.httpauth import is_loopback
from tirl.lifetime import dies_with_this_process
from tirl.protocol.segments import Trajectory
from tirl.rollout.sessions import RecordedCall, SessionRefused, assemble_trajectory, splice_prompt


@dataclass
class GatewaySession:
    """One agent run: its calls as recorded, the reward it posted, whether it has ended."""

    id: str
    base_url: str
    task: Any = None
    meta: dict = field(default_factory=dict)
    calls: list[RecordedCall] = field(default_factory=list)
    reward: float | None = None  # posted by the program
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    overlap: str | None = None  # why the session cannot be one conversation


class Gateway(CompletionServer):
    """`tirl serve`'s server, with a base URL per session and every call recorded."""

    def __init__(
        self,
        engine: HFEngine,
        tokenizer,
        model_name: str = "policy",
        temperature: float | None = None,
        max_queue: int | None = None,
    ) -> None:
        """`temperature`: every call samples at this temperature whatever the agent asks
        (None: as asked); 1.0 keeps training on-policy."""
        super().__init__(engine, tokenizer, model_name, api_key=None, max_queue=max_queue)
        self.temperature = temperature
        self.sessions: dict[str, GatewaySession] = {}
        self.url: str | None = None
        self._encode = plain_encoder(tokenizer)
        eos = tokenizer.eos_token_id
        self._eos = (eos, tokenizer.decode([eos]) if eos is not None else None)

    def app(self) -> web.Application:
        app = self.application()
        base = "/sessions/{sid}"
        app.router.add_get("/health", self.health)
        app.router.add_get(base + "/v1/models", self.session_models)
        app.router.add_get(base + "/v1/models/{model:.+}", self.session_model)
        app.router.add_post(base + "/v1/completions", self.session_completions)
        app.router.add_post(base + "/v1/chat/completions", self.session_chat)
        app.router.add_post(base + "/reward", self.post_reward)
        app.router.add_post(base + "/end", self.post_end)
        return app

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """Serve on `host:port` (0: a free port) in this event loop; yields the root URL."""
        if not is_loopback(host):
            raise ValueError(f"the training gateway listens on loopback only, not {host!r}")
        runner = web.AppRunner(
            self.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            url_host = f"[{host}]" if ":" in host else host
            self.url = f"http://{url_host}:{runner.addresses[0][1]}"
            yield self.url
        finally:
            self.url = None
            await runner.cleanup()

    # -- the in-process API ------------------------------------------------------------------

    def open_session(self, task: Any = None, meta: dict | None = None) -> GatewaySession:
        """A new session (serving must have started): hand `session.base_url` to the agent."""
        if self.url is None:
            raise RuntimeError("open a session while the gateway is serving (`serving()`)")
        sid = uuid.uuid4().hex
        session = GatewaySession(sid, f"{self.url}/sessions/{sid}/v1", task, dict(meta or {}))
        self.sessions[sid] = session
        return session

    def end_session(self, sid: str) -> None:
        """No more calls for `sid` (later ones are a 409); those in flight still finish."""
        self.sessions[sid].ended.set()

    def collect(self, sid: str) -> Trajectory:
        """Session `sid` as one trajectory (removing it), with `meta["session"]` and, when
        the program posted one, `meta["posted_reward"]`; SessionRefused if it cannot be one
        (`tirl.rollout.sessions`)."""
        session = self.sessions.pop(sid)
        session.ended.set()
        if session.overlap is not None:
            raise SessionRefused(session.overlap)
        meta = {**session.meta, "session": sid}
        if session.reward is not None:
            meta["posted_reward"] = session.reward
        return assemble_trajectory(session.calls, self._decode, meta)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # -- routes ------------------------------------------------------------------------------

    def _session(self, request: web.Request) -> GatewaySession | web.Response:
        sid = request.match_info["sid"]
        session = self.sessions.get(sid)
        if session is None:
            shown = sid if len(sid) <= 64 else sid[:61] + "..."
            return error_response(
                404,
                f"no session {shown!r} here: it was never opened, or has been collected",
                "session",
                "session_not_found",
            )
        return session

    async def session_models(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return session if isinstance(session, web.Response) else await self.models(request)

    async def session_model(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return session if isinstance(session, web.Response) else await self.model(request)

    async def session_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._session_call(request, parse_completion)

    async def session_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._session_call(request, parse_chat)

    async def _session_call(self, request: web.Request, parse) -> web.StreamResponse:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        if session.ended.is_set():
            return error_response(
                409, "this session has ended: it takes no more calls", "session", "session_ended"
            )
        if session.in_flight and session.overlap is None:
            session.overlap = (
                f"call {len(session.calls) + session.in_flight + 1} of the session started while"
                " another was in flight: a session is one conversation, one call at a time"
            )
        session.in_flight += 1
        try:
            return await self._serve(request, self._recording(session, parse))
        finally:
            session.in_flight -= 1

    def _recording(self, session: GatewaySession, parse) -> Callable:
        """`parse`, with the session's splice as its encoder and a recorder on its choice."""

        def run(body: dict[str, Any], limits, tokenizer) -> GenerationRequest:
            seen: dict[str, Any] = {}

            def encode(text: str) -> list[int]:
                previous = session.calls[-1] if session.calls else None
                found = splice_prompt(previous, text, self._encode, *self._eos)
                seen.update(text=text, spliced=found.ids is not None, note=found.note)
                return found.ids if found.ids is not None else self._encode(text)

            req = parse(body, limits, tokenizer, encode)
            if req.n != 1 or len(req.prompts) != 1:
                raise BadRequest(
                    "n" if req.n != 1 else "prompt",
                    "the training gateway takes one prompt and n = 1 per call: a session is"
                    " one conversation",
                )
            if self.temperature is not None:
                req = replace(req, temperature=self.temperature)

            def record(prompt_ids: list[int], choice: Any) -> None:
                session.calls.append(
                    RecordedCall(
                        list(prompt_ids),
                        list(choice.ids),
                        list(choice.logprobs),
                        choice.finish_reason,
                        prompt_text=seen.get("text"),
                        returned_text=choice.text,
                        spliced=seen.get("spliced", False),
                        splice_note=seen.get("note"),
                    )
                )

            return replace(req, on_choice=record)

        return run

    async def post_reward(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        try:
            body = parse_body(await request.read())
            reward = body.get("reward")
            if set(body) != {"reward"} or not _finite(reward):
                raise BadRequest(
                    "reward", 'the body must be {"reward": <a finite number>}, nothing else'
                )
        except BadRequest as e:
            return error_response(e.status, str(e), e.param, e.code)
        session.reward = float(reward)
        return web.json_response({"session": session.id, "reward": session.reward})

    async def post_end(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        session.ended.set()
        return web.json_response({"session": session.id, "ended": True})


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# -- a batch of agent runs -------------------------------------------------------------------

# Variables of the gateway's own that an agent program may read besides OPENAI_BASE_URL.
PROMPT_ENV = "TIRL_TASK_PROMPT"
REWARD_URL_ENV = "TIRL_REWARD_URL"
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def agent_env(session: GatewaySession, prompt: str) -> dict[str, str]:
    """The environment an agent program runs in: its own, with the `openai` SDK pointed at the
    session (OPENAI_BASE_URL, a placeholder OPENAI_API_KEY), the task's prompt in
    TIRL_TASK_PROMPT, the reward URL in TIRL_REWARD_URL, and no proxy (loopback only)."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    root = session.base_url.rsplit("/v1", 1)[0]
    env.update(
        OPENAI_BASE_URL=session.base_url,
        OPENAI_API_KEY="tirl-gateway",
        NO_PROXY="127.0.0.1,localhost,::1",
        no_proxy="127.0.0.1,localhost,::1",
        **{PROMPT_ENV: prompt, REWARD_URL_ENV: f"{root}/reward"},
    )
    return env


async def run_agents(
    gateway: Gateway,
    command: Sequence[str],
    tasks: Sequence[Any],
    *,
    group_size: int = 1,
    concurrency: int = 8,
    timeout_s: float = 120.0,
    score: Callable[[Trajectory, Any], float | None] | None = None,
    env: dict[str, str] | None = None,
) -> list[Trajectory]:
    """Run `command` (an agent program) once per task x `group_size`, each against a session
    of its own on the serving `gateway`, at most `concurrency` at once; returns the
    trajectories in task order, each with `meta["task"]` (the task's index, what RL groups
    by) and `meta["reward"]`: the reward the program posted,
    else `score(traj, task)` (None: the program must post one). A task is anything with a
    `problem` attribute (a `tirl.tasks.Task`) or a string. A run that fails (the program
    exits non-zero or times out, or its session is refused or posts no reward) is a
    trajectory with finish_reason "error" and `meta["error"]`, counted, never dropped.
    `env`: more variables for the program (its settings)."""
    limit = asyncio.Semaphore(concurrency)

    async def one(task: Any, index: int) -> Trajectory:
        async with limit:
            prompt = task if isinstance(task, str) else task.problem
            session = gateway.open_session(task, {"task": index})
            variables = {**agent_env(session, prompt), **(env or {})}
            error = await _run_program(command, variables, timeout_s)
            gateway.end_session(session.id)
            while session.in_flight:  # a call the program left behind finishes or is cut
                await asyncio.sleep(0.01)
            try:
                traj = gateway.collect(session.id)
            except SessionRefused as e:
                return _failed(str(e), session, index)
            if error is not None:
                return _failed(error, session, index, traj)
            reward = traj.meta.get("posted_reward")
            if reward is None and score is not None:
                reward = score(traj, task)
            if reward is None:
                return _failed("the program posted no reward", session, index, traj)
            traj.meta["reward"] = float(reward)
            return traj

    jobs = [one(t, i) for i, t in enumerate(tasks) for _ in range(group_size)]
    return list(await asyncio.gather(*jobs))


async def _run_program(command: Sequence[str], env: dict[str, str], timeout_s: float) -> str | None:
    """Run the agent program to its end; None, or why it failed (one line)."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=dies_with_this_process(),  # a trainer killed outright takes it along
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return f"the agent program ran past {timeout_s:g} s and was killed"
    except BaseException:  # cancelled: the program must not outlive its caller
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode:
        last = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"the agent program exited with {proc.returncode}: {last[0][:300]}"
    return None


def _failed(
    error: str, session: GatewaySession, index: int, traj: Trajectory | None = None
) -> Trajectory:
    traj = traj or Trajectory(meta={"session": session.id})
    traj.finish_reason = "error"
    traj.meta.update(error=error, task=index)
    print(f"tirl gateway: session {session.id}: {error}", file=sys.stderr, flush=True)
    return traj
