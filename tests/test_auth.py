"""API keys on both servers (`tirl serve`, `tirl sandbox serve`) and in every client of ours.

Real servers as subprocesses on 127.0.0.1 with the key in their environment, real clients:
a missing or wrong key gets 401 and the right one 200; `/health` answers without the key but
says nothing beyond its status; `OpenAIEngine`, `HTTPSandbox`, the synth `ChatClient` and the
official `openai` client send the key from `$TIRL_API_KEY` or from an argument.

The refusal to bind a public address without a key is tested without ever binding or
contacting one: the host strings are judged from the string alone (numeric literals parsed
with AI_NUMERICHOST, names never looked up), and the command runs in-process with tripwires
on binding, listening and name resolution, so that reaching any of them fails the test.
Not covered: TLS (there is none; see tirl.httpauth), brute-force rate limiting.
"""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import openai
import pytest
from conftest import tirl_serve
from test_sandbox_http import running_server

from tirl.backends.openai import OpenAIEngine
from tirl.cli import main as cli_main
from tirl.httpauth import bind_refusal, is_loopback, key_matches
from tirl.sandbox import Status
from tirl.sandbox.api import SandboxError
from tirl.sandbox.http import HTTPSandbox
from tirl.synth.client import ChatClient
from tirl.synth.config import EndpointConfig

KEY = "tirl-test-key-0123456789abcdef"


async def _status(url: str, method: str, path: str, key: str | None, body=None):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with aiohttp.ClientSession(trust_env=False) as http:
        async with http.request(method, url + path, json=body, headers=headers) as r:
            if r.content_type != "application/json":  # /metrics is Prometheus text
                return r.status, await r.text()
            return r.status, await r.json()


def _statuses(url: str, method: str, path: str, body=None) -> list[int]:
    """Status codes for: no key, a wrong key, the right key."""

    async def main():
        return [(await _status(url, method, path, k, body))[0] for k in (None, "wrong", KEY)]

    return asyncio.run(main())


# -- which addresses need a key ---------------------------------------------------------------


@pytest.fixture()
def no_lookups(monkeypatch):
    """Tripwires: a name lookup, a bind or a listen fails the test."""
    real = socket.getaddrinfo

    def numeric_only(host, *args, **kwargs):
        flags = kwargs.get("flags", args[3] if len(args) > 3 else 0)
        assert flags & socket.AI_NUMERICHOST, f"tried to resolve {host!r}"
        return real(host, *args, **kwargs)

    def never(*args, **kwargs):
        raise AssertionError(f"tried to bind or listen: {args[1:]}")

    monkeypatch.setattr(socket, "getaddrinfo", numeric_only)
    monkeypatch.setattr(socket, "gethostbyname", never)
    monkeypatch.setattr(socket.socket, "bind", never)
    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "create_server", never)
    monkeypatch.setattr(aiohttp.web.TCPSite, "start", never)


LOOPBACK = ["127.0.0.1", "127.1", "127.200.3.4", "::1", "[::1]", "localhost", "LocalHost.",
            "::ffff:127.0.0.1"]  # fmt: skip
PUBLIC = ["0.0.0.0", "", "::", "[::]", "192.0.2.7", "10.1.2.3", "example.org",
          "127.0.0.1.example.org", "::ffff:10.0.0.1", "fe80::1%eth0", "2001:db8::1", "0"]  # fmt: skip


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_literals_need_no_key(host, no_lookups):
    assert is_loopback(host) and bind_refusal(host, None, False, "--api-key-env") is None


@pytest.mark.parametrize("host", PUBLIC)
def test_any_other_host_needs_a_key_or_the_insecure_flag(host, no_lookups):
    assert not is_loopback(host)
    refusal = bind_refusal(host, None, False, "--api-key-env")
    assert refusal and "TIRL_API_KEY" in refusal and "--insecure-no-auth" in refusal
    assert bind_refusal(host, KEY, False, "--api-key-env") is None
    assert bind_refusal(host, None, True, "--api-key-env") is None


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::", "example.org"])
@pytest.mark.parametrize("command", [["sandbox", "serve"], ["serve", "{d}/no-model"]])
def test_serving_a_public_address_without_a_key_is_refused_before_binding(
    host, command, tmp_path, monkeypatch, capsys, no_lookups
):
    monkeypatch.delenv("TIRL_API_KEY", raising=False)
    argv = [a.format(d=tmp_path) for a in command] + ["--host", host, "--port", "0"]
    assert cli_main(argv) == 2  # the model folder does not even exist: checked after the bind
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to listen" in err and "--insecure-no-auth" in err


@pytest.mark.parametrize("command", [["sandbox", "serve"], ["serve", "{d}/no-model"]])
def test_a_named_key_variable_that_is_unset_or_misnamed_is_refused(
    command, tmp_path, monkeypatch, capsys, no_lookups
):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    for name, words in [("NO_SUCH_KEY_VAR", "not set"), ("bad name", "not an environment")]:
        argv = [a.format(d=tmp_path) for a in command] + ["--api-key-env", name]
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--api-key-env" in err and words in err


def test_the_key_is_compared_whole_and_only_as_a_bearer_token():
    assert key_matches(f"Bearer {KEY}", KEY) and key_matches(f"bearer  {KEY} ", KEY)
    for header in [None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}",
                   "Bearer", "Bearer \udcff"]:  # fmt: skip
        assert not key_matches(header, KEY), header


# -- tirl sandbox serve -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox_server(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIRL_API_KEY", KEY)  # the subprocess inherits it
        server = running_server(tmp_path_factory.mktemp("sandbox"))
        srv = server.__enter__()
    yield srv
    server.__exit__(None, None, None)


def test_the_sandbox_server_wants_the_key_on_every_route(sandbox_server):
    url = sandbox_server.url
    assert _statuses(url, "POST", "/v1/run", {"code": "1"}) == [401, 401, 200]
    assert _statuses(url, "POST", "/v1/sessions") == [401, 401, 200]
    assert _statuses(url, "GET", "/metrics") == [401, 401, 200]
    assert _statuses(url, "POST", "/v1/sessions/f00d/run", {"code": "1"}) == [401, 401, 404]
    assert _statuses(url, "GET", "/v1/channel") == [401, 401, 400]  # 400: not a WebSocket
    status, body = asyncio.run(_status(url, "POST", "/v1/run", None, {"code": "1"}))
    assert "Authorization: Bearer" in body["error"]


def test_the_session_channel_opens_only_with_the_key(sandbox_server):
    async def connect(key):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with aiohttp.ClientSession(trust_env=False, headers=headers) as http:
            try:
                ws = await http.ws_connect(sandbox_server.url + "/v1/channel")
            except aiohttp.WSServerHandshakeError as e:
                return e.status
            await ws.send_str(json.dumps({"id": 1, "op": "run_once", "code": "print(2)"}))
            reply = json.loads((await ws.receive()).data)
            await ws.close()
            return reply["body"]["stdout"]

    assert [asyncio.run(connect(k)) for k in (None, "wrong", KEY)] == [401, 401, "2\n"]


def test_sandbox_health_says_only_its_status_without_the_key(sandbox_server):
    bare = asyncio.run(_status(sandbox_server.url, "GET", "/health", None))
    full = asyncio.run(_status(sandbox_server.url, "GET", "/health", KEY))
    assert bare == (200, {"status": "ok"})
    assert full[0] == 200 and "pid" in full[1] and "limits" in full[1]


def test_http_sandbox_sends_the_key_from_the_environment_or_an_argument(
    sandbox_server, monkeypatch
):
    async def run(**kwargs):
        async with HTTPSandbox(sandbox_server.url, **kwargs) as client:
            session = await client.session()
            result = await session.run("print(6 * 7)")
            once = await client.run_once("print(1)")
            return result, once

    monkeypatch.setenv("TIRL_API_KEY", KEY)
    for result in asyncio.run(run()):
        assert result.status is Status.OK
    monkeypatch.delenv("TIRL_API_KEY")
    result, _ = asyncio.run(run(api_key=KEY))
    assert result.stdout == "42\n"
    with pytest.raises(SandboxError, match="wants an API key"):
        asyncio.run(run())
    with pytest.raises(SandboxError, match="wants an API key"):
        asyncio.run(run(api_key="wrong"))


def test_a_sandbox_server_reads_the_variable_named_by_api_key_env(tmp_path, monkeypatch):
    monkeypatch.delenv("TIRL_API_KEY", raising=False)
    monkeypatch.setenv("MY_SANDBOX_KEY", "other-key-abc")
    with running_server(tmp_path, "--api-key-env", "MY_SANDBOX_KEY") as srv:
        codes = [
            asyncio.run(_status(srv.url, "POST", "/v1/run", k, {"code": "1"}))[0]
            for k in (None, KEY, "other-key-abc")
        ]
    assert codes == [401, 401, 200]


# -- tirl serve ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_server(scripted_model, tokenizer, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIRL_API_KEY", KEY)
        serving = tirl_serve(scripted_model, tokenizer, tmp_path_factory.mktemp("m") / "model")
        url = serving.__enter__()
    yield url
    serving.__exit__(None, None, None)


def test_the_model_server_wants_the_key_on_every_route(model_server):
    body = {"prompt": "D:\n", "max_tokens": 2}
    assert _statuses(model_server, "GET", "/v1/models") == [401, 401, 200]
    assert _statuses(model_server, "POST", "/v1/completions", body) == [401, 401, 200]
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert _statuses(model_server, "POST", "/v1/chat/completions", chat) == [401, 401, 400]
    status, reply = asyncio.run(_status(model_server, "GET", "/v1/models", "wrong"))
    assert reply["error"]["code"] == "invalid_api_key"
    bare = asyncio.run(_status(model_server, "GET", "/health", None))
    full = asyncio.run(_status(model_server, "GET", "/health", KEY))
    assert bare == (200, {"status": "ok"}) and "requests" in full[1]


def test_openai_engine_sends_the_key_from_the_environment_or_an_argument(
    model_server, tokenizer, monkeypatch
):
    ids = tokenizer.encode("D:\n", add_special_tokens=False)

    async def generate(**kwargs):
        engine = OpenAIEngine(model_server, tokenizer, **kwargs)
        try:
            return await engine.generate("k", ids, max_new_tokens=6, temperature=0.0)
        finally:
            await engine.aclose()

    monkeypatch.setenv("TIRL_API_KEY", KEY)
    from_env = asyncio.run(generate())
    monkeypatch.delenv("TIRL_API_KEY")
    assert asyncio.run(generate(api_key=KEY)).ids == from_env.ids and from_env.ids
    with pytest.raises(RuntimeError, match="401"):
        asyncio.run(generate())


def test_the_official_client_and_the_synth_client_send_the_key(model_server, tmp_path, monkeypatch):
    http = openai.DefaultHttpxClient(trust_env=False)
    client = openai.OpenAI(
        base_url=f"{model_server}/v1", api_key=KEY, http_client=http, max_retries=0
    )
    assert client.models.list().data
    wrong = openai.OpenAI(
        base_url=f"{model_server}/v1", api_key="wrong", http_client=http, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    http.close()

    async def ask(cfg: EndpointConfig, cache: str) -> str:
        chat = ChatClient(cfg, tmp_path / cache)
        try:
            return await chat.chat([{"role": "user", "content": "D:"}])
        finally:
            await chat.aclose()

    cfg = EndpointConfig(url=model_server, max_tokens=3, max_retries=0)
    monkeypatch.setenv("TIRL_API_KEY", KEY)  # the default when api_key_env is not set
    assert isinstance(asyncio.run(ask(cfg, "a.jsonl")), str)
    monkeypatch.delenv("TIRL_API_KEY")
    monkeypatch.setenv("TEACHER_KEY", KEY)
    named = EndpointConfig(url=model_server, max_tokens=3, max_retries=0, api_key_env="TEACHER_KEY")
    assert isinstance(asyncio.run(ask(named, "b.jsonl")), str)
    from tirl.synth.client import TeacherError

    with pytest.raises(TeacherError, match="401"):
        asyncio.run(ask(cfg, "c.jsonl"))


def test_the_health_answer_without_a_key_is_json(model_server):
    status, body = asyncio.run(_status(model_server, "GET", "/health", "wrong"))
    assert status == 200 and json.dumps(body) == '{"status": "ok"}'
