"""The sandbox as a service at production shape: two `tirl sandbox serve` processes and a Ray
pool, against the same workload in process, all in one run on the same cores.

    python bench/sandbox_service.py [--quick] [--runs 3] [--sessions 1000] [--opens 200]
                                    [--transports local,http,ray] [--out service.json]

Transports (each one client: this process):
- `local`: `tirl.sandbox.Sandbox` in this process (the in-process baseline).
- `http`: two `tirl sandbox serve` processes on 127.0.0.1 (ports the OS picks), one
  `HTTPSandbox` over both: new sessions go to the server with fewer of them and stay there
  (sticky), every call on the session channel (one WebSocket per server).
- `rest`: the same two servers with `HTTPSandbox(channel=False)`: one HTTP request per call (the
  transport before the channel; not in the default set).
- `ray`: `RaySandboxPool(num_actors=2)` on a loopback-only local Ray cluster (`init_local_ray`),
  cells over each actor's WebSocket (the default data path).
- `ray-calls`: the same with `data_path="ray"`: every cell in an actor call (the transport
  before the socket; not in the default set). With both Ray transports in a run, each one's
  CPU count includes the other's idle actors (both live in the one Ray cluster).
Every transport uses the same limits, preloads and pre-forked pool (`--pool-size` per server,
actor, or the local sandbox).

One run of one transport, in order:
0. alone: 300 trivial cells in a row on one session: the transport's own cost, nothing queued.
1. production shape: `--sessions` sessions opened at once (`asyncio.gather` of `session()`,
   each timed from the call to the session being usable), then every session runs a rollout: a
   setup cell (imports), then `--cells` cells drawn from a mix (40% trivial, 30% sympy, 30%
   numpy), with a think time before each cell drawn uniformly from [0, 2 x `--think-s`] (the
   model writing its turn). Reported: cells/s over the phase, cell latency p50/p99 (as the
   caller sees it; setup cells excluded), open p50/p99, and how many sessions per second were
   started beyond the pool. The rollout starts once the pool has refilled: a refill is a few
   seconds of forks at the start of a rollout that lasts minutes, and here it would overlap half
   of a short rollout, on a different schedule per transport (`--no-settle` keeps the overlap).
2. saturation: the same sessions run `--burst` more cells each back to back, all at once:
   cells/s at full load, and CPU time per cell summed over every process of the transport (this
   client, the servers or actors, the zygotes and sessions; from /proc), so throughput can be
   compared per CPU-second as well as per wall-second on the shared cores.
3. memory, sessions still open: the growth of the server's (or actor's, or this process's for
   `local`) RSS since before the sessions opened, per session; and the USS of the session
   processes (smaps_rollup), per session. Then the sessions close.
4. the open goal: once the pool is full again, `--opens` sessions opened at once (timed as
   above), then closed.
The runs interleave transports (local, http, ray, local, ...) so a change in the machine's load
hits all of them, and the table gives medians over runs. Cell draws and think times are seeded
by (run, session), so every transport runs the same cells in a run.

Goals (issue 17): 200-open p99 <= 50 ms; cell p50 overhead over in-process <= 1 ms; saturated
throughput >= 80% of in-process. Network: everything binds and connects to 127.0.0.1 only.
`--quick` is a smoke run (one run, 300 sessions, about 2 minutes); its numbers are too few for
conclusions. The full run (3 runs, 1,000 sessions) takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.sandbox import Sandbox, SandboxLimits, Status
from tirl.sandbox.limits import MATH_PRELOAD

LOOPBACK = "127.0.0.1"
LIMITS = SandboxLimits(timeout_s=30.0, memory_mb=1024)  # generous: saturation queues cells
SETUP = "import numpy as np\nfrom sympy import *\nx = symbols('x')"
TRIVIAL = ("1 + 1", "k = {k} * 3\nk", "s = sum(range({k} % 50))", "print('step', {k})")
SYMPY = (
    "expand((x + {k})**3)",
    "factorint({k} * 1001 + 7)",
    "Rational({k}, 7) + Rational(2, 3)",
    "solve(x**2 - {k} * x, x)",
    "binomial({k} % 40 + 10, 5)",
    "isprime(2 * {k} + 1)",
)
NUMPY = (
    "float(np.linalg.det(np.eye(3) * ({k} % 7 + 1)))",
    "int(np.arange({k} % 100 + 10).sum())",
    "(np.ones((8, 8)) @ np.full((8, 8), {k} % 5))[0, 0]",
    "np.sqrt(np.arange(16.0) + {k}).round(3).tolist()[:4]",
)
MIX = ((0.4, TRIVIAL), (0.3, SYMPY), (0.3, NUMPY))
SEQUENTIAL_CELLS = 300
GOAL_OPEN_P99_MS = 50.0
GOAL_OVERHEAD_MS = 1.0
GOAL_THROUGHPUT = 0.8
SERVER_START_S = 120.0


@dataclass(frozen=True)
class Plan:
    runs: int
    sessions: int  # production shape: sessions at once
    opens: int  # the open-latency goal: sessions opened at once
    cells: int  # rollout cells per session, after the setup cell
    think_s: float  # mean think time between cells
    burst: int  # saturation: cells per session back to back
    pool_size: int  # pre-forked sessions per server / actor / local sandbox


FULL = Plan(3, 1000, 200, 4, 2.0, 2, 128)
QUICK = Plan(1, 300, 200, 3, 1.0, 2, 128)


def draw_cells(run: int, index: int, n: int) -> tuple[list[str], list[float]]:
    """The cells and think times of session `index` in run `run` (the same for every transport)."""
    rng = random.Random(f"{run}/{index}")
    families, weights = [f for _, f in MIX], [w for w, _ in MIX]
    cells = []
    for _ in range(n):
        family = rng.choices(families, weights)[0]
        cells.append(rng.choice(family).format(k=rng.randrange(1, 10_000)))
    return cells, [rng.uniform(0.0, 2.0) for _ in range(n + 1)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] if xs else float("nan")


# -- processes from /proc ------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    return kids


def tree(roots: list[int], kids: dict[int, list[int]] | None = None) -> list[int]:
    """`roots` and all their descendants."""
    kids = kids if kids is not None else children_map()
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_ticks(pids: list[int]) -> dict[int, int]:
    """utime + stime + cutime + cstime per live pid."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = sum(int(v) for v in fields[11:15])
    return out


def cpu_seconds_between(before: dict[int, int], after: dict[int, int]) -> float:
    return sum(after[p] - before.get(p, 0) for p in after) / CLK_TCK


def rss_mb(pid: int) -> float:
    found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) / 1024 if found else float("nan")


def uss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += sum(int(v) for v in re.findall(r"Private_(?:Clean|Dirty):\s+(\d+) kB", text))
    return total / 1024


# -- transports ----------------------------------------------------------------------------------


class Transport:
    """One way of reaching sandbox sessions: a client, the processes that serve it, and which
    processes count as its own for CPU time."""

    name = ""
    label = ""
    client: Any = None

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def server_pids(self) -> list[int]:
        """The processes that hold the session registry (servers, actors; this one in process)."""
        return [os.getpid()]

    def all_pids(self) -> list[int]:
        """Every process whose CPU counts for this transport (this client process included)."""
        return [os.getpid(), *tree(self.server_pids())[1:]]

    def session_pids(self) -> list[int]:
        """The session processes (zygotes' descendants)."""
        kids = children_map()
        return [p for z in self.zygote_pids() for p in tree([z], kids)[1:]]

    def zygote_pids(self) -> list[int]:
        return []

    async def pool_ready(self) -> int:
        """Sessions forked ahead and waiting, over all servers or actors."""
        return 0

    async def wait_pool(self, full: int, within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        while await self.pool_ready() < full and time.monotonic() < deadline:
            await asyncio.sleep(0.2)


class Local(Transport):
    name, label = "local", "in process"

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    async def start(self) -> None:
        # the pool of both servers (or actors) together: the same number of sessions ready
        self.client = Sandbox(LIMITS, pool_size=2 * self.plan.pool_size)
        await self.client.start()

    async def pool_ready(self) -> int:
        return len(self.client._pool)

    async def stop(self) -> None:
        await self.client.close()

    def all_pids(self) -> list[int]:
        return [os.getpid(), *tree(self.zygote_pids())]

    def zygote_pids(self) -> list[int]:
        return [self.client.zygote_pid]


@dataclass
class Servers:
    """Two `tirl sandbox serve` subprocesses on 127.0.0.1, shared by `http` and `rest`."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def start(self, plan: Plan, folder: Path, n: int = 2) -> None:
        if self.procs:
            return
        env = {k: v for k, v in os.environ.items() if k != "TIRL_API_KEY"}
        for i in range(n):
            out = folder / f"server{i}.out"
            cmd = [
                sys.executable, "-m", "tirl.cli", "sandbox", "serve", "--host", LOOPBACK,
                "--port", "0", "--timeout-s", str(LIMITS.timeout_s),
                "--max-timeout-s", str(LIMITS.timeout_s), "--memory-mb", str(LIMITS.memory_mb),
                "--pool-size", str(plan.pool_size), "--preload", ",".join(MATH_PRELOAD),
            ]  # fmt: skip
            with open(out, "wb") as f:
                self.procs.append(
                    subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
                )
        deadline = time.monotonic() + SERVER_START_S
        for i, proc in enumerate(self.procs):
            while True:
                text = (folder / f"server{i}.out").read_text()
                found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
                if found:
                    self.urls.append(found.group(1))
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"tirl sandbox serve did not start:\n{text}")
                time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs, self.urls = [], []


class HTTP(Transport):
    def __init__(self, servers: Servers, channel: bool) -> None:
        self.servers = servers
        self.channel = channel
        self.name = "http" if channel else "rest"
        self.label = "HTTP, 2 servers" + (" (channel)" if channel else " (REST per call)")

    async def start(self) -> None:
        from tirl.sandbox.http import HTTPSandbox

        self.client = HTTPSandbox(self.servers.urls, channel=self.channel)
        await self.client.start()

    async def stop(self) -> None:
        await self.client.close()

    def server_pids(self) -> list[int]:
        return [p.pid for p in self.servers.procs]

    async def pool_ready(self) -> int:
        import aiohttp

        total = 0
        async with aiohttp.ClientSession(trust_env=False) as http:
            for url in self.servers.urls:
                async with http.get(url + "/health") as resp:
                    total += (await resp.json())["pool_ready"]
        return total

    def zygote_pids(self) -> list[int]:
        kids = children_map()
        return [k for pid in self.server_pids() for k in kids.get(pid, [])]


class Ray(Transport):
    name, label = "ray", "Ray, 2 actors"

    def __init__(self, plan: Plan, data_path: str = "socket") -> None:
        self.plan = plan
        self.data_path = data_path
        if data_path == "ray":
            self.name, self.label = "ray-calls", "Ray, 2 actors, cells as actor calls"
        self._actor_pids: list[int] = []

    async def start(self) -> None:
        import ray

        from tirl.sandbox.ray_pool import RaySandboxPool, init_local_ray

        if not ray.is_initialized():
            init_local_ray(num_cpus=os.cpu_count())
        self.client = RaySandboxPool(
            2, limits=LIMITS, pool_size=self.plan.pool_size, data_path=self.data_path
        )
        await self.client.start()
        stats = await self.client.stats()
        self._actor_pids = [a["pid"] for a in stats["actors"]]
        self._zygotes = [a["zygote_pid"] for a in stats["actors"]]

    async def stop(self) -> None:
        await self.client.close()

    def server_pids(self) -> list[int]:
        return self._actor_pids

    async def pool_ready(self) -> int:
        return sum(a.get("pool_ready", 0) for a in (await self.client.stats())["actors"])

    def all_pids(self) -> list[int]:
        # every Ray process (GCS, raylet, workers, ...) started by this process, not the HTTP
        # servers' trees nor a local zygote
        kids = children_map()
        ray_roots = [p for p in kids.get(os.getpid(), []) if _cmdline_has(p, "ray")]
        return [os.getpid(), *tree(ray_roots, kids)]

    def zygote_pids(self) -> list[int]:
        return self._zygotes


def _cmdline_has(pid: int, word: str) -> bool:
    try:
        return word in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


# -- one run of one transport --------------------------------------------------------------------


async def timed_open(client: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    s = await client.session()
    return s, (time.perf_counter() - t0) * 1000


async def open_many(client: Any, n: int) -> tuple[list[Any], list[float]]:
    pairs = await asyncio.gather(*(timed_open(client) for _ in range(n)))
    return [s for s, _ in pairs], [ms for _, ms in pairs]


async def close_all(sessions: list[Any]) -> None:
    await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


async def rollout(
    s: Any, cells: list[str], think: list[float], think_s: float, lat: list[float], bad: list[str]
) -> None:
    await asyncio.sleep(think[-1] * think_s)  # the model writes its first turn
    r = await s.run(SETUP)
    if not r.ok:
        bad.append(f"setup: {r.status.value} {r.detail or r.traceback}")
    for code, t in zip(cells, think):
        await asyncio.sleep(t * think_s)
        t0 = time.perf_counter()
        r = await s.run(code)
        lat.append((time.perf_counter() - t0) * 1000)
        if r.status is not Status.OK:
            bad.append(f"{code!r}: {r.status.value} {r.detail or r.traceback}")


async def burst(s: Any, cells: list[str], bad: list[str]) -> None:
    for code in cells:
        r = await s.run(code)
        if r.status is not Status.OK:
            bad.append(f"{code!r}: {r.status.value} {r.detail or r.traceback}")


async def measure(
    t: Transport, plan: Plan, run: int, say: Callable[[str], None], settle: bool = False
) -> dict:
    out: dict[str, Any] = {"transport": t.name, "run": run}
    client = t.client
    full = 2 * plan.pool_size
    await t.wait_pool(full)  # bursts of opens come between rollouts, when the pool is full

    # 0. the transport alone: one session, trivial cells one after another
    s = await client.session()
    for _ in range(20):
        await s.run("1 + 1")
    rtt = []
    for _ in range(SEQUENTIAL_CELLS):
        t0 = time.perf_counter()
        await s.run("1 + 1")
        rtt.append((time.perf_counter() - t0) * 1000)
    out["sequential_ms"] = rtt
    await s.close()
    await t.wait_pool(full)

    # 1. production shape
    rss0 = {pid: rss_mb(pid) for pid in t.server_pids()}
    out["pool_ready_before_shape"] = await t.pool_ready()
    t0 = time.perf_counter()
    sessions, ms = await open_many(client, plan.sessions)
    out["open_ms"], out["open_wall_s"] = ms, time.perf_counter() - t0
    if settle:
        await t.wait_pool(full)
    lat: list[float] = []
    bad: list[str] = []
    draws = [draw_cells(run, i, plan.cells + plan.burst) for i in range(plan.sessions)]
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            rollout(s, cells[: plan.cells], think, plan.think_s, lat, bad)
            for s, (cells, think) in zip(sessions, draws)
        )
    )
    wall = time.perf_counter() - t0
    out["cell_ms"], out["rollout_wall_s"] = lat, wall
    out["rollout_cells_per_s"] = (len(lat) + plan.sessions) / wall  # setup cells included

    # 2. saturation
    pids = t.all_pids()
    cpu0, t0 = cpu_ticks(pids), time.perf_counter()
    await asyncio.gather(
        *(burst(s, cells[plan.cells :], bad) for s, (cells, _) in zip(sessions, draws))
    )
    wall = time.perf_counter() - t0
    cpu = cpu_seconds_between(cpu0, cpu_ticks(pids))
    n = plan.sessions * plan.burst
    out["burst_cells_per_s"], out["burst_cpu_ms_per_cell"] = n / wall, cpu / n * 1000
    out["burst_cells_per_cpu_s"] = n / cpu if cpu else float("nan")

    # 3. memory with the sessions open
    per_server = plan.sessions / max(1, len(rss0))
    out["server_rss_kb_per_session"] = statistics.mean(
        (rss_mb(pid) - before) * 1024 / per_server for pid, before in rss0.items()
    )
    spids = t.session_pids()
    out["session_uss_mb"] = uss_mb(spids) / max(1, len(spids))
    out["errors"] = bad[:5]
    out["error_count"] = len(bad)
    await close_all(sessions)

    # 4. the open-latency goal (last: the pool refills while the other transports run)
    await t.wait_pool(full)
    out["pool_ready_before"] = await t.pool_ready()
    sessions, ms = await open_many(client, plan.opens)
    out["open_goal_ms"] = ms
    await close_all(sessions)
    out["load_1min"] = os.getloadavg()[0]
    say(
        f"  {t.name:5s} run {run}: open p99 {pct(out['open_goal_ms'], 99):.1f} ms"
        f" ({plan.opens}), {pct(out['open_ms'], 99):.0f} ms ({plan.sessions});"
        f" cell p50 {pct(lat, 50):.2f} ms; burst {out['burst_cells_per_s']:.0f} cells/s,"
        f" {out['burst_cpu_ms_per_cell']:.2f} CPU-ms/cell; errors {len(bad)}"
    )
    return out


# -- report --------------------------------------------------------------------------------------


def summarize(results: list[dict], names: list[str]) -> dict[str, dict[str, float]]:
    """Per transport: the median over runs of each run's statistic."""

    def med(name: str, f: Callable[[dict], float]) -> float:
        return statistics.median(f(r) for r in results if r["transport"] == name)

    table = {}
    for name in names:
        table[name] = {
            "open_goal_p50": med(name, lambda r: pct(r["open_goal_ms"], 50)),
            "open_goal_p99": med(name, lambda r: pct(r["open_goal_ms"], 99)),
            "open_p50": med(name, lambda r: pct(r["open_ms"], 50)),
            "open_p99": med(name, lambda r: pct(r["open_ms"], 99)),
            "open_wall_s": med(name, lambda r: r["open_wall_s"]),
            "forks_per_s": med(
                name,
                lambda r: (len(r["open_ms"]) - r["pool_ready_before_shape"]) / r["open_wall_s"],
            ),
            "sequential_p50": med(name, lambda r: pct(r["sequential_ms"], 50)),
            "rollout_cells_per_s": med(name, lambda r: r["rollout_cells_per_s"]),
            "cell_p50": med(name, lambda r: pct(r["cell_ms"], 50)),
            "cell_p99": med(name, lambda r: pct(r["cell_ms"], 99)),
            "burst_cells_per_s": med(name, lambda r: r["burst_cells_per_s"]),
            "burst_cpu_ms_per_cell": med(name, lambda r: r["burst_cpu_ms_per_cell"]),
            "burst_cells_per_cpu_s": med(name, lambda r: r["burst_cells_per_cpu_s"]),
            "server_rss_kb_per_session": med(name, lambda r: r["server_rss_kb_per_session"]),
            "session_uss_mb": med(name, lambda r: r["session_uss_mb"]),
            "errors": sum(r["error_count"] for r in results if r["transport"] == name),
        }
    return table


def render(table: dict[str, dict[str, float]], labels: dict[str, str], plan: Plan) -> str:
    names = list(table)
    base = table.get("local")
    head = "| metric | " + " | ".join(labels[n] for n in names) + " |"
    rows = [head, "|---|" + "---:|" * len(names)]

    def row(title: str, fmt: Callable[[dict[str, float], str], str]) -> None:
        rows.append(f"| {title} | " + " | ".join(fmt(table[n], n) for n in names) + " |")

    def vs_base(key: str, n: str) -> str:
        if base is None or n == "local":
            return ""
        return f" ({table[n][key] / base[key]:.0%})"

    row("one session, trivial cells in a row: p50 (ms)", lambda t, n: f"{t['sequential_p50']:.2f}")
    if base is not None:
        row(
            "  over in-process (ms)",
            lambda t, n: (
                "—" if n == "local" else f"{t['sequential_p50'] - base['sequential_p50']:+.2f}"
            ),
        )
    row(
        f"{plan.opens} sessions opened at once: open p50 / p99 (ms)",
        lambda t, n: f"{t['open_goal_p50']:.1f} / {t['open_goal_p99']:.1f}",
    )
    row(
        f"{plan.sessions:,} sessions opened at once: open p50 / p99 (ms)",
        lambda t, n: f"{t['open_p50']:.0f} / {t['open_p99']:.0f}",
    )
    row(
        f"  sessions started beyond the pool, per second (all at once: {plan.sessions:,})",
        lambda t, n: f"{t['forks_per_s']:.0f}",
    )
    row("rollout: cells/s (think time included)", lambda t, n: f"{t['rollout_cells_per_s']:.0f}")
    row("rollout: cell p50 / p99 (ms)", lambda t, n: f"{t['cell_p50']:.2f} / {t['cell_p99']:.1f}")
    if base is not None:
        row(
            "  over in-process (ms)",
            lambda t, n: "—" if n == "local" else f"{t['cell_p50'] - base['cell_p50']:+.2f}",
        )
    row(
        "saturated: cells/s (vs in-process)",
        lambda t, n: f"{t['burst_cells_per_s']:.0f}{vs_base('burst_cells_per_s', n)}",
    )
    row(
        "saturated: cells per CPU-second, all processes (vs in-process)",
        lambda t, n: f"{t['burst_cells_per_cpu_s']:.0f}{vs_base('burst_cells_per_cpu_s', n)}",
    )
    row(
        "server RSS per session (KB)",
        lambda t, n: f"{t['server_rss_kb_per_session']:.0f}",
    )
    row("session process USS (MB)", lambda t, n: f"{t['session_uss_mb']:.1f}")
    row("cells that did not return OK", lambda t, n: f"{t['errors']:.0f}")
    return "\n".join(rows)


def goals(table: dict[str, dict[str, float]], plan: Plan) -> list[str]:
    base = table.get("local")
    lines = []
    for n, t in table.items():
        if n == "local":
            continue
        checks = [
            (f"{plan.opens}-open p99 {t['open_goal_p99']:.1f} ms <= 50", t["open_goal_p99"] <= 50)
        ]
        if base is not None:
            over = t["cell_p50"] - base["cell_p50"]
            alone = t["sequential_p50"] - base["sequential_p50"]
            wall = t["burst_cells_per_s"] / base["burst_cells_per_s"]
            cpu = t["burst_cells_per_cpu_s"] / base["burst_cells_per_cpu_s"]
            checks += [
                (f"cell p50 overhead, alone {alone:+.2f} ms <= 1", alone <= GOAL_OVERHEAD_MS),
                (f"in the rollout {over:+.2f} ms <= 1", over <= GOAL_OVERHEAD_MS),
                (f"saturated cells/s {wall:.0%} >= 80%", wall >= GOAL_THROUGHPUT),
                (f"cells per CPU-s {cpu:.0%} >= 80%", cpu >= GOAL_THROUGHPUT),
            ]
        lines.append(
            f"- {n}: " + "; ".join(f"{text} {'PASS' if ok else 'FAIL'}" for text, ok in checks)
        )
    return lines


async def main_async(args: argparse.Namespace, plan: Plan) -> dict:
    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    folder = Path(tempfile.mkdtemp(prefix="tirl-bench-service-"))
    servers = Servers()
    names = [n.strip() for n in args.transports.split(",") if n.strip()]
    transports: list[Transport] = []
    for n in names:
        if n == "local":
            transports.append(Local(plan))
        elif n in ("http", "rest"):
            servers.start(plan, folder)
            transports.append(HTTP(servers, channel=n == "http"))
        elif n in ("ray", "ray-calls"):
            transports.append(Ray(plan, "socket" if n == "ray" else "ray"))
        else:
            raise SystemExit(f"unknown transport {n!r}: local, http, rest, ray, ray-calls")
    results = []
    try:
        for t in transports:
            await t.start()
        say(f"started {', '.join(names)}; {plan}")
        for run in range(plan.runs):
            for t in transports:
                results.append(await measure(t, plan, run, say, args.settle))
    finally:
        for t in transports:
            with contextlib.suppress(Exception):
                await t.stop()
        servers.stop()
    return {"results": results, "names": names, "labels": {t.name: t.label for t in transports}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--sessions", type=int)
    ap.add_argument("--opens", type=int)
    ap.add_argument("--pool-size", type=int)
    ap.add_argument("--think-s", type=float)
    ap.add_argument("--transports", default="local,http,ray")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="start the rollout while the pool still refills after the opens (its forks then"
        " compete with the first cells; by default the rollout waits for the pool)",
    )
    args = ap.parse_args()
    plan = QUICK if args.quick else FULL
    overrides = {
        k: getattr(args, k)
        for k in ("runs", "sessions", "opens", "pool_size", "think_s")
        if getattr(args, k) is not None
    }
    plan = Plan(**{**plan.__dict__, **overrides})
    load_before, t0 = os.getloadavg(), time.monotonic()
    found = asyncio.run(main_async(args, plan))
    load_after = os.getloadavg()
    table = summarize(found["results"], found["names"])
    print(render(table, found["labels"], plan))
    print()
    print("\n".join(goals(table, plan)))
    print(
        f"\n{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; load average"
        f" {load_before[0]:.2f} / {load_before[1]:.2f} before, {load_after[0]:.2f} /"
        f" {load_after[1]:.2f} after (1 / 5 min); {plan.runs} run(s), medians;"
        f" {time.monotonic() - t0:.0f} s; pool {plan.pool_size} per server/actor/sandbox;"
        f" {plan.cells} cells per session after a setup cell, think time U(0, {2 * plan.think_s:g}) s,"
        f" {plan.burst} burst cells per session"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"plan": plan.__dict__, "table": table, **found, "load": [load_before, load_after]}
            )
        )


if __name__ == "__main__":
    main()
