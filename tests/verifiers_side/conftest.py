"""The tests against the real verifiers 0.4.0, run in a venv of their own (`tirl[verifiers]`,
tests/side_venv.py) by tests/test_verifiers_plugin.py.

Nothing leaves loopback: every model client points at `scripted_server` on 127.0.0.1, every
runtime is verifiers' local subprocess runtime (its default is Prime's hosted sandboxes), and
no built-in verifiers harness runs (they `uv sync` their program from the network)."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

os.environ.update(DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TIRL_TEST_API_KEY="not-a-secret")
os.environ.pop("PRIME_API_KEY", None)
sys.path.insert(0, str(Path(__file__).parent / "envs"))  # the test tasksets, by id

import tirl.tasks.sources.verifiers_env  # noqa: E402,F401  (registers the `verifiers` source)


class ScriptedServer:
    """An OpenAI-compatible chat server on 127.0.0.1 that answers with `replies`, in order
    (the last one repeats), or with `reply(messages)` when that is set (for concurrent
    rollouts), and records every request body. A reply is the assistant's text, or a whole
    assistant message (a dict: one with `tool_calls` ends with finish reason "tool_calls")."""

    def __init__(self) -> None:
        self.replies: list[str | dict] = ["..."]
        self.reply: Callable[[list[dict]], str | dict] | None = None
        self.requests: list[dict] = []
        server = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append(body)
                    n = min(len(server.requests), len(server.replies)) - 1
                text = server.reply(body["messages"]) if server.reply else server.replies[n]
                message = {"role": "assistant", **text} if isinstance(text, dict) else {
                    "role": "assistant", "content": text
                }  # fmt: skip
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                out = json.dumps({
                    "id": f"c{len(server.requests)}", "object": "chat.completion", "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_port}/v1"


@pytest.fixture()
def scripted_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()
