"""A hostile-client fuzz of `tirl serve`: a real server subprocess on 127.0.0.1 with the scripted
tiny model, and eight concurrent aiohttp clients sending well over a thousand malformed requests
interleaved with valid ones.

What it proves: no request gets a 5xx; every malformed one gets a 4xx whose JSON error names
the field at fault (`error.param`; "body" for a body that is not a JSON object, `null` for a
route that does not exist); every valid one, streamed or not, gets exactly the tokens it gets
when sent alone (seeds make sampled requests deterministic); and the server is healthy at the
end with no failed request. The malformed requests are made from valid ones by breaking one
thing at a time (a field's type or range, NaN and infinities, huge integers, token ids outside
the vocabulary, over-long prompts, bad stops, unsupported or unknown fields, broken or
non-object JSON, over-deep nesting, an oversized body), so the expected field is known.

Limits: a seeded generator, not a coverage-guided fuzzer; one endpoint process; no slow-loris
or connection-flood attacks (aiohttp's own limits govern those), no authentication (that is
tests/test_auth.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import pytest
from conftest import tirl_serve

from tirl.httpauth import bearer, client_key

SEED = 20250614
CLIENTS = 8
DISTINCT_VALID = 40
VALID_SENT = 240
MALFORMED = 1200
BODY_LIMIT = 16 << 20  # tirl.apps.server.MAX_BODY_BYTES
CONTEXT = 256  # the scripted model's positions


@pytest.fixture(scope="module")
def server(scripted_model, tokenizer, tmp_path_factory):
    """One `tirl serve` of the scripted model for the whole module."""
    with tirl_serve(scripted_model, tokenizer, tmp_path_factory.mktemp("m") / "model") as url:
        yield url


def _valid_bodies(rng: random.Random, tokenizer) -> list[dict]:
    """Distinct valid completion requests, each asking for its token ids back."""
    texts = ["A:\n", "D:\n", "C:\n", "Compute 12 * 34.", "What is 7 + 8?"]
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    bodies = []
    for _ in range(DISTINCT_VALID):
        body: dict = {"max_tokens": rng.randint(1, 14), "return_token_ids": True}
        kind = rng.random()
        if kind < 0.5:
            body["prompt"] = rng.choice(texts)
        elif kind < 0.8:
            body["prompt"] = rng.choice(ids)
        else:  # a batch of prompts
            body["prompt"] = rng.sample(texts, 2)
        body["temperature"] = rng.choice([0, 0, 0.7, 1.0, 3.0])
        if body["temperature"] > 0:  # a seed makes a sampled request reproducible
            body["seed"] = rng.choice([rng.randrange(2**32), 2**64 - 1, -(2**63), 0])
        if rng.random() < 0.4:
            body["stop"] = rng.choice(["```", ["\n", "print"], "7", ["*", "="]])
            body["include_stop_str_in_output"] = rng.random() < 0.5
        if rng.random() < 0.25:
            body["n"] = rng.choice([2, 3])
        if rng.random() < 0.3:
            body["model"] = "{model}"  # filled in with the served name
        if rng.random() < 0.2:
            body["logprobs"] = rng.choice([0, 1])
        bodies.append(body)
    return bodies


# field -> values that must be refused with that field named. NaN and the infinities are
# written into the JSON text as Python's json module writes them (NaN, Infinity).
NAN, INF = float("nan"), float("inf")
BAD_FIELDS: dict[str, list] = {
    "prompt": [
        {}, 1.5, True, 7, [], [[]], [1.5], [True], ["a", 1], [-1], [10**6], [2**70],
        [[1, 2], [-3]], "", [""], [None], "\ud800", ["ok", "\udfff"], [1] * CONTEXT,
        "9" * 600, [[1]] * 65,
    ],
    "max_tokens": ["5", 1.5, True, 0, -1, 2**70, CONTEXT + 1, NAN, [], {}],
    "temperature": ["1", NAN, INF, -INF, -0.1, 100.5, True, [], {}, 1e400],
    "n": [0, -1, 65, "2", 1.5, True, 2**64, NAN],
    "seed": [2**64, -(2**63) - 1, 2**70, 1.5, "1", True, [1], INF],
    "stop": [1, [1], [None], [""], "", ["x"] * 17, "y" * 1001, {}, [["a"]], True, NAN],
    "logprobs": [2, True, -1, "1", 1.5, 5, INF],
    "stream": ["yes", 1, [], {}],
    "return_token_ids": ["true", 1, []],
    "include_stop_str_in_output": [0, "no"],
    "skip_special_tokens": ["yes", 2],
    "echo": [True, 1, "x"],
    "best_of": [2, 0, "1", 1.5],
    "logit_bias": [{"5": 10}, [], "x"],
    "top_p": [0.5, 0, 2, "1", NAN],
    "suffix": ["x", 1],
    "presence_penalty": [0.5, INF],
    "frequency_penalty": [-1],
    "top_k": [5],
    "min_p": [0.1],
    "repetition_penalty": [1.2],
    "ignore_eos": [True],
    "min_tokens": [3],
    "stop_token_ids": [[1]],
    "model": ["no-such-model", 5, [], "", {"id": 1}],
    "user": [5, [], {}],
    "stream_options": [{"include_usage": True}],  # without stream: true
    # unknown fields are refused, not ignored
    "foo": [1], "max_token": [5], "prompts": ["x"], "stream_option": [{}], "temperture": [0],
}  # fmt: skip

BAD_BODIES: list[bytes] = [
    b"", b"{", b'{"prompt": "x"', b"not json", b"[1, 2]", b'"x"', b"5", b"null", b"true",
    b"NaN", b"\xff\xfe\x00garbage", b'{"prompt": "\xff"}', b"[" * 100_000 + b"]" * 100_000,
    b'{"prompt": [1' + b"0" * 5000 + b"]}", b"{" * 50_000, b'{"prompt": "x",}', b"{'prompt': 'x'}",
]  # fmt: skip

BAD_MESSAGES: list[tuple[object, str]] = [
    (None, "messages"), (5, "messages"), ([], "messages"), ("hi", "messages"), ([5], "messages[0]"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages[0].content"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
    ([{"role": "user", "content": "\ud800"}], "messages[0].content"),
    # well-formed, but the scripted model's tokenizer has no chat template
    ([{"role": "user", "content": "D:\n"}], "messages"),
]  # fmt: skip


def _dumps(body: object) -> bytes:
    return json.dumps(body).encode()  # allow_nan: NaN and Infinity go out as such


def _malformed(rng: random.Random, valid: list[dict], model: str) -> list[tuple]:
    """(method, path, body bytes, expected status, expected param) for each malformed request."""
    cases = []
    plain = [b for b in valid if "n" not in b and not isinstance(b["prompt"][0], str)]
    while len(cases) < MALFORMED:
        roll = rng.random()
        base = {k: v for k, v in rng.choice(valid).items() if k != "model"}
        if roll < 0.70:  # one field broken
            field = rng.choice(list(BAD_FIELDS))
            value = rng.choice(BAD_FIELDS[field])
            body = {**base, field: value}
            if field == "best_of":
                body.pop("n", None)
            if field == "n":
                body.pop("best_of", None)
            status = 404 if field == "model" and isinstance(value, str) else 400
            cases.append(("POST", "/v1/completions", _dumps(body), status, field))
        elif roll < 0.76:  # the prompt fits, but not with max_tokens
            body = {**rng.choice(plain), "max_tokens": 9}
            body["prompt"] = [5] * (CONTEXT - rng.randint(1, 8))
            body.pop("model", None)
            cases.append(("POST", "/v1/completions", _dumps(body), 400, "max_tokens"))
        elif roll < 0.86:  # the body is not a JSON object
            cases.append(("POST", "/v1/completions", rng.choice(BAD_BODIES), 400, "body"))
        elif roll < 0.97:  # chat
            messages, param = rng.choice(BAD_MESSAGES)
            body = {"messages": messages, "max_tokens": 4, "model": model}
            if rng.random() < 0.3:  # a bad sampling field is named before the messages
                field = rng.choice(["temperature", "n", "seed", "stop", "echo", "foo"])
                value = rng.choice(BAD_FIELDS.get(field, [1]))
                body[field], param = value, field
            cases.append(("POST", "/v1/chat/completions", _dumps(body), 400, param))
        elif roll < 0.985:  # a route or method that does not exist
            method, path = rng.choice([("GET", "/v1/completions"), ("POST", "/v1/nothing")])
            cases.append((method, path, b"{}", 405 if method == "GET" else 404, None))
        else:  # oversized
            body = b'{"prompt": "' + b"a" * (BODY_LIMIT + 1) + b'"}'
            cases.append(("POST", "/v1/completions", body, 413, "body"))
    return cases


async def _send(http, url, method, path, data: bytes):
    # The server inherits this environment: if it holds a key, the server wants it.
    headers = {"Content-Type": "application/json", **bearer(client_key())}
    async with http.request(method, url + path, data=data, headers=headers) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


def _answer(raw: bytes) -> list[tuple]:
    """(index, token_ids, text, finish_reason, stop_reason) per choice of a JSON answer."""
    choices = json.loads(raw)["choices"]
    return sorted(
        (c["index"], c["token_ids"], c["text"], c["finish_reason"], c["stop_reason"])
        for c in choices
    )


def _streamed(raw: bytes) -> list[tuple]:
    """The same, rebuilt from server-sent events; the stream must end with [DONE]."""
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), events[:3]
    assert events[-1] == "data: [DONE]"
    parts: dict[int, list] = {}
    for event in events[:-1]:
        chunk = json.loads(event[len("data: ") :])
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            ids, text, finish, stop = parts.setdefault(c["index"], [[], "", None, None])
            assert finish is None, "a chunk after the choice's last one"
            parts[c["index"]] = [
                ids + c["token_ids"],
                text + c["text"],
                c["finish_reason"],
                c.get("stop_reason"),
            ]
    return sorted((i, *p) for i, p in parts.items())


def test_a_thousand_malformed_requests_fail_alone_and_valid_ones_are_exact(server, tokenizer):
    rng = random.Random(SEED)
    valid = _valid_bodies(rng, tokenizer)

    async def main():
        timeout = aiohttp.ClientTimeout(total=120)
        headers = bearer(client_key())
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False, headers=headers) as http:
            async with http.get(server + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]
            for body in valid:
                if body.get("model"):
                    body["model"] = model
            reference = []  # each valid request sent alone
            for body in valid:
                status, _, raw = await _send(http, server, "POST", "/v1/completions", _dumps(body))
                assert status == 200, raw
                reference.append(_answer(raw))
        jobs = [("bad", case) for case in _malformed(rng, valid, model)]
        for _ in range(VALID_SENT):
            jobs.append(("valid", (rng.randrange(len(valid)), rng.random() < 0.4)))
        rng.shuffle(jobs)
        outcomes: list[tuple] = []

        async def client(share):
            async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as http:
                for kind, job in share:
                    if kind == "valid":
                        i, stream = job
                        body = {**valid[i], "stream": stream}
                        if stream:
                            body.pop("logprobs", None)  # not offered when streaming
                        status, ctype, raw = await _send(
                            http, server, "POST", "/v1/completions", _dumps(body)
                        )
                        outcomes.append(("valid", status, ctype, raw, (i, stream)))
                    else:
                        method, path, data, want_status, want_param = job
                        status, ctype, raw = await _send(http, server, method, path, data)
                        outcomes.append(("bad", status, ctype, raw, (want_status, want_param)))

        start = time.monotonic()
        await asyncio.gather(*(client(jobs[c::CLIENTS]) for c in range(CLIENTS)))
        wall = time.monotonic() - start
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False, headers=headers) as http:
            async with http.get(server + "/health") as r:
                health = (r.status, await r.json())
        return reference, outcomes, wall, health

    reference, outcomes, wall, health = asyncio.run(main())
    statuses = [o[1] for o in outcomes]
    bad = [o for o in outcomes if o[0] == "bad"]
    print(
        f"\nfuzz: {len(outcomes)} requests ({len(bad)} malformed) from {CLIENTS} clients in"
        f" {wall:.1f} s; 4xx: {sum(400 <= s < 500 for s in statuses)},"
        f" 5xx: {sum(s >= 500 for s in statuses)}"
    )
    assert len(bad) >= 1000
    assert [o for o in outcomes if o[1] >= 500] == []
    for _, status, ctype, raw, (want_status, want_param) in bad:
        assert status == want_status, (status, want_param, raw[:300])
        assert ctype.startswith("application/json"), ctype
        error = json.loads(raw)["error"]
        assert error["param"] == want_param, (want_param, error)
        assert error["message"]
    for _, status, _ctype, raw, (i, stream) in (o for o in outcomes if o[0] == "valid"):
        assert status == 200, raw[:300]
        got = _streamed(raw) if stream else _answer(raw)
        assert got == reference[i], (valid[i], stream)  # exactly what it gets when alone
    assert health == (200, {**health[1], "status": "ok", "failed_requests": 0})


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x", "stop": [1]}, "stop"),
        ({"prompt": [10**6]}, "prompt"),
        ({"prompt": "x", "temperature": NAN}, "temperature"),
        ({"prompt": "x", "temperature": INF}, "temperature"),
        ({"prompt": "x", "seed": 2**70}, "seed"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": "x", "stop": 3}, "stop"),
        ({"prompt": [5] * CONTEXT}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
    ],
)
def test_each_reported_bad_request_is_a_400_naming_its_field(server, body, param):
    """The cases of the issue report, one by one (each used to be a 500, a 200, or a hang)."""

    async def main():
        async with aiohttp.ClientSession(trust_env=False) as http:
            return await _send(http, server, "POST", "/v1/completions", _dumps(body))

    status, _, raw = asyncio.run(main())
    assert status == 400 and json.loads(raw)["error"]["param"] == param, raw
