"""Scheduler limits and failure isolation, with a real tiny model and the real sandbox: the
concurrency limits hold, and a cancelled trajectory, a failing engine, a killed sandbox
session or a killed server replica costs only the trajectory it hit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from tirl.backends.hf import HFEngine
from tirl.backends.openai import OpenAIEngine
from tirl.models.tiny import save_policy
from tirl.rollout.router import Router
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits

GREEDY = RolloutSettings(max_model_tokens=24, tool_budget=2, temperature=0.0)
OTHERS = ["D:\n", "A:\n", "C:\n", "D:\n"]  # the scripted model writes and runs code for each
SLOW = "B:\n"  # its code loops until the cell times out


def _same(a, b) -> None:
    assert b.ids == a.ids and b.finish_reason == a.finish_reason
    assert [(c.code, c.status) for c in b.tool_calls] == [(c.code, c.status) for c in a.tool_calls]


def _reference(model, tokenizer, prompts):
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2)) as sandbox:
            engine = HFEngine(model, tokenizer.eos_token_id)
            return await Rollout(engine, tokenizer, sandbox).run_many(prompts, GREEDY)

    return asyncio.run(main())


class Gauge:
    """Counts calls in flight and remembers the most at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def wrap(self, fn):
        async def counted(*args, **kwargs):
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                return await fn(*args, **kwargs)
            finally:
                self.now -= 1

        return counted


def _instrument(rollout: Rollout, on_session=None) -> tuple[Gauge, Gauge, list[int]]:
    """Gauges on engine requests and sandbox cells, and a log of how many requests were at
    the engine each time a cell started."""
    gen, tools, overlap = Gauge(), Gauge(), []
    rollout.engine.generate = gen.wrap(rollout.engine.generate)
    new_session = rollout.sandbox.session

    async def session():
        s = await new_session()
        run = tools.wrap(s.run)

        async def logged_run(code, timeout_s=None):
            overlap.append(gen.now)
            if on_session is not None:
                on_session(s, code)
            return await run(code, timeout_s)

        s.run = logged_run
        return s

    rollout.sandbox.session = session
    return gen, tools, overlap


def test_generation_and_tool_call_limits_hold_and_a_tool_wait_frees_its_slot(
    scripted_model, tokenizer
):
    prompts = [SLOW, *OTHERS, SLOW, *OTHERS]

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=0.3)) as sandbox:
            engine = HFEngine(scripted_model, tokenizer.eos_token_id)
            rollout = Rollout(engine, tokenizer, sandbox, max_generating=3, max_tool_calls=2)
            gauges = _instrument(rollout)
            trajs = await rollout.run_many(prompts, GREEDY)
            return trajs, gauges

    trajs, (gen, tools, overlap) = asyncio.run(main())
    assert all(t.finish_reason in ("stop", "length") for t in trajs)
    assert sum(len(t.tool_calls) for t in trajs) >= len(prompts)
    assert gen.peak == 3 and tools.peak == 2  # reached, never exceeded
    # cells ran while requests were at the engine: a trajectory in the sandbox held no slot
    assert max(overlap) >= 1


def _victim_in_sandbox(rollout: Rollout, rid: object) -> bool:
    traj = rollout.running().get(rid)
    return traj is not None and len(traj.segments) > 1  # its block closed: it is in the cell


async def _wait_until(predicate, timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


@pytest.mark.parametrize("how", ["cancel_api", "asyncio_cancel"])
def test_cancelling_one_rollout_loses_no_other(scripted_model, tokenizer, how):
    reference = _reference(scripted_model, tokenizer, OTHERS)

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5)) as sandbox:
            engine = HFEngine(scripted_model, tokenizer.eos_token_id)
            rollout = Rollout(engine, tokenizer, sandbox)
            metas = [{"rollout_id": "victim"}] + [{} for _ in OTHERS]
            tasks = [
                asyncio.create_task(rollout.run(p, GREEDY, m))
                for p, m in zip([SLOW, *OTHERS], metas)
            ]
            await _wait_until(lambda: _victim_in_sandbox(rollout, "victim"))
            if how == "cancel_api":
                assert rollout.cancel("victim") and not rollout.cancel("nobody")
            else:
                tasks[0].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            leftovers = (dict(engine._caches), set(sandbox._sessions), rollout.running())
            return results, leftovers

    (victim, *others), (caches, sessions, running) = asyncio.run(main())
    if how == "cancel_api":
        assert victim.finish_reason == "cancelled" and "Rollout.cancel" in victim.meta["error"]
    else:
        assert isinstance(victim, asyncio.CancelledError)
    for ref, traj in zip(reference, others):
        _same(ref, traj)
    assert caches == {} and sessions == set() and running == {}  # nothing leaked


class FailsOnPrompt:
    """An engine that raises for requests continuing one prompt, as a broken replica would."""

    def __init__(self, inner: HFEngine, prompt_ids: list[int]) -> None:
        self.inner, self.prompt_ids, self.bad_keys = inner, prompt_ids, set()

    async def generate(self, key, feed_ids, **kw):
        if key in self.bad_keys or feed_ids[: len(self.prompt_ids)] == self.prompt_ids:
            self.bad_keys.add(key)
            raise ConnectionError("replica lost")
        return await self.inner.generate(key, feed_ids, **kw)

    def release(self, key) -> None:
        self.inner.release(key)


def test_an_engine_error_ends_only_its_trajectory_with_the_reason(scripted_model, tokenizer):
    reference = _reference(scripted_model, tokenizer, OTHERS)
    bad = "Compute 12 * 34."

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=2)) as sandbox:
            engine = FailsOnPrompt(
                HFEngine(scripted_model, tokenizer.eos_token_id),
                tokenizer(bad, add_special_tokens=False)["input_ids"],
            )
            return await Rollout(engine, tokenizer, sandbox).run_many([bad, *OTHERS], GREEDY)

    failed, *others = asyncio.run(main())
    assert failed.finish_reason == "error"
    assert failed.meta["error"] == "ConnectionError: replica lost"
    for ref, traj in zip(reference, others):
        _same(ref, traj)


def test_a_sandbox_session_killed_mid_cell_costs_only_its_trajectory(scripted_model, tokenizer):
    reference = _reference(scripted_model, tokenizer, OTHERS)

    def kill_the_looping_one(session, code):
        if code.startswith("while True"):
            asyncio.get_running_loop().call_later(0.2, os.kill, session.pid, signal.SIGKILL)

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5)) as sandbox:
            rollout = Rollout(HFEngine(scripted_model, tokenizer.eos_token_id), tokenizer, sandbox)
            _instrument(rollout, on_session=kill_the_looping_one)
            return await rollout.run_many([SLOW, *OTHERS], GREEDY)

    killed, *others = asyncio.run(main())
    assert killed.tool_calls[0].status == "killed"  # the reason, shown to the model as well
    assert "killed" in killed.tool_calls[0].output_text.lower()
    assert killed.finish_reason in ("stop", "length")
    for ref, traj in zip(reference, others):
        _same(ref, traj)


def _serve(model_dir, replicas: int) -> list[tuple[subprocess.Popen, str]]:
    """`replicas` `tirl serve` processes, started together (each pays its imports: overlapping
    them saves wall time) and returned once all listen."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tirl.cli", "serve", str(model_dir), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(replicas)
    ]
    servers = []
    for proc in procs:
        line = proc.stdout.readline()
        if "listening on" not in line:
            for p in procs:
                p.kill()
            pytest.fail(f"tirl serve did not start: {line}")
        servers.append((proc, line.strip().rsplit(" ", 1)[1]))
    return servers


@pytest.mark.slow
def test_a_server_process_killed_mid_run_loses_no_trajectory(scripted_model, tokenizer, tmp_path):
    """Two `tirl serve` replicas on loopback; the one that answered first is SIGKILLed after
    its first answer, while the other trajectories are still running."""
    prompts = [*OTHERS, "Compute 12 * 34."]
    reference = _reference(scripted_model, tokenizer, prompts)
    save_policy(scripted_model, tokenizer, tmp_path / "model")
    servers = _serve(tmp_path / "model", replicas=2)
    try:
        engines = [OpenAIEngine(url, tokenizer) for _, url in servers]
        killed: list[int] = []
        for i, (engine, (proc, _)) in enumerate(zip(engines, servers)):
            original = engine.generate

            async def generate(key, feed, *, _original=original, _proc=proc, _i=i, **kw):
                out = await _original(key, feed, **kw)
                if not killed:  # the first replica to answer dies right after
                    killed.append(_i)
                    _proc.kill()
                    _proc.wait()
                return out

            engine.generate = generate
        router = Router(engines)

        async def main():
            async with Sandbox(SandboxLimits(timeout_s=2)) as sandbox:
                trajs = await Rollout(router, tokenizer, sandbox).run_many(prompts, GREEDY)
            await router.aclose()
            return trajs

        trajs = asyncio.run(main())
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()
    for ref, traj in zip(reference, trajs):
        _same(ref, traj)
    stats = router.stats()
    assert stats["dead"][killed[0]] and stats["failovers"] >= 1
