"""An agent program that grades itself: it asks the model once, runs the ```python block of the
reply (if any) in a fresh interpreter, and posts its own reward to the gateway: 1.0 when the
block ran cleanly and printed something, else 0.0. Nothing in it knows of tirl but the reward
URL it is given (TIRL_REWARD_URL); the `openai` SDK reads OPENAI_BASE_URL as always.

`tirl train` with `rollout.agent.command: [python, examples/gateway/code_agent.py]` trains the
model to answer with code that runs (docs/gateway.md, "Reward rising under tirl train").
"""

import json
import os
import re
import subprocess
import sys
import urllib.request

import openai

SYSTEM = "Solve the problem with Python."

client = openai.OpenAI(max_retries=0)
reply = client.chat.completions.create(
    model=client.models.list().data[0].id,
    messages=[
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": os.environ.get("TIRL_TASK_PROMPT", "What is 6 * 7?")},
    ],
    max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "48")),
    temperature=1.0,
)
text = reply.choices[0].message.content
code = re.search(r"```python\n(.*?)\n```", text, re.S)
ran = False
if code:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=5
        )
        ran = done.returncode == 0 and bool(done.stdout.strip())
    except subprocess.TimeoutExpired:
        pass
url = os.environ.get("TIRL_REWARD_URL")
if url:
    body = json.dumps({"reward": float(ran)}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30).read()
print(text)
