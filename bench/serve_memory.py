"""Memory of `tirl serve` under issue 43's loads: peak and idle RSS, and what failed.

    python bench/serve_memory.py [--model tiny|smollm2-135m-instruct|FOLDER]
                                 [--s5-prompts 64] [--s5-len N] [--big-prompt 3000]
                                 [--mem-cap-gb 10] [--before REV] [--kv-cache-tokens N]

Each scenario runs on a fresh `tirl serve` subprocess (127.0.0.1, a port the OS picks), its
address space capped at `--mem-cap-gb` (RLIMIT_AS, set in the child before it starts: the
old code would otherwise take the machine's memory, as it did the user's):

- S5, a big batch: one POST /v1/completions with `--s5-prompts` prompts of `--s5-len` token
  ids (default: the context - 1) and max_tokens 1; then 5 s idle; then 200 small requests
  (16 ids, max_tokens 16, 64 at a time).
- S6, a long prompt after a burst: 64 small requests at once, then one prompt of
  `--big-prompt` ids with max_tokens 1; then 5 s idle; then the 200 small requests.
- S3, one request stalls everyone: a prompt of `--stall-prompt` ids (default 5,145, the
  issue's 1,024 empty chat messages; at most the context - 2) with max_tokens 1, and a small
  request (max_tokens 2) sent 2 s later: how long the small one waits. Then the same long
  prompt again, its client leaving after 3 s, and a small request 1 s after that.

Reported per scenario: the server's peak RSS over the scenario (VmHWM, reset through
/proc/PID/clear_refs at its start), its RSS at start (after one small request, so that the
weights are resident) and after the idle pause (VmRSS), the
big request's status, and the small requests that failed (non-200, or no answer: a server
killed mid-way is "killed"). `--before REV` runs the same scenarios against `tirl serve` of
commit REV, from a git worktree (removed afterwards), on the same machine in the same run.

`tiny` is a from-scratch 2-layer model with a 4,096-position context (1 KB of KV a
position), built into a temporary folder; a shipped name is resolved by `tirl.models.sources`
(SmolLM2-135M: 8,192 positions, 45 KB of KV a position in float32). Prefill of near-context
prompts costs minutes per scenario for SmolLM2 on two cores: scale `--s5-prompts` and
`--s5-len` to the time you have. Nothing but 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
SMALL_IDS, SMALL_MAX_TOKENS, SMALL_REQUESTS, SMALL_AT_ONCE = 16, 16, 200, 64
IDLE_S = 5.0
GiB = 2**30


@dataclass
class Result:
    code: str
    scenario: str
    start_rss: float = 0.0
    peak_rss: float = 0.0
    idle_rss: float = 0.0
    big_status: str = ""
    big_s: float = 0.0
    small_failed: int = 0
    statuses: dict = field(default_factory=dict)
    killed: str = ""
    first_error: str = ""
    small_wait_s: float = 0.0  # S3: a small request sent while a long prompt is prefilled
    after_leave_s: float = 0.0  # S3: one sent after the long prompt's client left


def _ids(n: int, seed: int) -> list[int]:
    """`n` token ids below 250 (every model here has a larger vocabulary), varied by `seed`."""
    return [5 + (seed * 7919 + i * 31) % 245 for i in range(n)]


def _status(pid: int, field_name: str) -> float:
    """A VmRSS / VmHWM line of /proc/PID/status, in GiB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024 / GiB
    except OSError:
        pass
    return 0.0


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


class Server:
    """`tirl serve` of `model` from `src` (a checkout's src folder), its address space capped."""

    def __init__(self, src: Path, model: str, cap_bytes: int, extra: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

        env = {**os.environ, "PYTHONPATH": str(src)}
        cmd = [sys.executable, "-m", "tirl.cli", "serve", model, "--port", "0", *extra]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, preexec_fn=cap
        )
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError(f"tirl serve did not start: {line}{self.log.read()[-3000:]}")
        self.url = line.strip().rsplit(" ", 1)[1]

    def died(self) -> str:
        code = self.proc.poll()
        return "" if code is None else f"killed (exit {code})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


ERRORS: list[str] = []  # the first error message of each scenario, for the report


async def _post(http: aiohttp.ClientSession, url: str, body: dict) -> str:
    try:
        async with http.post(f"{url}/v1/completions", json=body) as r:
            text = await r.text()
            if r.status != 200 and not ERRORS:
                ERRORS.append(f"{r.status}: {text[:300]}")
            return str(r.status)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        if not ERRORS:
            ERRORS.append(f"{type(e).__name__}: {e}")
        return type(e).__name__


async def _smalls(http, url: str, count: int, at_once: int, seed: int) -> list[str]:
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> str:
        async with gate:
            body = {"prompt": _ids(SMALL_IDS, seed + i), "max_tokens": SMALL_MAX_TOKENS}
            return await _post(http, url, body)

    return await asyncio.gather(*(one(i) for i in range(count)))


async def _scenario(server: Server, result: Result, big_body: dict, burst_first: bool) -> None:
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    async with aiohttp.ClientSession(trust_env=False, timeout=timeout) as http:
        # One small request first: the weights' pages are resident from then on (the idle
        # level every later RSS is compared with).
        await _smalls(http, server.url, 1, 1, 10**7)
        await asyncio.sleep(1.0)
        result.start_rss = _status(server.proc.pid, "VmRSS")
        _reset_peak(server.proc.pid)
        if burst_first:  # S6: 64 small requests at once before the long prompt
            burst = await _smalls(http, server.url, SMALL_AT_ONCE, SMALL_AT_ONCE, 10**6)
            result.small_failed += sum(s != "200" for s in burst)
        start = time.perf_counter()
        result.big_status = await _post(http, server.url, big_body)
        result.big_s = time.perf_counter() - start
        await asyncio.sleep(IDLE_S)
        result.idle_rss = _status(server.proc.pid, "VmRSS")
        result.peak_rss = _status(server.proc.pid, "VmHWM")
        after = await _smalls(http, server.url, SMALL_REQUESTS, SMALL_AT_ONCE, 0)
        result.small_failed += sum(s != "200" for s in after)
        for s in after:
            result.statuses[s] = result.statuses.get(s, 0) + 1
        result.peak_rss = max(result.peak_rss, _status(server.proc.pid, "VmHWM"))
    result.killed = server.died()


async def _timed(http, url: str, body: dict) -> tuple[str, float]:
    start = time.perf_counter()
    status = await _post(http, url, body)
    return status, time.perf_counter() - start


async def _stall(server: Server, result: Result, long_ids: list[int]) -> None:
    small = {"prompt": _ids(SMALL_IDS, 3), "max_tokens": 2}
    timeout = aiohttp.ClientTimeout(total=6 * 3600)
    async with aiohttp.ClientSession(trust_env=False, timeout=timeout) as http:
        await _smalls(http, server.url, 1, 1, 10**7)  # warm, as in the other scenarios
        long = asyncio.ensure_future(
            _timed(http, server.url, {"prompt": long_ids, "max_tokens": 1})
        )
        await asyncio.sleep(2.0)
        status, result.small_wait_s = await _timed(http, server.url, small)
        result.small_failed += status != "200"
        result.big_status, result.big_s = await long
        leaving = asyncio.ensure_future(_post(http, server.url, {"prompt": long_ids}))
        await asyncio.sleep(3.0)
        leaving.cancel()  # the client hangs up: its connection closes
        await asyncio.sleep(1.0)
        status, result.after_leave_s = await _timed(http, server.url, small)
        result.small_failed += status != "200"
    result.killed = server.died()


def run_scenario(code: str, src: Path, model: str, args, name: str, extra: list[str]) -> Result:
    result = Result(code, name)
    ERRORS.clear()
    server = Server(src, model, int(args.mem_cap_gb * GiB), extra)
    try:
        if name == "S3":
            asyncio.run(_stall(server, result, _ids(args.stall_prompt, 2)))
        elif name == "S5":
            prompts = [_ids(args.s5_len, i) for i in range(args.s5_prompts)]
            body = {"prompt": prompts, "max_tokens": 1}
            asyncio.run(_scenario(server, result, body, burst_first=False))
        else:
            body = {"prompt": _ids(args.big_prompt, 1), "max_tokens": 1}
            asyncio.run(_scenario(server, result, body, burst_first=True))
    finally:
        server.stop()
    result.first_error = ERRORS[0] if ERRORS else ""
    return result


def tiny_model_folder(folder: Path, positions: int = 4096) -> str:
    from tirl.models.saved import save_policy
    from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer

    texts = [f"Compute {a} * {b} mod 997." for a in range(50) for b in range(20)]
    tokenizer = train_tokenizer(texts, vocab_size=384)
    spec = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=positions)
    save_policy(build_model(tokenizer, spec, seed=0), tokenizer, folder)
    return str(folder)


def _context(folder: str) -> int:
    return json.loads((Path(folder) / "config.json").read_text())["max_position_embeddings"]


def _row(r: Result) -> str:
    if r.scenario == "S3":
        return (
            f"| {r.code} | S3 | {r.big_status} ({r.big_s:.0f} s) | {r.small_wait_s:.1f} s"
            f" | {r.after_leave_s:.1f} s | {r.small_failed}/2 | {r.killed or 'alive'} |"
        )
    small = f"{r.small_failed}/{SMALL_REQUESTS + (SMALL_AT_ONCE if r.scenario == 'S6' else 0)}"
    return (
        f"| {r.code} | {r.scenario} | {r.start_rss:.2f} | {r.peak_rss:.2f} | {r.idle_rss:.2f}"
        f" | {r.big_status} ({r.big_s:.0f} s) | {small} | {r.killed or 'alive'} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--s5-prompts", type=int, default=64)
    p.add_argument("--s5-len", type=int, default=None, help="default: the context - 1")
    p.add_argument("--big-prompt", type=int, default=3000)
    p.add_argument("--stall-prompt", type=int, default=5145)
    p.add_argument("--mem-cap-gb", type=float, default=10.0)
    p.add_argument("--before", default=None, help="a commit to compare against")
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="passed to this checkout's")
    p.add_argument("--scenarios", default="S5,S6")
    args = p.parse_args()

    from tirl.models.sources import model_folder

    with tempfile.TemporaryDirectory() as tmp:
        model = (
            tiny_model_folder(Path(tmp) / "tiny")
            if args.model == "tiny"
            else model_folder(args.model)
        )
        args.s5_len = args.s5_len or _context(model) - 1
        args.stall_prompt = min(args.stall_prompt, _context(model) - 2)
        codes = [("after", REPO / "src", [])]
        if args.kv_cache_tokens:
            codes[0][2].extend(["--kv-cache-tokens", str(args.kv_cache_tokens)])
        if args.before:
            tree = Path(tmp) / "before"
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(REPO),
                    "worktree",
                    "add",
                    "-q",
                    "--detach",
                    str(tree),
                    args.before,
                ],
                check=True,
            )
            codes.insert(0, (f"before ({args.before})", tree / "src", []))
        load = os.getloadavg()
        print(
            f"model {args.model}; S5: {args.s5_prompts} prompts x {args.s5_len} ids, max_tokens 1;"
            f" S6: {SMALL_AT_ONCE} small, then {args.big_prompt} ids; RLIMIT_AS"
            f" {args.mem_cap_gb:g} GiB; load average {load[0]:.1f}, {os.cpu_count()} CPUs",
            flush=True,
        )
        results = []
        try:
            for scenario in args.scenarios.split(","):
                for code, src, extra in codes:
                    results.append(run_scenario(code, src, model, args, scenario, extra))
                    print(_row(results[-1]), flush=True)
                    if results[-1].first_error:
                        print(f"  first error: {results[-1].first_error}", flush=True)
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)])
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    memory = [r for r in results if r.scenario != "S3"]
    if memory:
        print(
            "| code | scenario | RSS at start (GiB) | peak RSS (GiB) | RSS idle after (GiB) |"
            " big request | small failed | server |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(_row(r) for r in memory))
    stalls = [r for r in results if r.scenario == "S3"]
    if stalls:
        print(
            "| code | scenario | long prompt | small request sent 2 s in: its latency |"
            " small request sent 1 s after the long one's client left | small failed | server |"
        )
        print("|---|---|---|---|---|---|---|")
        print("\n".join(_row(r) for r in stalls))


if __name__ == "__main__":
    main()
