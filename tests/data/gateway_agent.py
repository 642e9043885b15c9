"""An agent program that knows nothing of tirl: the `openai` SDK, a chat loop, and Python run
by the agent itself. It reads OPENAI_BASE_URL and OPENAI_API_KEY from its environment as the
SDK always does, so pointing it at tirl's training gateway changes nothing in it.

Each turn it asks the model, runs the first ```python block of the reply (if any) in a fresh
interpreter, and sends the output back as a user message. AGENT_TURNS and AGENT_MAX_TOKENS
size the loop. If TIRL_REWARD_URL and AGENT_EXPECT are set it posts a reward: 1.0 if its last
reply holds a \\boxed{} answer equal to AGENT_EXPECT, else 0.0. With AGENT_LOG set it appends
one line per run to that file: the task it was given and its turns.
"""

import json
import os
import re
import subprocess
import sys
import urllib.request

import openai

client = openai.OpenAI(max_retries=0)
model = client.models.list().data[0].id
messages = [
    {"role": "system", "content": "Solve the task. Write Python in ```python blocks; I run them."},
    {"role": "user", "content": os.environ.get("TIRL_TASK_PROMPT", "What is 6 * 7?")},
]
turns = int(os.environ.get("AGENT_TURNS", "3"))
max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "12"))
text = ""
for turn in range(turns):
    reply = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=1.0
    )
    text = reply.choices[0].message.content
    messages.append({"role": "assistant", "content": text})
    if turn == turns - 1:
        break
    code = re.search(r"```python\n(.*?)```", text, re.S)
    output = "(no code to run)"
    if code:
        try:
            run = subprocess.run(
                [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=5
            )
            output = (run.stdout + run.stderr)[-500:]
        except subprocess.TimeoutExpired:
            output = "timed out"
    messages.append({"role": "user", "content": "```output\n" + output + "\n```"})

log = os.environ.get("AGENT_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps({"task": messages[1]["content"], "turns": turn + 1}) + "\n")
reward_url = os.environ.get("TIRL_REWARD_URL")
if reward_url and "AGENT_EXPECT" in os.environ:
    boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
    reward = float(bool(boxed) and boxed[-1].strip() == os.environ.get("AGENT_EXPECT", ""))
    body = json.dumps({"reward": reward}).encode()
    request = urllib.request.Request(reward_url, body, {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy
    opener.open(request, timeout=30).read()
print(text)
