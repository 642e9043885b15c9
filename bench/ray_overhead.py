"""Where the Ray pool's per-cell overhead goes: one trivial cell alone, taken apart.

    python bench/ray_overhead.py [--cells 300] [--runs 3]

`bench/sandbox_service.py` measured a trivial cell alone at +2.67 ms over the in-process API
through `RaySandboxPool` when every cell was a Ray call, against +0.33 ms through a
`tirl sandbox serve` channel. This times, on one loopback-only local Ray cluster, in one run
(interleaved, medians of per-run p50s):

- `in process`: `Sandbox` in this process, `1 + 1` on one session (the baseline);
- `Ray floor, ray.get`: a no-op method of a bare async actor, called and waited for with
  `ray.get` (Ray's own round trip: task submission, the actor's event loop, the reply object);
- `Ray floor, await`: the same call awaited from asyncio, as the pool does (Ray hands the reply
  to the caller's event loop through a future set from its own thread);
- `direct actor call`: the pool actor's own `run` method called with `.remote` and awaited, on
  a session made on it (the cell and its result's wire dict, without the pool's mailbox);
- `pool cell, data_path=ray`: `RaySession.run("1 + 1")` through `RaySandboxPool(data_path=
  "ray")` (one `exchange` actor call carrying the cell);
- `pool cell, data_path=socket`: the same through the default pool, whose cells go over each
  actor's WebSocket endpoint (tirl.sandbox.ray_socket), not as Ray calls.

So `pool cell - in process` is the overhead of each data path (the goal: at most 1 ms);
`direct - floor` is what the cell and its reply add to a bare actor call, and `pool (ray) -
direct` what the mailbox adds. Network: the cluster and the actors' endpoints bind to
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import ray

from tirl.sandbox import Sandbox, SandboxLimits
from tirl.sandbox.ray_pool import RaySandboxPool, init_local_ray

LIMITS = SandboxLimits(timeout_s=10.0, memory_mb=1024)
CELL = "1 + 1"


@ray.remote
class Echo:
    async def ping(self, x: int) -> int:
        return x


def p50_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


async def time_calls(call, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t)
    return out


async def one_run(
    n: int, local_session, ray_session, socket_session, actor, sid, echo
) -> dict[str, float]:
    async def local(_i):
        await local_session.run(CELL)

    async def over_ray(_i):
        await ray_session.run(CELL)

    async def over_socket(_i):
        await socket_session.run(CELL)

    async def direct(_i):
        await actor.run.remote(sid, CELL, None)

    async def floor_await(i):
        await echo.ping.remote(i)

    async def floor_get(i):
        ray.get(echo.ping.remote(i))

    row = {
        "in process": p50_ms(await time_calls(local, n)),
        "Ray floor, ray.get": p50_ms(await time_calls(floor_get, n)),
        "Ray floor, await": p50_ms(await time_calls(floor_await, n)),
        "direct actor call": p50_ms(await time_calls(direct, n)),
        "pool cell, data_path=ray": p50_ms(await time_calls(over_ray, n)),
        "pool cell, data_path=socket": p50_ms(await time_calls(over_socket, n)),
    }
    return row


async def main_async(cells: int, runs: int) -> list[dict[str, float]]:
    init_local_ray(num_cpus=2)
    echo = Echo.remote()
    ray.get(echo.ping.remote(0))
    ray_pool = RaySandboxPool(1, limits=LIMITS, pool_size=4, data_path="ray")
    socket_pool = RaySandboxPool(1, limits=LIMITS, pool_size=4, data_path="socket")
    await ray_pool.start()
    await socket_pool.start()
    rows = []
    try:
        async with Sandbox(LIMITS, pool_size=4) as box:
            local_session = await box.session()
            ray_session, socket_session = await ray_pool.session(), await socket_pool.session()
            actor, sid = ray_pool.actors[0], "bench-direct"
            await actor.create.remote(sid)
            for _ in range(20):  # warm every path
                await local_session.run(CELL)
                await ray_session.run(CELL)
                await socket_session.run(CELL)
                await actor.run.remote(sid, CELL, None)
            for r in range(runs):
                rows.append(
                    await one_run(
                        cells, local_session, ray_session, socket_session, actor, sid, echo
                    )
                )
                print(
                    f"run {r + 1}/{runs}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[-1].items())
                )
            requests = (await socket_pool.stats())["actors"][0]["requests"]
            print(f"socket pool actor, requests by data path: {requests}")
            await actor.close.remote(sid)
            for s in (local_session, ray_session, socket_session):
                await s.close()
    finally:
        await ray_pool.close()
        await socket_pool.close()
        ray.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = asyncio.run(main_async(args.cells, args.runs))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    base = med["in process"]
    print(f"\ntrivial cell alone, p50 in ms (median of {args.runs} runs x {args.cells} calls)\n")
    print("| path | p50 (ms) | over in process (ms) |")
    print("|---|---:|---:|")
    for k in med:
        print(f"| {k} | {med[k]:.2f} | {med[k] - base:+.2f} |")
    floor = med["Ray floor, await"]
    over_ray, over_socket = med["pool cell, data_path=ray"], med["pool cell, data_path=socket"]
    print(
        f"\ndata_path=ray: pool cell {over_ray:.2f} ms = a bare Ray actor call {floor:.2f}"
        f" + the cell and its reply in the actor {med['direct actor call'] - floor:.2f}"
        f" (the cell alone, in process: {base:.2f}) + the pool's mailbox"
        f" {over_ray - med['direct actor call']:.2f}"
    )
    print(
        f"data_path=socket: pool cell {over_socket:.2f} ms, {over_socket - base:+.2f} over in"
        f" process (goal: at most +1 ms; a bare Ray actor call alone is {floor - base:+.2f})"
    )


if __name__ == "__main__":
    main()
