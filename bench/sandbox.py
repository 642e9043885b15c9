"""tirl's sandbox against a fresh `python -c` per call and a Jupyter kernel per session.

    python bench/sandbox.py [--quick] [--skip-jupyter] [--sessions 200] [--out sandbox.json]

Everything runs in one process and one run, so the three systems see the same machine:

- `fresh python`: `sys.executable -c CODE`, a new interpreter per call, as SandboxFusion- and
  ToRL-style stacks do. Nothing is imported, so a sympy cell's CODE begins with
  `from sympy import *; x = symbols('x')` and prints the result.
- `jupyter`: one ipykernel per session through `jupyter_client`, as Qwen-Agent's
  code_interpreter does (without its Docker container): start the kernel, run an init cell that
  imports numpy and sympy (Qwen-Agent's init, minus pandas/matplotlib/seaborn), then run each
  cell with `execute` and read iopub until the kernel reports idle. ZMQ binds to 127.0.0.1 only;
  the kernels' IPython, runtime and connection files live in a temporary directory.
- `tirl`: `tirl.sandbox.Sandbox(preload=PRELOAD)`, sessions forked from the warm zygote;
  "pool" rows take sessions from a pre-forked pool (`pool_size`).

What each number means (milliseconds are wall clock as the caller sees them):

- session creation: `await sandbox.session()`; for jupyter, kernel start until ready plus the
  init cell. Fresh python has no sessions: its row is the startup of `python -c pass`.
- new session + first sympy cell: creation, the setup cell `from sympy import *; x =
  symbols('x')` (jupyter: part of init) and one sympy cell: what a stateless call costs, with
  sympy's caches still cold. For fresh python it is one sympy call.
- trivial cell (`1 + 1`), small sympy cell (SMALL_SYMPY_CELLS in turn: expand, factorint,
  Rational, solve, binomial, isprime) and sympy factor cell (`factor(expand((x + K)**6 - 1))`,
  the heavier cell sandboxes.md measured); K is new every call
  p50/p99: one warm session, after warm-up cells.
- sympy cells/s at concurrency c: c sessions, each running sympy cells back to back for a fixed
  time (tirl, jupyter); fresh python makes a fixed number of calls with c in flight. Jupyter
  starts at most `kernels` kernels and fresh python makes at most `fresh_cap` calls per level
  (see Plan); rows that were capped are marked and explained under the table.
- memory per session: USS (private pages) and PSS (proportional share of shared pages) from
  /proc/PID/smaps_rollup, summed over the session processes (tirl: every descendant of
  `sandbox.zygote_pid`; jupyter: each kernel and its children) and divided by the number of
  sessions. Measured when the sessions are new and again after the setup cell and one sympy cell
  (copy-on-write pages). "200 sessions" adds the zygote's PSS to 200 x the mean session PSS
  (jupyter: 200 x the kernel PSS, extrapolated from the few kernels started).
- targets (research/sandboxes.md section 7.5 and the issue) are printed with PASS/FAIL.

All raw samples go to the JSON file given by `--out`. On a shared 2-core machine timings jitter
by +-30%: compare the ratios within one run. Not measured: isolation wrappers (Docker, nsjail),
the remote transports, cells that time out. `--quick` is a smoke run (about 20 s); its numbers
are too few for conclusions. The full run takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tirl.sandbox import Sandbox, SandboxLimits, Session, Status

PRELOAD = ("math", "sympy", "numpy", "fractions", "itertools")
TRIVIAL = "1 + 1"
SETUP = "from sympy import *\nx = symbols('x')"
# Qwen-Agent's code_interpreter_init_kernel.py, restricted to sympy and numpy.
JUPYTER_INIT = f"""\
import math, os, re, signal
import numpy as np
{SETUP}


def input(*args, **kwargs):
    raise NotImplementedError('Python input() function is disabled.')
"""
LOOPBACK = "127.0.0.1"
LEVELS = (1, 8, 64)
TARGET_SESSIONS = 200
BUDGET_MB = 4096
CELL_TIMEOUT_S = 120.0  # generous: at concurrency 64 on a busy 2-core machine cells queue up
POOL_SIZE = 16
POOL_GAP_S = 0.02  # pause between pooled sessions, so the pool refills as between rollouts

Runner = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class Plan:
    """How much one run measures."""

    creations: int  # tirl sessions created one after another, per variant (no pool, pool)
    trivial_cells: int  # trivial cells timed in one warm session
    sympy_cells: int  # sympy cells timed in one warm session
    seconds: float  # per concurrency level, for tirl and jupyter
    sessions: int  # tirl sessions alive at once for the memory measurement
    fresh_calls: int  # fresh-python calls per latency measurement
    fresh_cap: int  # most fresh-python calls per concurrency level
    kernels: int  # Jupyter kernels: creation samples, memory, and the concurrency cap
    jupyter_cells: int  # trivial and sympy cells timed in one warm kernel


FULL = Plan(60, 1000, 300, 3.0, TARGET_SESSIONS, 15, 64, 8, 200)
QUICK = Plan(10, 200, 40, 0.5, 32, 3, 8, 2, 40)


# The small sympy cells a model writes while solving a math problem, one per call in turn, each
# with a new constant K so no result can come from a cache.
SMALL_SYMPY_CELLS = (
    "expand((x + {k})**3)",
    "factorint({k} * 1001 + 7)",
    "Rational({k}, 7) + Rational(2, 3)",
    "solve(x - {k}, x)",
    "binomial({k} % 40 + 10, 5)",
    "isprime(2 * {k} + 1)",
)


def sympy_cell(k: int) -> str:
    return SMALL_SYMPY_CELLS[k % len(SMALL_SYMPY_CELLS)].format(k=k)


def factor_cell(k: int) -> str:
    """A heavier sympy cell (~5 ms of sympy work): the one sandboxes.md measured."""
    return f"factor(expand((x + {k})**6 - 1))"


def fresh_code(cell: str) -> str:
    return f"{SETUP}\nprint({cell})"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def progress(desc: str, total: int | None = None, unit: str = "cell") -> tqdm:
    """A progress bar on stderr that disappears when done (and stays off when not a tty)."""
    return tqdm(desc=desc, total=total, unit=unit, leave=False, disable=None, file=sys.stderr)


# -- memory from /proc -------------------------------------------------------------------------


def children_map() -> dict[int, list[int]]:
    """ppid -> pids, from /proc/*/stat (this kernel has no /proc/PID/task/TID/children)."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> list[int]:
    kids = children_map()
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def smaps_rollup_kb(pid: int) -> dict[str, int]:
    fields = {}
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return {}
    for line in lines[1:]:
        key, _, rest = line.partition(":")
        fields[key] = int(rest.split()[0])
    return fields


def memory_mb(pids: list[int], sessions: int) -> dict[str, float]:
    """Summed USS/PSS/RSS of `pids` in MB, and the same per session."""
    uss = pss = rss = 0
    for pid in pids:
        f = smaps_rollup_kb(pid)
        uss += f.get("Private_Clean", 0) + f.get("Private_Dirty", 0)
        pss += f.get("Pss", 0)
        rss += f.get("Rss", 0)
    n = max(sessions, 1)
    return {
        "sessions": sessions,
        "processes": len(pids),
        "uss_mb": uss / 1024,
        "pss_mb": pss / 1024,
        "rss_mb": rss / 1024,
        "uss_mb_per_session": uss / 1024 / n,
        "pss_mb_per_session": pss / 1024 / n,
    }


# -- shared measurements over a Runner ----------------------------------------------------------


async def timed(run: Runner, cells: list[str], bar: tqdm | None = None) -> list[float]:
    out = []
    for code in cells:
        t0 = time.perf_counter()
        await run(code)
        out.append(ms_since(t0))
        if bar is not None:
            bar.update()
    return out


async def warm_up(run: Runner) -> None:
    await run(SETUP)
    for i in range(10):
        await run(TRIVIAL)
        await run(sympy_cell(-1 - i))


async def warm_latency(run: Runner, trivial: int, sympy: int, name: str) -> dict[str, list]:
    """p50/p99 samples of the trivial and the sympy cell in one warm session."""
    await warm_up(run)
    with progress(f"{name}: warm-session latency", trivial + 2 * sympy) as bar:
        trivial_ms = await timed(run, [TRIVIAL] * trivial, bar)
        sympy_ms = await timed(run, [sympy_cell(k) for k in range(1, sympy + 1)], bar)
        factor_ms = await timed(run, [factor_cell(k) for k in range(1, sympy + 1)], bar)
    return {"trivial_ms": trivial_ms, "sympy_ms": sympy_ms, "factor_ms": factor_ms}


async def throughput(runners: list[Runner], seconds: float, desc: str) -> dict[str, float]:
    """Sympy cells/s with every runner busy back to back for `seconds`."""
    ks = itertools.count(1)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(run: Runner, bar: tqdm) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await run(sympy_cell(next(ks)))
            done += 1
            bar.update()

    t0 = time.perf_counter()
    with progress(desc) as bar:
        await asyncio.gather(*(worker(r, bar) for r in runners))
    elapsed = time.perf_counter() - t0
    return {"sessions": len(runners), "cells": done, "seconds": elapsed, "rate": done / elapsed}


# -- tirl -------------------------------------------------------------------------------------


def tirl_runner(session: Session) -> Runner:
    async def run(code: str) -> str:
        r = await session.run(code, timeout_s=CELL_TIMEOUT_S)
        if r.status is not Status.OK:
            raise RuntimeError(f"tirl cell {code!r}: {r.status.value} {r.detail} {r.traceback}")
        return r.stdout

    return run


async def tirl_creation(sb: Sandbox, n: int, gap_s: float, desc: str) -> dict[str, list]:
    """Create n sessions one after another: creation time and creation + first sympy cell."""
    create, cold = [], []
    with progress(desc, n, "session") as bar:
        for k in range(n):
            t0 = time.perf_counter()
            s = await sb.session()
            create.append(ms_since(t0))
            try:
                run = tirl_runner(s)
                await run(SETUP)
                await run(sympy_cell(k))
                cold.append(ms_since(t0))
            finally:
                await s.close()
            bar.update()
            await asyncio.sleep(gap_s)
    return {"create_ms": create, "cold_ms": cold}


async def tirl_throughput(sb: Sandbox, c: int, seconds: float) -> dict[str, float]:
    sessions: list[Session] = []
    try:
        for _ in range(c):
            sessions.append(await sb.session())
        runners = [tirl_runner(s) for s in sessions]
        await asyncio.gather(*(warm_up(r) for r in runners))
        return await throughput(runners, seconds, f"tirl: sympy cells at concurrency {c}")
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


async def tirl_memory(sb: Sandbox, n: int) -> dict[str, Any]:
    """Memory of n live sessions, new and after the setup cell plus one sympy cell."""
    assert sb.zygote_pid is not None
    sessions: list[Session] = []
    try:
        with progress(f"tirl: {n} sessions for memory", n, "session") as bar:
            for _ in range(n):
                sessions.append(await sb.session())
                bar.update()
        new = memory_mb(descendants(sb.zygote_pid), n)

        async def use(s: Session, k: int, bar: tqdm) -> None:
            run = tirl_runner(s)
            await run(SETUP)
            await run(sympy_cell(k))
            bar.update()

        with progress(f"tirl: one sympy cell in each of {n} sessions", n, "session") as bar:
            await asyncio.gather(*(use(s, k, bar) for k, s in enumerate(sessions)))
        used = memory_mb(descendants(sb.zygote_pid), n)
        zygote = memory_mb([sb.zygote_pid], 1)
        return {"new": new, "used": used, "zygote": zygote}
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


async def bench_tirl(plan: Plan) -> dict[str, Any]:
    limits = SandboxLimits(timeout_s=CELL_TIMEOUT_S)
    out: dict[str, Any] = {"preload": list(PRELOAD), "pool_size": POOL_SIZE}
    t0 = time.perf_counter()
    async with Sandbox(limits, preload=PRELOAD) as sb:
        out["zygote_start_ms"] = ms_since(t0)
        out["no_pool"] = await tirl_creation(sb, plan.creations, 0.0, "tirl: session creation")
        async with await sb.session() as s:
            out |= await warm_latency(tirl_runner(s), plan.trivial_cells, plan.sympy_cells, "tirl")
        out["throughput"] = {c: await tirl_throughput(sb, c, plan.seconds) for c in LEVELS}
        out["memory"] = await tirl_memory(sb, plan.sessions)
    async with Sandbox(limits, preload=PRELOAD, pool_size=POOL_SIZE) as sb:  # once it is full
        desc = "tirl: session creation from the pool"
        out["pool"] = await tirl_creation(sb, plan.creations, POOL_GAP_S, desc)
    return out


# -- fresh python per call ----------------------------------------------------------------------


async def fresh_call(code: str) -> float:
    """Run `python -c code` to completion; its wall time in ms."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C is ours to handle: we kill it below
    )
    try:
        _, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled (Ctrl-C): leave nothing running
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"python -c failed ({proc.returncode}): {err.decode()[-500:]}")
    return ms_since(t0)


def fresh_peak_rss_mb() -> float:
    """Peak RSS of one fresh sympy call, from wait4's rusage."""
    proc = subprocess.Popen(
        [sys.executable, "-c", fresh_code(sympy_cell(1))], stdout=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024


async def fresh_throughput(c: int, cap: int) -> dict[str, Any]:
    """A fixed number of sympy calls with up to c in flight."""
    n = min(max(2 * c, 4), cap)
    in_flight = min(c, n)
    ks = iter(range(1, n + 1))

    async def worker(bar: tqdm) -> None:
        for k in ks:
            await fresh_call(fresh_code(sympy_cell(k)))
            bar.update()

    t0 = time.perf_counter()
    with progress(f"fresh python: {n} sympy calls, {in_flight} in flight", n, "call") as bar:
        await asyncio.gather(*(worker(bar) for _ in range(in_flight)))
    elapsed = time.perf_counter() - t0
    return {"calls": n, "in_flight": in_flight, "seconds": elapsed, "rate": n / elapsed}


async def bench_fresh(plan: Plan) -> dict[str, Any]:
    n = plan.fresh_calls
    out: dict[str, Any] = {"executable": sys.executable}
    with progress("fresh python: latency", 4 * n, "call") as bar:
        for key, code in (
            ("startup_ms", lambda k: "pass"),
            ("trivial_ms", lambda k: f"print({TRIVIAL})"),
            ("sympy_ms", lambda k: fresh_code(sympy_cell(k))),
            ("factor_ms", lambda k: fresh_code(factor_cell(k))),
        ):
            out[key] = []
            for k in range(1, n + 1):
                out[key].append(await fresh_call(code(k)))
                bar.update()
    out["throughput"] = {c: await fresh_throughput(c, plan.fresh_cap) for c in LEVELS}
    out["peak_rss_mb"] = fresh_peak_rss_mb()
    return out


# -- Jupyter kernel per session -----------------------------------------------------------------


def jupyter_runner(kc: Any) -> Runner:
    """Qwen-Agent's way: `execute`, then read iopub until this request's status is idle."""

    async def run(code: str) -> str:
        msg_id = kc.execute(code)
        out, error = [], None
        while True:
            try:
                msg = await kc.get_iopub_msg(timeout=CELL_TIMEOUT_S)
            except queue.Empty:
                why = f"jupyter cell {code!r}: no reply in {CELL_TIMEOUT_S} s"
                raise RuntimeError(why) from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "execute_result":
                out.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if error is not None:
            raise RuntimeError(f"jupyter cell {code!r}: {error}")
        return "".join(out)

    return run


def kernel_spec_manager(workdir: Path) -> Any:
    """The installed `python3` kernelspec; if there is none, ipykernel's, written to workdir."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        ksm.get_kernel_spec("python3")
        return ksm
    except NoSuchKernel:
        from ipykernel.kernelspec import write_kernel_spec

        write_kernel_spec(str(workdir / "kernels" / "python3"))
        return KernelSpecManager(kernel_dirs=[str(workdir / "kernels")], ensure_native_kernel=False)


class Kernels:
    """Jupyter kernels started by this benchmark; leaving `async with` shuts every one down.

    IPython creates its directory (~/.ipython) on import, in this process as in the kernels, so
    for as long as the kernels live IPYTHONDIR and JUPYTER_RUNTIME_DIR point into `workdir`, here
    and in the kernels' environment.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.managers: list[Any] = []
        self.clients: list[Any] = []
        self.private_env = {
            "IPYTHONDIR": str(workdir / "ipython"),
            "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
            "MPLCONFIGDIR": str(workdir / "matplotlib"),
        }
        self.saved_env = {k: os.environ.get(k) for k in self.private_env}
        self.ksm: Any = None

    @property
    def argv(self) -> list[str]:
        return self.ksm.get_kernel_spec("python3").argv

    def pids(self) -> list[int]:
        return [km.provisioner.process.pid for km in self.managers]

    async def start(self) -> tuple[Runner, float, float]:
        """Start a kernel and run the init cell; the runner, ms to ready and ms for init."""
        from jupyter_client.manager import AsyncKernelManager

        i = len(self.managers)
        t0 = time.perf_counter()
        km = AsyncKernelManager(
            kernel_name="python3",
            kernel_spec_manager=self.ksm,
            transport="tcp",
            ip=LOOPBACK,
            connection_file=str(self.workdir / f"kernel-{i}.json"),
        )
        self.managers.append(km)
        # Its log (a warning that TCP is unencrypted: it is loopback only) would garble the table.
        await km.start_kernel(
            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        info = json.loads(Path(km.connection_file).read_text())
        if km.ip != LOOPBACK or info["ip"] != LOOPBACK:
            raise RuntimeError(f"kernel {i} is not bound to {LOOPBACK}: {info['ip']}")
        kc = km.client()
        self.clients.append(kc)
        kc.start_channels()
        await kc.wait_for_ready(timeout=CELL_TIMEOUT_S)
        ready_ms = ms_since(t0)
        run = jupyter_runner(kc)
        t1 = time.perf_counter()
        await run(JUPYTER_INIT)
        return run, ready_ms, ms_since(t1)

    async def __aenter__(self) -> Kernels:
        os.environ.update(self.private_env)
        try:
            self.ksm = kernel_spec_manager(self.workdir)
        except BaseException:
            self.restore_env()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            for kc in self.clients:
                kc.stop_channels()
            await asyncio.gather(
                *(km.shutdown_kernel(now=True) for km in self.managers if km.has_kernel),
                return_exceptions=True,
            )
        finally:
            self.restore_env()

    def restore_env(self) -> None:
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kernel_memory(kernels: Kernels) -> dict[str, float]:
    pids = [p for pid in kernels.pids() for p in (pid, *descendants(pid))]
    return memory_mb(pids, len(kernels.managers))


async def bench_jupyter(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"kernels": plan.kernels, "ready_ms": [], "init_ms": []}
    with tempfile.TemporaryDirectory(prefix="tirl-bench-jupyter-") as tmp:
        async with Kernels(Path(tmp)) as kernels:
            out["argv"] = kernels.argv
            runners = []
            with progress("jupyter: kernel start + init", plan.kernels, "kernel") as bar:
                for _ in range(plan.kernels):
                    run, ready_ms, init_ms = await kernels.start()
                    runners.append(run)
                    out["ready_ms"].append(ready_ms)
                    out["init_ms"].append(init_ms)
                    bar.update()
            out["create_ms"] = [a + b for a, b in zip(out["ready_ms"], out["init_ms"])]
            memory = {"new": kernel_memory(kernels)}
            first = [(await timed(run, [sympy_cell(k)]))[0] for k, run in enumerate(runners)]
            out["cold_ms"] = [c + f for c, f in zip(out["create_ms"], first)]
            memory["used"] = kernel_memory(kernels)
            out["memory"] = memory
            n = plan.jupyter_cells
            out |= await warm_latency(runners[0], n, n, "jupyter")
            out["throughput"] = {
                c: await throughput(
                    runners[:c], plan.seconds, f"jupyter: sympy cells at concurrency {c}"
                )
                for c in LEVELS
            }
    return out


# -- report -----------------------------------------------------------------------------------


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def fmt_n(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def median(xs: list[float] | None) -> float | None:
    return pct(xs, 50) if xs else None


def p99(xs: list[float] | None) -> float | None:
    return pct(xs, 99) if xs else None


def fits(mem: dict[str, Any], base_pss_mb: float) -> float:
    """Projected MB for TARGET_SESSIONS sessions: base + that many times the mean session PSS."""
    return base_pss_mb + TARGET_SESSIONS * mem["pss_mb_per_session"]


def table_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    f, j, t = r["fresh"], r.get("jupyter", {}), r["tirl"]
    tm = t["memory"]
    jm = j.get("memory", {})
    zyg = tm["zygote"]["pss_mb"]
    rows = [
        (
            "session creation, median ms",
            f"{fmt_ms(median(f['startup_ms']))} (startup)",
            fmt_ms(median(j.get("create_ms"))),
            fmt_ms(median(t["no_pool"]["create_ms"])),
        ),
        (
            "session creation, p99 ms",
            f"{fmt_ms(p99(f['startup_ms']))} (startup)",
            fmt_ms(p99(j.get("create_ms"))),
            fmt_ms(p99(t["no_pool"]["create_ms"])),
        ),
        (
            "session from pool, median / p99 ms",
            "—",
            "—",
            f"{fmt_ms(median(t['pool']['create_ms']))} / {fmt_ms(p99(t['pool']['create_ms']))}",
        ),
        (
            "new session + first sympy cell, median ms",
            fmt_ms(median(f["sympy_ms"])),
            fmt_ms(median(j.get("cold_ms"))),
            f"{fmt_ms(median(t['no_pool']['cold_ms']))} (pool "
            f"{fmt_ms(median(t['pool']['cold_ms']))})",
        ),
    ]
    for label, key in (
        ("trivial cell `1 + 1`", "trivial_ms"),
        ("small sympy cell", "sympy_ms"),
        ("sympy factor cell", "factor_ms"),
    ):
        for q, fn in (("p50", median), ("p99", p99)):
            rows.append(
                (f"{label} {q} ms", fmt_ms(fn(f[key])), fmt_ms(fn(j.get(key))), fmt_ms(fn(t[key])))
            )
    for c in LEVELS:
        ft, jt = f["throughput"][c], j.get("throughput", {}).get(c)
        fcap = "*" if ft["in_flight"] < c else ""
        jcap = "*" if jt and jt["sessions"] < c else ""
        rows.append(
            (
                f"sympy cells/s, concurrency {c}",
                f"{fmt_n(ft['rate'])} ({ft['calls']} calls){fcap}",
                f"{fmt_n(jt['rate'])}{jcap}" if jt else "—",
                fmt_n(t["throughput"][c]["rate"]),
            )
        )
    for state, label in (("new", "new session"), ("used", "after setup + sympy cell")):
        rows.append(
            (
                f"MB/session USS / PSS, {label}",
                f"(per call: {fmt_n(f['peak_rss_mb'])} peak RSS)" if state == "new" else "—",
                _uss_pss(jm.get(state)),
                _uss_pss(tm[state]),
            )
        )
    rows.append(
        (
            f"MB for {TARGET_SESSIONS} sessions (after a cell)",
            "—",
            f"{fmt_n(fits(jm['used'], 0))} (extrapolated)" if jm else "—",
            fmt_n(fits(tm["used"], zyg)),
        )
    )
    return rows


def _uss_pss(mem: dict[str, Any] | None) -> str:
    if not mem:
        return "—"
    return f"{mem['uss_mb_per_session']:.1f} / {mem['pss_mb_per_session']:.1f}"


def print_table(r: dict[str, Any]) -> None:
    head = ("metric", "fresh python -c", "jupyter kernel", "tirl sandbox")
    rows = [head, *table_rows(r)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        print("| " + " | ".join(cells) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def footnotes(r: dict[str, Any]) -> list[str]:
    f, t = r["fresh"], r["tirl"]
    notes = [
        f"fresh python: a fixed number of calls per level (cap {r['plan']['fresh_cap']});"
        " * = fewer calls in flight than the concurrency.",
        f"tirl: {t['throughput'][LEVELS[0]]['seconds']:.1f}+ s per level;"
        f" memory over {t['memory']['used']['sessions']} live sessions"
        f" ({t['memory']['used']['processes']} processes) + zygote"
        f" PSS {t['memory']['zygote']['pss_mb']:.0f} MB; zygote start"
        f" {t['zygote_start_ms']:.0f} ms (once per sandbox).",
        f"tirl pool: pool_size {t['pool_size']}, {POOL_GAP_S * 1000:.0f} ms between sessions.",
    ]
    if "jupyter" in r:
        j = r["jupyter"]
        notes.append(
            f"jupyter: {j['kernels']} kernels (* = ran on {j['kernels']} kernels, fewer than the"
            f" concurrency); creation = ready {fmt_ms(median(j['ready_ms']))} + init"
            f" {fmt_ms(median(j['init_ms']))} ms (medians); MB for {TARGET_SESSIONS} sessions"
            f" = {TARGET_SESSIONS} x the mean kernel PSS; a new kernel has run the init cell;"
            f" kernel argv: {' '.join(j['argv'])}."
        )
    notes.append(f"fresh python: {f['executable']}; latencies over {len(f['sympy_ms'])} calls.")
    return notes


def target(name: str, value: float, op: str, goal: float, unit: str) -> dict[str, Any]:
    ok = value >= goal if op == ">=" else value <= goal
    return {"target": name, "value": value, "op": op, "goal": goal, "unit": unit, "pass": ok}


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    f, t = r["fresh"], r["tirl"]
    rate = {c: t["throughput"][c]["rate"] for c in LEVELS}
    best = max(LEVELS, key=rate.get)
    vs_fresh_rate = rate[8] / f["throughput"][8]["rate"]
    vs_fresh_p50 = median(f["sympy_ms"]) / median(t["sympy_ms"])
    mem = fits(t["memory"]["used"], t["memory"]["zygote"]["pss_mb"])
    return [
        target("sympy cells/s, tirl / fresh python, concurrency 8", vs_fresh_rate, ">=", 100, "x"),
        target("sympy cell p50, fresh python / tirl", vs_fresh_p50, ">=", 100, "x"),
        target(f"sympy cells/s on 2 cores (best: c={best})", rate[best], ">=", 250, "/s"),
        target("sympy cell p50", median(t["sympy_ms"]), "<=", 10, "ms"),
        target("trivial cell p50", median(t["trivial_ms"]), "<=", 2, "ms"),
        target("trivial cell p99", p99(t["trivial_ms"]), "<=", 10, "ms"),
        target("session creation p50", median(t["no_pool"]["create_ms"]), "<=", 15, "ms"),
        target("session creation p99", p99(t["no_pool"]["create_ms"]), "<=", 50, "ms"),
        target("session from pool p50", median(t["pool"]["create_ms"]), "<=", 2, "ms"),
        target(f"{TARGET_SESSIONS} sessions + zygote (after a cell)", mem, "<=", BUDGET_MB, "MB"),
    ]


def fmt_x(x: float) -> str:
    return f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def ratios(r: dict[str, Any]) -> list[str]:
    f, t = r["fresh"], r["tirl"]
    lines = []
    for name, base in (("fresh python", f), ("jupyter", r.get("jupyter"))):
        if base is None:
            continue
        tp = ", ".join(
            f"c={c} {fmt_x(t['throughput'][c]['rate'] / base['throughput'][c]['rate'])}"
            for c in LEVELS
        )
        lat = median(base["sympy_ms"]) / median(t["sympy_ms"])
        triv = median(base["trivial_ms"]) / median(t["trivial_ms"])
        lines.append(
            f"tirl vs {name}: sympy cells/s {tp}; sympy cell p50 {fmt_x(lat)} lower;"
            f" trivial cell p50 {fmt_x(triv)} lower"
        )
    return lines


def print_report(r: dict[str, Any]) -> None:
    m = r["machine"]
    print(
        f"\n{m['cpus']} CPUs, Python {m['python']}, load average {m['load_before'][0]:.2f}"
        f" before / {m['load_after'][0]:.2f} after; {'quick' if r['quick'] else 'full'} run,"
        f" {r['seconds']:.0f} s"
    )
    print_table(r)
    for note in footnotes(r):
        print(f"  - {note}")
    print()
    for line in ratios(r):
        print(line)
    print()
    for tg in r["targets"]:
        mark = "PASS" if tg["pass"] else "FAIL"
        value = f"{tg['value']:.1f}" if tg["value"] < 1000 else f"{tg['value']:.0f}"
        print(f"  {mark}  {tg['target']}: {value} {tg['unit']} ({tg['op']} {tg['goal']})")


# -- main -------------------------------------------------------------------------------------


async def run_all(plan: Plan, skip_jupyter: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"tirl": await bench_tirl(plan), "fresh": await bench_fresh(plan)}
    if not skip_jupyter:
        results["jupyter"] = await bench_jupyter(plan)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke run")
    ap.add_argument("--skip-jupyter", action="store_true", help="leave out the Jupyter baseline")
    ap.add_argument("--sessions", type=int, help="live tirl sessions for the memory measurement")
    default_out = str(Path(tempfile.gettempdir(), "tirl_bench_sandbox.json"))
    ap.add_argument("--out", default=default_out, help="JSON file for all raw numbers")
    args = ap.parse_args()
    plan = QUICK if args.quick else FULL
    if args.sessions is not None:
        plan = Plan(**{**asdict(plan), "sessions": args.sessions})
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    try:
        results = asyncio.run(run_all(plan, args.skip_jupyter))
    except KeyboardInterrupt:
        print(
            "interrupted: every sandbox, kernel and process it started was stopped", file=sys.stderr
        )
        sys.exit(130)
    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    results |= {"quick": args.quick, "seconds": time.perf_counter() - t0, "plan": asdict(plan)}
    results["targets"] = targets(results)
    print_report(results)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\nraw numbers: {args.out}")


if __name__ == "__main__":
    main()
