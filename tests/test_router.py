"""The replica router: hand-computed load and rebalance decisions on fake engines, then real
`HFEngine` replicas behind it giving exactly one engine's greedy trajectories, also when a
replica dies mid-run."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tirl.backends.hf import GenOutput, HFEngine
from tirl.backends.openai import OpenAIEngine
from tirl.rollout.router import NoReplicaError, Router
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits


class FakeEngine:
    """Records what it is fed; answers `out` ids, after `gate` opens when one is set."""

    def __init__(self, out: list[int] | None = None, fails: bool = False) -> None:
        self.out = out if out is not None else [99]
        self.fails = fails
        self.gate: asyncio.Event | None = None
        self.fed: list[tuple[object, list[int]]] = []
        self.released: list[object] = []

    async def generate(self, key, feed_ids, *, max_new_tokens, temperature=1.0, stop=None):
        self.fed.append((key, list(feed_ids)))
        if self.gate is not None:
            await self.gate.wait()
        if self.fails:
            raise ConnectionError("replica is down")
        return GenOutput(list(self.out), [0.0] * len(self.out), "stop")

    def release(self, key) -> None:
        self.released.append(key)


def _gen(router: Router, key: object, n_feed: int):
    return router.generate(key, list(range(n_feed)), max_new_tokens=8)


def test_weight_is_prefix_over_l_base_floored_plus_w_base():
    router = Router([FakeEngine()], l_base=10, w_base=2)
    assert [router.weight(n) for n in (0, 9, 10, 25, 100)] == [2, 2, 3, 4, 12]


def test_load_is_the_sum_of_in_flight_weights_and_first_requests_go_least_loaded():
    fakes = [FakeEngine(), FakeEngine()]
    router = Router(fakes, l_base=10, w_base=1)

    async def main():
        gate = asyncio.Event()
        for fake in fakes:
            fake.gate = gate
        tasks = []
        # (key, prefix length, weight, expected replica, loads after dispatch)
        for key, n, replica, load in [
            ("a", 25, 0, [3, 0]),  # w = 2 + 1; tie at 0 -> lowest index
            ("b", 5, 1, [3, 1]),  # w = 0 + 1
            ("c", 12, 1, [3, 3]),  # w = 1 + 1; 1 < 3
            ("d", 1, 0, [4, 3]),  # w = 1; loads tie at 3, replica 0 holds fewer keys (1 < 2)
        ]:
            tasks.append(asyncio.create_task(_gen(router, key, n)))
            await asyncio.sleep(0)
            assert fakes[replica].fed[-1][0] == key
            assert router.load == load
        gate.set()
        await asyncio.gather(*tasks)
        assert router.load == [0, 0]
        assert router.stats()["requests"] == [2, 2]

    asyncio.run(main())


@pytest.mark.parametrize(
    "prefix, home_load, moves",
    [
        (11, 3, False),  # w = 2: stay iff 3 + 2 <= 2 * (0 + 2) + 1 = 5
        (11, 4, True),  # 6 > 5
        (101, 12, False),  # w = 11: 12 + 11 <= 2 * 11 + 1 = 23: a long prefix is harder to move
        (101, 13, True),  # 24 > 23
    ],
)
def test_a_key_sticks_unless_its_replica_is_loaded_past_the_rebalance_rule(
    prefix, home_load, moves
):
    fakes = [FakeEngine(out=[99]), FakeEngine(out=[98])]
    router = Router(fakes, l_base=10, w_base=1, rebalance_ratio=2.0)

    async def main():
        await _gen(router, "k", prefix - 2)  # to replica 0; history = feed + [99]
        router.load[0] = home_load  # other keys' requests in flight there
        await router.generate("k", [7], max_new_tokens=8)

    asyncio.run(main())
    stats = router.stats()
    if moves:
        assert fakes[1].fed == [("k", list(range(prefix - 2)) + [99, 7])]  # the whole history
        assert fakes[0].released == ["k"]
        assert (stats["moves"], stats["sticky_hits"]) == (1, 0)
        assert stats["resident_keys"] == [0, 1]
    else:
        assert fakes[0].fed[-1] == ("k", [7])  # only the new tokens: the cache is there
        assert fakes[1].fed == [] and fakes[0].released == []
        assert (stats["moves"], stats["sticky_hits"]) == (0, 1)


def test_the_sticky_table_is_a_bounded_lru_and_an_evicted_key_is_refed_whole():
    fake = FakeEngine(out=[99])
    router = Router([fake], max_sticky=2)

    async def main():
        for key in "abc":
            await _gen(router, key, 3)
        assert fake.released == ["a"] and router.stats()["evictions"] == 1
        await _gen(router, "b", 1)  # touch b: c is now the least recently used
        await _gen(router, "a", 1)
        assert fake.fed[-1] == ("a", [0, 1, 2, 99, 0])
        assert fake.released == ["a", "c"]

    asyncio.run(main())
    router.release("a")
    assert fake.released[-1] == "a" and router.stats()["resident_keys"] == [1]


def test_a_failing_replica_moves_the_key_and_only_total_failure_raises():
    down, up = FakeEngine(fails=True), FakeEngine(out=[5])
    router = Router([down, up])

    async def main():
        out = await _gen(router, "a", 2)
        assert out.ids == [5] and up.fed == [("a", [0, 1])]
        assert down.released == ["a"]
        out = await _gen(router, "b", 2)  # dead replicas are skipped while a live one is left
        assert [k for k, _ in down.fed] == ["a"]
        up.fails = True
        with pytest.raises(NoReplicaError) as info:
            await _gen(router, "a", 1)
        assert isinstance(info.value.__cause__, ConnectionError)
        assert down.fed[-1] == ("a", [0, 1, 5, 0])  # the last chance was fed the history too

    asyncio.run(main())
    stats = router.stats()
    assert stats["dead"] == [True, True] and stats["failures"] == [2, 1]
    assert stats["failovers"] == 2 and stats["load"] == [0, 0]


# ---------------------------------------------------------------------- real engines


class DyingEngine:
    """A real engine that dies after `calls` requests: later ones, and those in flight, raise."""

    def __init__(self, inner: HFEngine, calls: int) -> None:
        self.inner, self.left, self.calls = inner, calls, 0

    async def generate(self, key, feed_ids, **kwargs):
        self.calls += 1
        if self.calls > self.left:
            raise ConnectionError("server died")
        out = await self.inner.generate(key, feed_ids, **kwargs)
        if self.calls >= self.left:  # died before the answer reached us
            raise ConnectionError("server died")
        return out

    def release(self, key) -> None:
        self.inner.release(key)

    def close(self) -> None:
        self.inner.close()


def _rollouts(engine, tokenizer, prompts, settings):
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2)) as sandbox:
            trajs = await Rollout(engine, tokenizer, sandbox).run_many(prompts, settings)
        if isinstance(engine, Router):
            await engine.aclose()
        else:
            engine.close()
        return trajs

    return asyncio.run(main())


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        assert [s.ids for s in y.segments] == [s.ids for s in x.segments]
        # the log-probabilities show the conditioning even where greedy ids would not
        for s, t in zip(x.segments, y.segments):
            assert t.logprobs == pytest.approx(s.logprobs, abs=1e-4)
        assert [(c.code, c.status) for c in y.tool_calls] == [
            (c.code, c.status) for c in x.tool_calls
        ]
        assert y.finish_reason == x.finish_reason


TEXT_PROMPTS = [f"Compute {a} * {b}." for a, b in [(12, 34), (5, 6), (70, 8), (9, 99), (3, 41)]]
TOOL_PROMPTS = ["A:\n", "C:\n", "D:\n", "Compute 12 * 34.", "D:\n"]


class PingPongRouter(Router):
    """Moves every key at every later request: each move re-feeds the whole history."""

    def _choose(self, home, weight, tried):
        best = super()._choose(None, weight, tried)
        if home is None or best is None or best != home:
            return best
        others = [i for i in range(len(self.replicas)) if i != home and i not in tried]
        return others[0] if others else home


@pytest.mark.parametrize("use_tools", [False, True])
def test_two_replicas_give_exactly_one_engines_greedy_trajectories(
    tiny_model, scripted_model, tokenizer, use_tools
):
    model = scripted_model if use_tools else tiny_model
    prompts = TOOL_PROMPTS if use_tools else TEXT_PROMPTS
    settings = RolloutSettings(
        max_model_tokens=24, tool_budget=2, temperature=0.0, use_tools=use_tools
    )
    eos = tokenizer.eos_token_id
    alone = _rollouts(HFEngine(model, eos, max_batch=8), tokenizer, prompts, settings)
    if use_tools:
        assert sum(len(t.tool_calls) for t in alone) >= 3  # the scripted prompts ran code
    for kind in (Router, PingPongRouter):
        router = kind([HFEngine(model, eos, max_batch=8) for _ in range(2)])
        _same(alone, _rollouts(router, tokenizer, prompts, settings))
        stats = router.stats()
        assert all(n > 0 for n in stats["requests"])  # both replicas got work
        assert stats["load"] == [0, 0] and stats["resident_keys"] == [0, 0]  # all released
        if use_tools:  # later turns of a key: sticky, or moved with the whole history
            later = sum(stats["requests"]) - len(prompts)
            assert later >= 3 and stats["sticky_hits"] + stats["moves"] == later
            assert stats["moves"] == (later if kind is PingPongRouter else 0)


def test_a_replica_dying_mid_run_loses_no_trajectory(scripted_model, tokenizer):
    settings = RolloutSettings(max_model_tokens=24, tool_budget=2, temperature=0.0)
    eos = tokenizer.eos_token_id
    alone = _rollouts(HFEngine(scripted_model, eos, max_batch=8), tokenizer, TOOL_PROMPTS, settings)
    dying = DyingEngine(HFEngine(scripted_model, eos, max_batch=8), calls=4)
    router = Router([dying, HFEngine(scripted_model, eos, max_batch=8)])
    trajs = _rollouts(router, tokenizer, TOOL_PROMPTS, settings)
    _same(alone, trajs)  # every trajectory is there, and exactly as one engine makes it
    stats = router.stats()
    assert stats["dead"] == [True, False] and stats["failovers"] >= 1
    assert stats["failures"][0] >= 1 and stats["load"] == [0, 0]


def _closed_loopback_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there: connections are refused


def test_a_dead_server_replica_fails_over_to_a_live_server(server, scripted_model, tokenizer):
    settings = RolloutSettings(max_model_tokens=24, tool_budget=2, temperature=0.0)
    eos = tokenizer.eos_token_id
    alone = _rollouts(HFEngine(scripted_model, eos, max_batch=8), tokenizer, TOOL_PROMPTS, settings)
    router = Router(
        [OpenAIEngine(_closed_loopback_url(), tokenizer), OpenAIEngine(server, tokenizer)]
    )
    _same(alone, _rollouts(router, tokenizer, TOOL_PROMPTS, settings))
    stats = router.stats()
    assert stats["dead"] == [True, False] and stats["failures"][0] >= 1
    assert stats["requests"][1] >= len(TOOL_PROMPTS)  # the live server did all the work
