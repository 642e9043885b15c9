"""An agent program with native OpenAI tool calls, to train through tirl's gateway; nothing in
it knows of tirl.

It is what a user already has: the `openai` SDK with `tools=[...]`, a loop that runs the calls,
and Python that the agent runs itself. The SDK takes its endpoint from OPENAI_BASE_URL (and
OPENAI_API_KEY), so pointing it at a gateway session, `http://127.0.0.1:PORT/sessions/<id>/v1`,
is the only change; tirl's `run_agents` sets both, and the task's question in TIRL_TASK_PROMPT.

Each turn: ask the model with one function, `python(code)` (the schema of tirl's python tool);
run each of the reply's tool calls in a fresh `python -c` (5 s) and send its output back as a
`role: "tool"` message; stop at a reply without tool calls or after AGENT_TURNS turns. The
last reply's \\boxed{} answer is printed; the gateway's caller scores the trajectory with the
task. `parallel_tool_calls=False`: the model stops at its first call, as tirl's own rollout
does, so its calls and the tool turns are the ones tirl's `hermes_tools` writes.

Its conversation is the one tirl trains in, so a model SFT'd by

    tirl train protocol.name=hermes_tools prompt.chat=true \\
      'prompt.system=Solve the problem step by step. You can run Python by calling the python function; what it prints comes back to you. Give the final answer as \\boxed{}.'

sees here, token for token, the prompts it was trained on (the system message below, the
function listed after it by the template or by tirl, the calls and tool turns of hermes_tools;
`tests/test_gateway_tools.py`). The output is shown as tirl's formatter shows it (trailing
newlines dropped, the error after what was printed), but each call runs in a fresh
interpreter: unlike tirl's session, variables are not kept between calls.

Run it by hand against `tirl serve` too: OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python tool_agent.py
"""

import json
import os
import re
import subprocess
import sys

import openai

MAX_TURNS = int(os.environ.get("AGENT_TURNS", "4"))
MAX_TOKENS = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
SYSTEM = (
    "Solve the problem step by step. You can run Python by calling the python function; what"
    " it prints comes back to you. Give the final answer as \\boxed{}."
)
PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in one interpreter that keeps its variables between"
        " calls; what it prints comes back.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python code"}},
            "required": ["code"],
        },
    },
}


def run_python(code: str) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=5
        )
    except subprocess.TimeoutExpired:
        return "TimeoutError: execution exceeded 5 s"
    out = done.stdout.rstrip("\n")
    if done.returncode:
        error = done.stderr.strip() or f"Error: exit status {done.returncode}"
        out = f"{out}\n{error}" if out else error
    return out[-512:]


def run_call(call) -> str:
    try:
        code = json.loads(call.function.arguments).get("code")
    except (ValueError, AttributeError):
        code = None
    if call.function.name != "python" or not isinstance(code, str):
        return "Invalid tool call: expected python with a string 'code' argument; nothing was run."
    return run_python(code)


def main() -> None:
    client = openai.OpenAI()
    model = client.models.list().data[0].id
    question = os.environ.get("TIRL_TASK_PROMPT") or sys.argv[1]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = ""
    for _ in range(MAX_TURNS):
        answer = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=[PYTHON],
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
        )
        message = answer.choices[0].message
        reply = message.content or ""
        calls = message.tool_calls or []
        turn = {"role": "assistant", "content": message.content}
        if calls:
            turn["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": c.function.arguments}}
                for c in calls
            ]  # fmt: skip
        messages.append(turn)
        if not calls:
            break
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_call(call)})
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", reply)
    print(boxed[-1] if boxed else "")


if __name__ == "__main__":
    main()
