"""`tirl serve` stops without losing what it accepted (issue 43): SIGTERM drains (new requests
get 503, a stream in flight runs to its `data: [DONE]`, exit 0), a second signal exits at
once, and a port in use is exit 2 naming it. A real subprocess on loopback, on the tiny model.

A stream of 16 choices of 200 tokens each keeps the server busy for 200 steps, so
the signal lands while it runs; the server says how many choices it is finishing, and the
test requires at least one, so a lost race fails instead of passing vacuously.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
from urllib.parse import urlsplit

from conftest import tirl_serve_process

from tirl.httpauth import client_key

NO_HANG_S = 120.0  # bound on what must not hang (not a speed requirement)
LONG_STREAM = {"prompt": [7], "max_tokens": 200, "n": 16, "stream": True}


def _post(url: str, body: dict) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=NO_HANG_S)
    headers = {"Content-Type": "application/json"}
    key = client_key()  # the server inherits this environment, and its key if any
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers)
    return conn.getresponse()


def _first_event(response: http.client.HTTPResponse) -> str:
    """Read the stream up to its first event: a token has been generated."""
    while True:
        line = response.readline().decode()
        assert line, "the stream ended before its first event"
        if line.startswith("data: "):
            return line


def _stderr_until(proc: subprocess.Popen, marker: str) -> list[str]:
    lines = []
    while True:
        line = proc.stderr.readline()
        assert line, f"the server's stderr ended without {marker!r}: {''.join(lines)}"
        lines.append(line)
        if marker in line:
            return lines


def test_sigterm_lets_a_stream_in_flight_finish_with_done_and_exits_0(
    tiny_model, tokenizer, tmp_path
):
    with tirl_serve_process(tiny_model, tokenizer, tmp_path / "model") as (url, proc):
        response = _post(url, LONG_STREAM)
        assert response.status == 200
        events = [_first_event(response)]
        proc.send_signal(signal.SIGTERM)
        stopping = _stderr_until(proc, "stopping:")[-1]
        late = _post(url, {"prompt": [7], "max_tokens": 2})  # while the stream drains
        late_status = late.status
        events += [line.decode() for line in response if line.startswith(b"data: ")]
        code = proc.wait(timeout=NO_HANG_S)
    in_flight = int(stopping.split("finishing ")[1].split()[0])
    assert in_flight >= 1, stopping  # the signal came while the stream ran
    assert late_status == 503
    assert events[-1].strip() == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finished) == list(range(16))  # every choice ran to its end
    assert code == 0


def test_a_second_signal_exits_at_once(tiny_model, tokenizer, tmp_path):
    with tirl_serve_process(tiny_model, tokenizer, tmp_path / "model") as (url, proc):
        response = _post(url, LONG_STREAM)
        _first_event(response)
        proc.send_signal(signal.SIGTERM)
        _stderr_until(proc, "stopping:")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=NO_HANG_S)
        rest = b"".join(response)  # what was sent before the exit, then the connection's end
    assert code == 128 + signal.SIGINT
    assert b"[DONE]" not in rest


def test_a_port_in_use_is_exit_2_naming_it(tiny_model, tokenizer, tmp_path):
    folder = tmp_path / "model"
    with tirl_serve_process(tiny_model, tokenizer, folder) as (url, _):
        port = str(urlsplit(url).port)
        done = subprocess.run(
            [sys.executable, "-m", "tirl.cli", "serve", str(folder), "--port", port],
            capture_output=True,
            text=True,
            timeout=NO_HANG_S,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1 port {port}" in done.stderr
