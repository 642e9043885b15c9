"""tirl's task sources inside verifiers: the taskset `tirl-verifiers` and its harness, loaded
by name through verifiers' own loader, rewarded exactly as tirl rewards, and rolled out by
verifiers' own Agent against a chat server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import verifiers.v1 as vf
from verifiers.v1.utils.loaders import (
    default_harness_id,
    environment_class,
    resolve_env_config,
    taskset_class,
)

from tirl.integrations.verifiers import TirlEnv, TirlHarness, TirlTaskset
from tirl.integrations.verifiers.taskset import FINAL_ANSWER
from tirl.tasks import make_source
from tirl.tools import TOOLS

OPERATORS = ("sequential", "parallel", "sort", "select")


def taskset(**fields) -> vf.Taskset:
    """The taskset as verifiers builds it from a config (`vf-eval tirl-verifiers ...`)."""
    config = vf.taskset_config_type("tirl-verifiers").model_validate(
        {"id": "tirl-verifiers", **fields}
    )
    return vf.load_taskset(config)


def verifiers_reward(task: vf.Task, reply: str) -> float:
    """What verifiers' scoring (`Task.score`, as run at the end of a rollout) records for a
    trace whose one assistant reply is `reply`."""
    trace = vf.Trace(
        task=vf.TraceTask(type="TirlTaskBehaviour", data=task.data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=[
            vf.MessageNode(message=vf.UserMessage(content=task.data.prompt_text)),
            vf.MessageNode(parent=0, message=vf.AssistantMessage(content=reply), sampled=True),
        ],
    )
    asyncio.run(task.score(trace))
    return trace.rewards["tirl_reward"].score


def partly_wrong(gold: str) -> str:
    """The reference answer with its last `name: value` line's value changed."""
    lines = gold.splitlines()
    last = max(i for i, line in enumerate(lines) if ": " in line)
    lines[last] = lines[last].split(": ")[0] + ": 123456789"
    return "\n".join(lines)


def test_the_taskset_id_resolves_to_tirls_taskset_and_harness():
    assert taskset_class("tirl-verifiers") is TirlTaskset
    assert default_harness_id("tirl-verifiers") == "tirl-verifiers"  # the module's own harness
    config = vf.HarnessConfig.model_validate({"id": "tirl-verifiers"})
    agent = vf.AgentConfig.model_validate({"harness": {"id": "tirl-verifiers", "python": True}})
    assert config.id == "tirl-verifiers" and agent.harness.python is True
    assert vf.load_harness(agent.harness).__class__ is TirlHarness
    assert environment_class("tirl-verifiers") is TirlEnv
    # a harness flag without an id lands on tirl's harness, run on the local runtime
    env = resolve_env_config(
        {"taskset": {"id": "tirl-verifiers"}, "agent": {"harness": {"python": True}}}
    )
    assert env.agent.harness.id == "tirl-verifiers" and env.agent.harness.python is True
    assert env.agent.runtime.type == "subprocess"


@pytest.mark.parametrize("operator", OPERATORS)
def test_races_rewards_are_tirls_on_right_and_wrong_answers(operator):
    entry = {"source": "races", "mixture": {operator: 1.0}, "max_size": 3}
    tasks = list(taskset(source=entry, num_tasks=3, seed=5))
    tirl = make_source(entry, "test", seed=5)
    assert len(tasks) == 3
    partial_seen = False
    for i, task in enumerate(tasks):
        mine = tirl.item("test", i)
        assert task.data.prompt == mine.problem and task.data.answer == mine.answer
        answers = [
            mine.answer,  # right
            f"Reasoning first.\n{mine.answer}",  # right, after prose
            "<answer>A</answer>",  # wrong
            "I do not know.",  # no answer block
            f"```python\nprint('x')\n```\n{mine.answer}",  # code blocks are not prose
        ]
        if operator in ("sequential", "parallel"):
            answers.append(partly_wrong(mine.answer))
        for reply in answers:
            expected = mine.score(reply).reward
            assert verifiers_reward(task, reply) == expected, (operator, reply)
        assert verifiers_reward(task, mine.answer) == 1.0
        assert verifiers_reward(task, "<answer>A</answer>") < 1.0
        if operator in ("sequential", "parallel"):
            partial = verifiers_reward(task, partly_wrong(mine.answer))
            partial_seen |= 0.0 < partial < 1.0
    if operator in ("sequential", "parallel"):
        assert partial_seen, "partial credit never showed"


def test_the_same_seed_gives_the_same_tasks_and_another_seed_others():
    entry = {"source": "races"}
    first = [t.data.prompt for t in taskset(source=entry, num_tasks=4, seed=1)]
    again = [t.data.prompt for t in taskset(source=entry, num_tasks=4, seed=1)]
    other = [t.data.prompt for t in taskset(source=entry, num_tasks=4, seed=2)]
    assert first == again and first != other


def test_a_generated_source_is_an_infinite_taskset_unless_bounded():
    assert not taskset(source={"source": "arithmetic"}).bounded
    assert taskset(source={"source": "arithmetic"}, num_tasks=2).bounded
    with pytest.raises(ValueError, match="split"):
        taskset(source={"source": "arithmetic"}, split="dev")


def agent(server, **harness) -> vf.Agent:
    """verifiers' own Agent with tirl's harness, on the local subprocess runtime, calling the
    scripted server on loopback."""
    return vf.make_agent(
        vf.AgentConfig(
            harness={"id": "tirl-verifiers", **harness},
            runtime=vf.SubprocessConfig(),
            model="scripted",
            client=vf.EvalClientConfig(base_url=server.base_url, api_key_var="TIRL_TEST_API_KEY"),
        )
    )


async def rollout(server, task, **harness) -> vf.Trace:
    async with agent(server, **harness) as solver:
        trace = await solver.run(task)
        await solver.harness.close_sandbox()
    return trace


def test_a_single_turn_rollout_through_verifiers_is_rewarded_as_tirl(scripted_server):
    entry = {"source": "races", "mixture": {"sequential": 1.0}, "max_size": 3}
    task = next(iter(taskset(source=entry, num_tasks=1)))
    gold = make_source(entry, "test").item("test", 0)
    for reply in (gold.answer, partly_wrong(gold.answer), "no idea"):
        scripted_server.replies = [reply]
        scripted_server.requests.clear()
        trace = asyncio.run(rollout(scripted_server, task))
        assert trace.ok, trace.errors
        assert len(scripted_server.requests) == 1  # one turn
        assert scripted_server.requests[0]["messages"][-1]["content"] == gold.problem
        assert trace.rewards["tirl_reward"].score == gold.score(reply).reward
        assert trace.metrics["tirl_correct"] == float(gold.score(reply).correct)


def test_a_single_turn_arithmetic_prompt_says_how_to_write_the_answer(scripted_server):
    """Single-turn has no system message: the prompt itself asks for the box the scorer reads
    (issue 45: "73", "So, the answer is 73." and <answer>73</answer> all scored 0, untold)."""
    task = next(iter(taskset(source={"source": "arithmetic"}, num_tasks=1)))
    gold = make_source({"source": "arithmetic"}, "test").item("test", 0)
    assert task.data.prompt == f"{gold.problem}\n\n{FINAL_ANSWER}"
    assert FINAL_ANSWER.startswith("Give the final answer") and "\\boxed{}" in FINAL_ANSWER
    scripted_server.replies = [f"So, the answer is \\boxed{{{gold.answer}}}."]
    trace = asyncio.run(rollout(scripted_server, task))
    assert scripted_server.requests[0]["messages"][-1]["content"] == task.data.prompt
    assert trace.rewards["tirl_reward"].score == 1.0


def test_a_multi_turn_rollout_runs_its_code_in_one_tirl_sandbox_session(scripted_server):
    task = next(iter(taskset(source={"source": "arithmetic"}, num_tasks=1)))
    a, b, m = map(int, re.findall(r"\d+", task.data.prompt))
    scripted_server.replies = [
        f"First the product.\n```python\np = {a} * {b}\n```\nThen:\n```python\nprint(p % {m})\n```",
        "```python\nimport os\nprint(p, os.getpid() > 0)\n```",  # `p` survives into turn 2
        f"So the answer is \\boxed{{{(a * b) % m}}}.",
    ]
    trace = asyncio.run(rollout(scripted_server, task, python=True))
    assert trace.ok, trace.errors
    requests = scripted_server.requests
    assert len(requests) == 3
    system = requests[0]["messages"][0]
    assert system["role"] == "system" and "```python" in system["content"]
    assert requests[1]["messages"][-1] == {
        "role": "user",
        "content": f"```output\n\n```\n```output\n{(a * b) % m}\n```",
    }
    assert requests[2]["messages"][-1]["content"] == f"```output\n{a * b} True\n```"
    assert trace.rewards["tirl_reward"].score == 1.0
    assert [m.role for m in trace.messages][-2:] == ["user", "assistant"]


def test_the_sandbox_turns_are_bounded_and_a_code_only_answer_does_not_score(scripted_server):
    task = next(iter(taskset(source={"source": "arithmetic"}, num_tasks=1)))
    gold = make_source({"source": "arithmetic"}, "test").item("test", 0)
    scripted_server.replies = [f"```python\nprint('\\\\boxed{{{gold.answer}}}')\n```"]
    trace = asyncio.run(rollout(scripted_server, task, python=True, max_tool_turns=2))
    assert len(scripted_server.requests) == 3  # two turns with code, then the last word
    assert "final answer" in scripted_server.requests[-1]["messages"][-1]["content"]
    assert trace.rewards["tirl_reward"].score == 0.0  # the box was printed, never written


def call(code: str | None = None, name: str = "python", arguments: str | None = None) -> dict:
    """A tool call as it comes on the OpenAI wire (the arguments a JSON string)."""
    arguments = json.dumps({"code": code}) if arguments is None else arguments
    call.count = getattr(call, "count", 0) + 1
    return {"id": f"call_{call.count}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def test_native_tool_calls_run_python_in_one_session_and_answer_with_tool_messages(
    scripted_server,
):
    task = next(iter(taskset(source={"source": "arithmetic"}, num_tasks=1)))
    a, b, m = map(int, re.findall(r"\d+", task.data.prompt))
    first = [call(f"p = {a} * {b}"), call(f"print(p % {m})")]
    bad = [call(arguments="{not json"), call("print(1)", name="shell"), call(arguments="[1]")]
    scripted_server.replies = [
        {"content": "First the product.", "tool_calls": first},
        {"content": None, "tool_calls": bad},
        f"So the answer is \\boxed{{{(a * b) % m}}}.",
    ]
    trace = asyncio.run(rollout(scripted_server, task, python=True, tool_calls=True))
    assert trace.ok, trace.errors
    requests = scripted_server.requests
    assert len(requests) == 3
    assert [r["tools"] for r in requests] == [[TOOLS["python"].function_schema()]] * 3
    system = requests[0]["messages"][0]
    assert system["role"] == "system" and "<tool_response>" in system["content"]
    assert "```python" not in system["content"] and "<tools>" not in system["content"]
    answers = requests[1]["messages"][-2:]
    assert answers == [
        {"role": "tool", "tool_call_id": first[0]["id"], "name": "python", "content": ""},
        {"role": "tool", "tool_call_id": first[1]["id"], "name": "python",
         "content": str((a * b) % m)},
    ]  # fmt: skip
    assert (
        requests[1]["messages"][-3]["tool_calls"][0]["function"]["arguments"]
        == (first[0]["function"]["arguments"])
    )  # the call goes back as it came
    errors = [m["content"] for m in requests[2]["messages"][-3:]]
    assert [m["tool_call_id"] for m in requests[2]["messages"][-3:]] == [c["id"] for c in bad]
    assert errors[0].startswith("error: the arguments are not JSON")
    assert errors[1] == "error: unknown function 'shell'; the one function is 'python'"
    assert errors[2] == "error: the arguments must be a JSON object with a string 'code'"
    assert trace.rewards["tirl_reward"].score == 1.0


def test_native_tool_call_turns_are_bounded_and_the_last_word_has_no_tools(scripted_server):
    task = next(iter(taskset(source={"source": "arithmetic"}, num_tasks=1)))
    scripted_server.replies = [{"content": None, "tool_calls": [call("print(1)")]}]
    trace = asyncio.run(
        rollout(scripted_server, task, python=True, tool_calls=True, max_tool_turns=2)
    )
    requests = scripted_server.requests
    assert len(requests) == 3  # two turns whose calls ran, then the last word
    assert [r.get("tool_choice") for r in requests] == [None, None, "none"]
    assert "final answer" in requests[-1]["messages"][-1]["content"]
    assert trace.rewards["tirl_reward"].score == 0.0


def test_tool_calls_without_python_is_a_config_error():
    with pytest.raises(ValueError, match="tool_calls: true needs python: true"):
        vf.harness_config_type("tirl-verifiers").model_validate(
            {"id": "tirl-verifiers", "tool_calls": True}
        )
