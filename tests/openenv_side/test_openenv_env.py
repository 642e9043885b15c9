"""tirl's task sources served as an OpenEnv environment, driven by OpenEnv's own client.

The rewards must be exactly tirl's: each answer is scored through the server and through the
same task made here by `make_source` with the same entry and seed (for RACES, every operator,
right, partly right and wrong answers), and an episode with code is scored as tirl scores the
same trajectory (`tirl.tasks.scoring.score_trajectory`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import pytest
from conftest import NETGUARD_LOG, RACES, RACES_SEED, netguard, openenv_server, run
from openenv.core import GenericEnvClient

from tirl.integrations.openenv.client import TirlEnvClient
from tirl.integrations.openenv.env import TirlAction
from tirl.protocol import CIR_FENCES
from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.tasks import make_source
from tirl.tasks.prompts import default_system_prompt
from tirl.tasks.scoring import score_trajectory

OPERATORS = ("sequential", "parallel", "sort", "select")
TIMEOUT_S = 120  # per message: a busy CI machine


def client(server) -> TirlEnvClient:
    return TirlEnvClient(base_url=server.url, message_timeout_s=TIMEOUT_S)


def code(source: str) -> str:
    """A message with one closed ```python block (CIR's fences)."""
    return f"Let me compute.\n{CIR_FENCES.render_code(source)}"


def partly_right(task) -> str:
    """The reference answer with its last line's value broken (SEQUENTIAL / PARALLEL: the
    other lines still earn credit), or its letters reversed (SORT / SELECT)."""
    if task.meta["operator"] in ("sequential", "parallel"):
        lines = task.answer.splitlines()
        last = max(i for i, line in enumerate(lines) if ": " in line)
        lines[last] = lines[last].split(": ")[0] + ": 123456789"
        return "\n".join(lines)
    letters = task.answer.removeprefix("<answer>").removesuffix("</answer>").split(", ")
    return "<answer>" + ", ".join(reversed(letters)) + "</answer>"


@pytest.fixture(scope="module")
def races_tasks():
    """The first train task of each operator, as tirl makes them here: index -> Task."""
    source = make_source(RACES, "source", RACES_SEED)
    found = {}
    for index in range(200):
        task = source.item("train", index)
        found.setdefault(task.meta["operator"], (index, task))
        if len(found) == len(OPERATORS):
            return dict(found.values())
    raise AssertionError(f"operators found in 200 tasks: {sorted(found)}")


# ------------------------------------------------------------------------------ rewards


def test_races_answers_score_exactly_as_tirl_scores_them_for_every_operator(
    races_server, races_tasks
):
    async def episodes():
        rewards = {}
        async with client(races_server) as env:
            for index, task in races_tasks.items():
                op = task.meta["operator"]
                answers = [task.answer, partly_right(task), "<answer>nonsense</answer>", "hmm"]
                for answer in answers:
                    start = await env.reset(seed=index)
                    assert start.observation.task_id == task.id
                    assert start.observation.text == task.problem  # the same task, another process
                    result = await env.step(TirlAction(message=f"I think:\n{answer}"))
                    tirl = task.score(f"I think:\n{answer}")
                    obs = result.observation
                    assert result.done and obs.done
                    assert (result.reward, obs.correct, obs.reason, obs.predicted) == (
                        tirl.reward, tirl.correct, tirl.reason, tirl.predicted,
                    ), (op, answer)  # fmt: skip
                    rewards.setdefault(op, []).append(result.reward)
        return rewards

    rewards = run(episodes())
    assert set(rewards) == set(OPERATORS)
    for op, got in rewards.items():
        assert got[0] == 1.0 and got[2] == 0.0 and got[3] == 0.0, (op, got)
        if op in ("sequential", "parallel"):  # partial credit comes through as tirl gives it
            assert 0.0 < got[1] < 1.0, (op, got)
        else:
            assert got[1] < 1.0, (op, got)


def test_arithmetic_answers_score_exactly_as_tirl_scores_them(arithmetic_server):
    source = make_source({"source": "arithmetic"}, "source", 0)

    async def episodes():
        out = []
        async with client(arithmetic_server) as env:
            for index in (0, 1):
                task = source.item("train", index)
                for answer in (f"\\boxed{{{task.answer}}}", "\\boxed{-1}", "no idea"):
                    await env.reset(seed=index)
                    result = await env.step(TirlAction(message=f"So it is {answer}."))
                    tirl = task.score(f"So it is {answer}.")
                    assert (result.reward, result.observation.correct) == (
                        tirl.reward,
                        tirl.correct,
                    )
                    assert result.observation.reason == tirl.reason
                    out.append(result.reward)
        return out

    assert run(episodes()) == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_an_episode_with_code_scores_as_tirl_scores_the_same_trajectory(races_server, races_tasks):
    """Tool output never scores (a printed answer block is the program's, not the model's);
    the prose of every message does, as in a tirl trajectory."""
    index, task = next((i, t) for i, t in races_tasks.items() if t.meta["operator"] == "sort")
    printed = code(f"print({task.answer!r})")  # the right answer, but only as tool output
    stated = f"{task.answer}\nLet me double-check.\n{CIR_FENCES.render_code('print(1)')}"
    cases = [(printed, "So that is it."), (stated, "Yes, that holds.")]

    async def episodes():
        out = []
        async with client(races_server) as env:
            for first, last in cases:
                start = await env.reset(seed=index)
                middle = await env.step(TirlAction(message=first))
                assert not middle.done and middle.reward is None
                end = await env.step(TirlAction(message=last))
                traj = Trajectory(
                    segments=[
                        Segment(SegmentKind.PROMPT, [], start.observation.text),
                        Segment(SegmentKind.MODEL, [], first),
                        Segment(SegmentKind.TOOL, [], middle.observation.text),
                        Segment(SegmentKind.MODEL, [], last),
                    ]
                )
                tirl = score_trajectory(traj, task)
                assert (end.reward, end.observation.reason) == (tirl.reward, tirl.reason)
                out.append(end.reward)
        return out

    assert run(episodes()) == [0.0, 1.0]


# ------------------------------------------------------------------------------ episodes


def test_reset_gives_the_problem_and_the_protocols_system_prompt(arithmetic_server):
    source = make_source({"source": "arithmetic"}, "source", 0)

    async def episode():
        async with client(arithmetic_server) as env:
            return await env.reset(seed=4, episode_id="group-7")

    result = run(episode())
    assert result.observation.text == source.item("train", 4).problem
    assert result.observation.system_prompt == default_system_prompt(CIR_FENCES)
    assert not result.done and result.reward is None


def test_the_same_seed_gives_the_same_task_in_every_session(races_server):
    async def starts():
        async def one(seed):
            async with client(races_server) as env:
                return (await env.reset(seed=seed)).observation

        return await asyncio.gather(one(2), one(2), one(3))

    a, b, c = run(starts())
    assert (a.task_id, a.text) == (b.task_id, b.text)
    assert a.task_id != c.task_id and a.text != c.text


def test_a_seed_past_the_task_count_wraps_around(arithmetic_server):
    """Any seed a trainer draws is a task, without generating billions of them first."""

    async def starts():
        async with client(arithmetic_server) as env:
            return [(await env.reset(seed=s)).observation.task_id for s in (4, 10_004, 2**40 + 4)]

    tasks = run(starts())  # 2**40 % 10_000 == 7_776
    assert tasks == ["arithmetic/train/4", "arithmetic/train/4", "arithmetic/train/7780"]


def test_code_runs_in_the_sandbox_and_state_persists_across_steps(arithmetic_server):
    async def episode():
        async with client(arithmetic_server) as env:
            await env.reset(seed=0, episode_id="ep-1")
            first = await env.step(TirlAction(message=code("x = 6 * 7\nprint(x)")))
            second = await env.step(TirlAction(message=code("print(x + 1)\n1 / 0")))
            state = await env.state()
            return first, second, state

    first, second, state = run(episode())
    assert first.observation.outputs == ["42"] and first.observation.statuses == ["ok"]
    assert first.observation.text == CIR_FENCES.render_output("42")  # as a rollout shows it
    assert not first.done and first.reward is None
    out = second.observation.outputs[0]
    assert second.observation.statuses == ["error"]
    assert out.startswith("43\n") and out.endswith("ZeroDivisionError: division by zero")
    assert (state.episode_id, state.step_count, state.tool_calls) == ("ep-1", 2, 2)
    assert state.task_id == "arithmetic/train/0" and not state.done


def test_python_and_shell_blocks_share_the_episodes_session():
    """With tools [python, shell] a ```bash block runs in the same session (and folder) as the
    Python blocks, by the rollout's own tool path."""
    message = (
        "First Python.\n"
        + CIR_FENCES.render_code("open('n.txt', 'w').write(str(6 * 7))")
        + "\nthen bash.\n```bash\necho $(( $(cat n.txt) + 1 ))\n```"
    )

    async def episode(url):
        async with TirlEnvClient(base_url=url, message_timeout_s=TIMEOUT_S) as env:
            await env.reset(seed=0)
            return await env.step(TirlAction(message=message))

    with openenv_server({"source": "arithmetic"}, "tools=[python, shell]") as server:
        result = run(episode(server.url))
    assert result.observation.statuses == ["ok", "ok"]
    assert result.observation.outputs == ["2", "43"]  # write() returns 2; bash read the file
    assert result.observation.tool_calls == 2


def test_a_block_for_a_tool_not_enabled_gets_one_line_and_is_not_run(arithmetic_server):
    async def episode():
        async with client(arithmetic_server) as env:
            await env.reset(seed=0)
            return await env.step(TirlAction(message="Try.\n```bash\ntouch /tmp/x\n```"))

    result = run(episode())
    assert result.observation.statuses == ["disabled"] and not result.done
    assert result.observation.outputs == [
        "Tool 'shell' is not enabled in this run (enabled: python): not run."
    ]
    assert result.observation.tool_calls == 0  # not counted against max_tool_calls


def test_two_concurrent_episodes_have_their_own_sandbox_sessions(arithmetic_server):
    async def episode(value: int):
        async with client(arithmetic_server) as env:
            await env.reset(seed=value)
            await env.step(TirlAction(message=code(f"x = {value}\nmine_{value} = True")))
            await asyncio.sleep(0.2)  # both sessions hold their variable now
            other = 1 - value
            seen = await env.step(TirlAction(message=code(f"print(x)\nprint(mine_{other})")))
            return seen.observation.outputs[0]

    async def both():
        return await asyncio.gather(episode(0), episode(1))

    zero, one = run(both())
    assert zero.startswith("0\n") and "NameError: name 'mine_1' is not defined" in zero
    assert one.startswith("1\n") and "NameError: name 'mine_0' is not defined" in one


def test_a_new_episode_starts_a_fresh_session(arithmetic_server):
    async def episodes():
        async with client(arithmetic_server) as env:
            await env.reset(seed=0)
            await env.step(TirlAction(message=code("y = 5")))
            await env.reset(seed=0)
            return await env.step(TirlAction(message=code("print(y)")))

    result = run(episodes())
    assert "NameError: name 'y' is not defined" in result.observation.outputs[0]


def test_one_block_over_the_tool_call_limit_ends_the_episode_with_reward_0(arithmetic_server):
    async def episode():  # the server allows 3 code blocks per episode
        async with client(arithmetic_server) as env:
            await env.reset(seed=0)
            two = code("a = 1") + "\n" + code("b = 2")
            ran = await env.step(TirlAction(message=two))
            over = await env.step(TirlAction(message=code("c = 3") + code("print(a + b + c)")))
            return ran, over, await env.state()

    ran, over, state = run(episode())
    assert ran.observation.outputs == ["", ""] and ran.observation.tool_calls == 2
    assert over.done and over.reward == 0.0 and over.observation.correct is False
    assert "tool-call limit" in over.observation.reason and "may run 3" in over.observation.reason
    assert state.done and state.tool_calls == 2  # the blocks over the limit did not run


def settled(server, count: int | None = None) -> int:
    """The number of processes under the server once it stops changing (or reaches `count`)."""
    last, deadline = -1, time.monotonic() + 30
    while time.monotonic() < deadline:
        now = len(server.descendants())
        if now == count or (count is None and now == last):
            return now
        last = now
        time.sleep(0.5)
    return len(server.descendants())


def test_a_session_is_closed_when_its_client_goes(arithmetic_server):
    """Each open episode holds one sandbox session (a process); a client that disconnects
    mid-episode leaves none behind."""
    before = settled(arithmetic_server)

    async def open_then_leave():
        clients = [client(arithmetic_server) for _ in range(2)]
        for env in clients:
            await env.connect()
            await env.reset(seed=0)
            await env.step(TirlAction(message=code("z = 1")))
        during = len(arithmetic_server.descendants())
        for env in clients:
            await env.close()
        return during

    during = run(open_then_leave())
    assert during == before + 2 + (before == 0)  # (+ the zygote, if no code had run before)
    assert settled(arithmetic_server, during - 2) == during - 2


def test_a_client_that_drops_mid_step_frees_its_slot_at_once_in_one_log_line():
    """A client gone while its cell runs (30 s) is noticed at once: the cell is cut, the
    session's slot (the only one) and sandbox session are freed, and the server logs one line,
    not OpenEnv's "Exception in ASGI application" with chained tracebacks."""
    import websockets

    async def drop_then_reconnect(server) -> tuple[float, set[int]]:
        async with websockets.connect(server.url.replace("http", "ws", 1) + "/ws") as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            await ws.recv()
            step = {"message": code("import time\ntime.sleep(30)")}
            await ws.send(json.dumps({"type": "step", "data": step}))
            await asyncio.sleep(1.0)  # the cell is running
            during = server.descendants()
            ws.transport.abort()  # gone, without a close handshake
        dropped = time.monotonic()
        while True:  # the one slot is refused until the dropped session is destroyed
            try:
                async with client(server) as env:
                    await env.reset(seed=1)
                    return time.monotonic() - dropped, during
            except (RuntimeError, websockets.ConnectionClosed):  # the capacity error, or close
                assert time.monotonic() - dropped < 20, "the slot was never freed"
                await asyncio.sleep(0.2)

    with openenv_server({"source": "arithmetic"}, "max_sessions=1", "sandbox.timeout_s=60") as srv:
        waited, during = run(drop_then_reconnect(srv))
        after = srv.descendants()
    assert waited < 10, f"the slot was held {waited:.1f} s: the cell ran on for nobody"
    assert during - after  # the dropped episode's session process is gone
    lines = [x for x in srv.stderr.strip().splitlines() if "refused a session" not in x]
    assert len(lines) == 1 and "went away mid-step" in lines[0], srv.stderr[-3000:]


def test_at_capacity_each_side_says_one_line_and_a_freed_slot_is_taken_at_once():
    """Issue 45: a client refused at capacity raised a bare `ConnectionClosedOK received 1000
    (OK)`. Now it raises the server's reason in one line, the server logs one line, and the
    same client gets in as soon as the slot is free."""

    async def two_clients(server) -> tuple[str, str]:
        first, second = client(server), client(server)
        await first.connect()
        await first.reset(seed=0)
        await second.connect()
        with pytest.raises(RuntimeError) as refused:
            await second.reset(seed=1)
        await first.close()
        for _ in range(50):  # the server destroys the first session once its socket closes
            try:
                result = await second.reset(seed=1)
                break
            except RuntimeError as e:
                assert "at capacity" in str(e), e
                await asyncio.sleep(0.1)
        await second.close()
        return str(refused.value), result.observation.task_id

    with openenv_server({"source": "arithmetic"}, "max_sessions=1") as srv:
        refused, task_id = run(two_clients(srv))
    assert refused == (
        "Server error: the server is at capacity: 1 of 1 sessions open (its max_sessions"
        " setting); try again when one closes (code: CAPACITY_REACHED)"
    )
    assert task_id == "arithmetic/train/1"
    lines = [x for x in srv.stderr.strip().splitlines() if "refused a session" in x]
    assert lines and all(x.endswith("try again when one closes") for x in lines), srv.stderr


# ------------------------------------------------------------------------------ bad requests


def test_bad_requests_get_a_clear_error_and_the_server_goes_on(arithmetic_server):
    async def requests():
        errors = []
        async with client(arithmetic_server) as env:
            for bad in (
                env.step(TirlAction(message="hello")),  # before any reset
                env.reset(seed=-1),
                env.reset(seed="seven"),
                env.reset(seed=0, split="validation"),
                env.reset(seed=0, colour="red"),
            ):
                with pytest.raises(RuntimeError) as err:
                    await bad
                errors.append(str(err.value))
            await env.reset(seed=0)
            await env.step(TirlAction(message="\\boxed{1}"))
            with pytest.raises(RuntimeError) as err:  # the episode is over
                await env.step(TirlAction(message="\\boxed{2}"))
            errors.append(str(err.value))
        async with GenericEnvClient(base_url=arithmetic_server.url) as raw:
            await raw.reset(seed=0)
            for payload in ({"text": "hi"}, {"message": 7}):  # OpenEnv's own validation
                with pytest.raises(RuntimeError) as err:
                    await raw.step(payload)
                errors.append(str(err.value))
            still = await raw.reset(seed=1)
        return errors, still

    errors, still = run(requests())
    expected = [
        "step: no episode yet; call reset first",
        "seed must be an integer >= 0",
        "seed must be an integer >= 0",
        "split must be one of train, test, got 'validation'",
        "unknown parameter 'colour'",
        "is over; call reset",
        "Invalid message: message: Field required; text: Extra inputs are not permitted",
        "Invalid message: message: Input should be a valid string",
    ]
    for error, text in zip(errors, expected, strict=True):
        assert text in error and "\n" not in error, error
    assert still.observation["task_id"] == "arithmetic/train/1"  # the server still serves


def test_http_endpoints_answer_and_a_step_without_an_episode_is_a_409(arithmetic_server):
    with httpx.Client(base_url=arithmetic_server.url, timeout=TIMEOUT_S) as http:
        assert http.get("/health").status_code == 200
        reset = http.post("/reset", json={"seed": 2})
        assert reset.status_code == 200
        assert reset.json()["observation"]["task_id"] == "arithmetic/train/2"
        step = http.post("/step", json={"action": {"message": "\\boxed{1}"}})
        assert step.status_code == 409  # OpenEnv's HTTP steps are stateless: no episode
        assert step.json() == {"detail": "step: no episode yet; call reset first"}
        assert http.post("/step", json={"action": {"msg": 1}}).status_code == 422


def test_the_guard_tells_loopback_from_the_rest():
    for host in (None, "localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]", "::ffff:127.0.0.1"):
        assert netguard.is_loopback_host(host), host
    for host in ("", "0.0.0.0", "10.0.0.1", "8.8.8.8", "::", "huggingface.co", "api.gradio.app"):
        assert not netguard.is_loopback_host(host), host


def test_the_servers_run_under_the_network_guard(arithmetic_server, races_server):
    active = NETGUARD_LOG.with_name(NETGUARD_LOG.name + ".active").read_text().split()
    assert str(arithmetic_server.process.pid) in active
    assert str(races_server.process.pid) in active
    assert str(os.getpid()) in active
