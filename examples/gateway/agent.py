"""An agent program to train through tirl's gateway; nothing in it knows of tirl.

It is what a user already has: the `openai` SDK, a chat loop, and Python that the agent runs
itself. The SDK takes its endpoint from OPENAI_BASE_URL (and OPENAI_API_KEY), so pointing it at
a gateway session, `http://127.0.0.1:PORT/sessions/<id>/v1`, is the only change; tirl's
`run_agents` sets both, and the task's question in TIRL_TASK_PROMPT.

Each turn: ask the model; if its reply holds a ```python block, run it in a fresh interpreter
(5 s) and send the output back as a user message; stop at a reply without code or after
MAX_TURNS. The reply's \\boxed{} answer is printed; the gateway's caller scores the
trajectory with the task (or, with TIRL_REWARD_URL set and AGENT_EXPECT given, the program
posts its own reward: a program that knows its answer can).

Run it by hand against `tirl serve` too: OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python agent.py
"""

import json
import os
import re
import subprocess
import sys
import urllib.request

import openai

MAX_TURNS = int(os.environ.get("AGENT_TURNS", "4"))
MAX_TOKENS = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
SYSTEM = (
    "Solve the problem. You may write Python in a ```python block; it is run and its output"
    " comes back to you. Put the final answer in \\boxed{}."
)


def run_python(code: str) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=5
        )
    except subprocess.TimeoutExpired:
        return "TimeoutError: the code ran past 5 s"
    return (done.stdout + done.stderr)[-1000:] or "(no output)"


def main() -> None:
    client = openai.OpenAI()
    model = client.models.list().data[0].id
    question = os.environ.get("TIRL_TASK_PROMPT") or sys.argv[1]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = ""
    for _ in range(MAX_TURNS):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=1.0
        )
        reply = answer.choices[0].message.content
        messages.append({"role": "assistant", "content": reply})
        code = re.search(r"```python\n(.*?)```", reply, re.S)
        if code is None:
            break
        messages.append({"role": "user", "content": f"```output\n{run_python(code.group(1))}```"})
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", reply)
    print(boxed[-1] if boxed else "")
    url, expect = os.environ.get("TIRL_REWARD_URL"), os.environ.get("AGENT_EXPECT")
    if url and expect is not None:
        reward = float(bool(boxed) and boxed[-1].strip() == expect)
        request = urllib.request.Request(
            url, json.dumps({"reward": reward}).encode(), {"Content-Type": "application/json"}
        )
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30)


if __name__ == "__main__":
    main()
