"""Discrete-event simulation of one RL rollout phase on a cluster of inference replicas.

Pure Python, seeded, deterministic (a `heapq` of events, no wall clock, no I/O). It compares
four ways to schedule the same agentic workload, the ladder of AgentMath's infrastructure
ablation (`shared/papers/002`, "训练效率": 1.5-1.8x async, 3.0-3.3x + partial rollouts,
4-5x + prefix-aware load balancing, over a 3600-4000 s batch-synchronous step):

1. `sync`: static batches per replica; a batch decodes turn by turn in lockstep, waits for
   its slowest member, and every tool call blocks the whole batch (the accelerator idles
   while code runs). This is ToRL-style synchronous rounds.
2. `async`: request-level scheduling with continuous batching. Each trajectory is its own
   request; it joins the running batch at any decode step and leaves it when it issues a
   tool call (its slot frees, its KV cache stays parked on the replica until evicted).
   Trajectories are pinned to replicas round-robin.
3. `async+partial`: as 2, plus segment budgets: a trajectory stops for this step after
   `seg_tokens` generated tokens or before its `seg_calls + 1`-th tool call in the step, and
   goes on in the next step (AgentMath's tau = tau^(1) + tau^(2) + ...). The weights change
   between steps, so a carried trajectory re-prefills its whole context (AReaL recomputes
   stale KV the same way). Step time is measured in steady state, after `warmup` steps.
4. `async+partial+router`: as 3, plus prefix-aware weighted load balancing: a request j
   weighs w_j = floor(L_j / L_base) + w_base (L_j = its context length at dispatch, AgentMath
   §4) and goes to the least-loaded replica; a trajectory returning from a tool is sticky to
   the replica that holds its KV cache unless that replica's load exceeds the least-loaded
   one's by `rebalance_threshold`, in which case it moves and pays a full re-prefill.

`Schedule(router="round_robin_per_turn")` is an extra baseline for the router: every turn is
a new request sent to the next replica in turn, re-prefilling its whole context (AReaL's TIR
example makes a new request id per turn).

Cost model (per replica): a prefill costs `prefill_per_token_s` per token and runs alone (no
decoding meanwhile); a decode step makes one token for every running trajectory and takes
`decode_base_s + decode_per_seq_s * batch_size`. At most `max_batch` trajectories run at once.
KV capacity: a running trajectory reserves its context plus the tokens it will generate
before it next leaves the batch (the simulator knows them; a real engine would preempt
instead); parked caches of trajectories in a tool call fill the rest and are evicted LRU.
In `sync` a static batch is admitted only if its members' final contexts fit together.

Workload (per step, `prompts_per_step * samples_per_prompt` new trajectories): response
length lognormal, clipped to [response_min, response_max]; tool calls ~ length /
tokens_per_call times a lognormal factor, clipped to max_calls; the response is cut into
calls + 1 decode chunks at uniformly random points. Tool outputs are lognormal token counts.
Tool latency is a mixture: small sympy cells (0.44 ms p50 measured by `bench/sandbox.py`),
heavy cells (~5 ms), and a Pareto tail from `tail_min_s` up to the tool timeout (stands for
timeouts, heavy computation and a loaded sandbox cluster; AgentMath reports 1.2 s per call
on theirs). All random draws are made when the workload is built, so every schedule sees
exactly the same trajectories.

Defaults and why (all printed by `bench/rollout.py`; none was tuned to hit a speed-up):
- workload: AgentMath's RL stage, 64 prompts x 8 samples per step, response and tool budgets
  up to 96k tokens / 96 calls; response lognormal(median 12k, sigma 0.9), mean ~18k before
  clipping (AgentMath's is larger: a 4k cut is ~14% there, so ~25-29k); ~1 call per 1k
  tokens (96 calls in 96k); tool outputs lognormal(median 80 tokens), prompts 600 tokens.
- tool latency: 85% small cells lognormal(0.5 ms), 13% heavy cells lognormal(5 ms) (this
  repo's sandbox, `BENCHMARKS.md`), 2% Pareto(alpha 1.5) from 0.5 s, capped at a 30 s timeout.
- cost: a replica is an order-of-magnitude 4-GPU engine for an 8B model: decode step
  20 ms + 0.25 ms per sequence, prefill 50k tokens/s, max batch 128, 1.5M KV tokens
  (8B with GQA ~ 0.15 MB/token); 8 replicas.
- segments: 24k tokens / 24 calls (AgentMath splits 96k / 96 into up to 4 segments); router
  L_base 4096, w_base 1, rebalance threshold 32 weight units (about 8 typical requests).

Not modelled: attention cost growing with context, chunked prefill overlapping decode,
trainer time between steps, network transfer of KV on migration, staleness limits.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields

SCHEDULES = ("sync", "async", "async+partial", "async+partial+router")


@dataclass(frozen=True)
class CostModel:
    """One replica = one inference engine (e.g. an 8-GPU node serving an 8B / 30B-A3B model)."""

    decode_base_s: float = 0.020  # a: per decode step, batch-independent (weights read)
    decode_per_seq_s: float = 0.00025  # b: per running sequence per step
    prefill_per_token_s: float = 0.00002  # 50k tokens/s prefill
    max_batch: int = 128
    kv_capacity_tokens: int = 1_500_000


@dataclass(frozen=True)
class LatencySpec:
    """Tool-call latency mixture (seconds); weights of fast/heavy, the rest is the tail."""

    fast_p: float = 0.85
    fast_median_s: float = 0.0005
    fast_sigma: float = 0.8
    heavy_p: float = 0.13
    heavy_median_s: float = 0.005
    heavy_sigma: float = 0.5
    tail_min_s: float = 0.5
    tail_alpha: float = 1.5
    timeout_s: float = 30.0

    def draw(self, rng: random.Random) -> float:
        u = rng.random()
        if u < self.fast_p:
            return min(
                self.timeout_s, rng.lognormvariate(math.log(self.fast_median_s), self.fast_sigma)
            )
        if u < self.fast_p + self.heavy_p:
            x = rng.lognormvariate(math.log(self.heavy_median_s), self.heavy_sigma)
            return min(self.timeout_s, x)
        return min(self.timeout_s, self.tail_min_s * rng.paretovariate(self.tail_alpha))


@dataclass(frozen=True)
class WorkloadSpec:
    """AgentMath-like: batch 64 x 8 samples, contexts up to 96k, up to 96 tool calls."""

    prompts_per_step: int = 64
    samples_per_prompt: int = 8
    prompt_tokens: int = 600
    response_median: int = 12_000
    response_sigma: float = 0.9
    response_min: int = 256
    response_max: int = 96_000
    tokens_per_call: int = 1_000
    calls_sigma: float = 0.5
    max_calls: int = 96
    tool_output_median: int = 80
    tool_output_max: int = 1_000
    latency: LatencySpec = field(default_factory=LatencySpec)


@dataclass(frozen=True)
class Schedule:
    name: str
    mode: str = "async"  # "sync" | "async"
    partial: bool = False
    seg_tokens: int = 24_000  # AgentMath: 96k context in 4 segments
    seg_calls: int = 24  # 96 calls in 4 segments
    # "round_robin": pinned to a replica per step (sticky, load-blind);
    # "round_robin_per_turn": every turn is a new request, next replica in turn (not sticky);
    # "prefix_aware": weighted least-load with sticky sessions and rebalancing
    router: str = "round_robin"
    l_base: int = 4_096
    w_base: int = 1
    rebalance_threshold: int = 32  # weight units (about 8 typical trajectories)


def standard_schedules(**overrides) -> list[Schedule]:
    """The four configurations of the comparison, in order; overrides apply to all of them."""
    return [
        Schedule("sync", mode="sync", **overrides),
        Schedule("async", **overrides),
        Schedule("async+partial", partial=True, **overrides),
        Schedule("async+partial+router", partial=True, router="prefix_aware", **overrides),
    ]


@dataclass(frozen=True)
class SimTrajectory:
    """What the policy will produce; decided up front so every schedule sees the same work."""

    tid: int
    prompt_tokens: int
    chunks: tuple[int, ...]  # decode tokens per turn; len = calls + 1
    tool_outputs: tuple[int, ...]  # tokens appended by each tool call
    tool_latencies: tuple[float, ...]  # seconds

    @property
    def tokens(self) -> int:
        return sum(self.chunks)

    @property
    def calls(self) -> int:
        return len(self.tool_outputs)

    @property
    def final_context(self) -> int:
        return self.prompt_tokens + self.tokens + sum(self.tool_outputs)


def make_trajectories(spec: WorkloadSpec, seed: int, step: int) -> list[SimTrajectory]:
    rng = random.Random(seed * 1_000_003 + step)
    out = []
    for i in range(spec.prompts_per_step * spec.samples_per_prompt):
        length = rng.lognormvariate(math.log(spec.response_median), spec.response_sigma)
        length = int(min(spec.response_max, max(spec.response_min, length)))
        calls = length / spec.tokens_per_call * rng.lognormvariate(0.0, spec.calls_sigma)
        calls = min(spec.max_calls, int(round(calls)), length - 1)
        cuts = sorted(rng.sample(range(1, length), calls)) if calls else []
        bounds = [0, *cuts, length]
        chunks = tuple(bounds[k + 1] - bounds[k] for k in range(calls + 1))
        outs = tuple(
            min(
                spec.tool_output_max,
                max(1, int(rng.lognormvariate(math.log(spec.tool_output_median), 0.7))),
            )
            for _ in range(calls)
        )
        lats = tuple(spec.latency.draw(rng) for _ in range(calls))
        out.append(SimTrajectory(step * 1_000_000 + i, spec.prompt_tokens, chunks, outs, lats))
    return out


@dataclass
class StepStats:
    time_s: float
    busy_s: float  # summed over replicas
    tokens: int  # decode tokens generated in this step
    idle_share: float


@dataclass
class SimResult:
    schedule: str
    steps: list[StepStats]
    warmup: int
    ledger: dict[int, list[int]]  # tid -> [tokens generated, tool calls executed]
    expected: dict[int, tuple[int, int]]  # tid -> (tokens, calls) of the trajectory
    max_batch_seen: int
    max_kv_seen: int
    migrations: int
    replicas: int = 1
    n_steps: int = 0  # steps that admitted new prompts; later ones only drain carried work

    @property
    def measured(self) -> list[StepStats]:
        return self.steps[self.warmup : self.n_steps]

    @property
    def mean_step_s(self) -> float:
        m = self.measured
        return sum(s.time_s for s in m) / len(m)

    @property
    def idle_share(self) -> float:
        m = self.measured
        t = sum(s.time_s for s in m)
        return (1.0 - sum(s.busy_s for s in m) / (t * self.replicas)) if t > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        m = self.measured
        return sum(s.tokens for s in m) / sum(s.time_s for s in m)


class _Run:
    """A trajectory's progress."""

    __slots__ = (
        "traj", "chunk", "in_chunk", "calls", "context", "unprefilled", "seg_tokens",
        "seg_calls", "replica", "tool_pending", "reservation", "weight",
    )  # fmt: skip

    def __init__(self, traj: SimTrajectory):
        self.traj = traj
        self.chunk = 0
        self.in_chunk = 0
        self.calls = 0
        self.context = traj.prompt_tokens
        self.unprefilled = traj.prompt_tokens
        self.seg_tokens = 0
        self.seg_calls = 0
        self.replica: int | None = None
        self.tool_pending = False
        self.reservation = 0
        self.weight = 0


class _Replica:
    def __init__(self, rid: int):
        self.rid = rid
        self.running: list[_Run] = []
        self.queue: deque[_Run] = deque()
        self.parked: OrderedDict[int, int] = OrderedDict()  # tid -> cached tokens (LRU)
        self.parked_total = 0
        self.reserved = 0
        self.decode_from = 0.0
        self.dt = 0.0
        self.planned = 0  # decode steps until the scheduled boundary
        self.version = 0
        self.scheduled = False
        self.busy = 0.0
        self.load = 0


_BOUNDARY, _TOOL_DONE = 0, 1


class Simulator:
    """Runs `n_steps` trainer steps of one schedule; see the module docstring for the model."""

    def __init__(self, workload: WorkloadSpec, cost: CostModel, schedule: Schedule, replicas: int):
        self.w, self.c, self.s, self.R = workload, cost, schedule, replicas
        self.ledger: dict[int, list[int]] = {}
        self.expected: dict[int, tuple[int, int]] = {}
        self.max_batch_seen = 0
        self.max_kv_seen = 0
        self.migrations = 0
        self.tokens_this_step = 0

    # -- entry point --------------------------------------------------------------------------
    def run(
        self,
        seed: int,
        n_steps: int,
        warmup: int = 0,
        drain: bool = False,
        trajectories: list[list[SimTrajectory]] | None = None,
    ) -> SimResult:
        steps: list[StepStats] = []
        carried: list[_Run] = []
        step = 0
        while step < n_steps or (drain and carried):
            if trajectories is not None:
                new = trajectories[step] if step < len(trajectories) else []
            else:
                new = make_trajectories(self.w, seed, step) if step < n_steps else []
            for t in new:
                cap = self.c.kv_capacity_tokens
                assert t.final_context <= cap, "a trajectory must fit one replica's KV cache"
                self.ledger[t.tid] = [0, 0]
                self.expected[t.tid] = (t.tokens, t.calls)
            runs = carried + [_Run(t) for t in new]
            self.tokens_this_step = 0
            if self.s.mode == "sync":
                time_s, busy = self._sync_step(runs)
                carried = []
            else:
                time_s, busy, carried = self._async_step(runs)
            idle = 1.0 - busy / (self.R * time_s) if time_s > 0 else 0.0
            steps.append(StepStats(time_s, busy, self.tokens_this_step, idle))
            step += 1
        res = SimResult(
            self.s.name,
            steps,
            min(warmup, max(0, n_steps - 1)),
            self.ledger,
            self.expected,
            self.max_batch_seen,
            self.max_kv_seen,
            self.migrations,
            self.R,
            n_steps,
        )
        return res

    # -- (1) batch-synchronous ----------------------------------------------------------------
    def _sync_step(self, runs: list[_Run]) -> tuple[float, float]:
        c = self.c
        per_replica: list[list[SimTrajectory]] = [[] for _ in range(self.R)]
        for i, r in enumerate(runs):
            per_replica[i % self.R].append(r.traj)
        busy_total, makespan = 0.0, 0.0
        for trajs in per_replica:
            t = busy = 0.0
            k = 0
            while k < len(trajs):  # static batches, greedy in order, batch size and KV bound
                batch, kv = [], 0
                while k < len(trajs) and len(batch) < c.max_batch:
                    if batch and kv + trajs[k].final_context > c.kv_capacity_tokens:
                        break
                    kv += trajs[k].final_context
                    batch.append(trajs[k])
                    k += 1
                self.max_batch_seen = max(self.max_batch_seen, len(batch))
                self.max_kv_seen = max(self.max_kv_seen, kv)
                for turn in range(max(len(b.chunks) for b in batch)):
                    members = [b for b in batch if turn < len(b.chunks)]
                    if turn == 0:
                        pre = sum(b.prompt_tokens for b in members)
                    else:
                        pre = sum(b.tool_outputs[turn - 1] for b in members)
                    d = self._lockstep_decode([b.chunks[turn] for b in members])
                    busy += pre * c.prefill_per_token_s + d
                    t += pre * c.prefill_per_token_s + d
                    lats = [b.tool_latencies[turn] for b in members if turn < b.calls]
                    t += max(lats, default=0.0)  # the whole batch waits for its slowest call
                    for b in members:
                        self.ledger[b.tid][0] += b.chunks[turn]
                        self.tokens_this_step += b.chunks[turn]
                        if turn < b.calls:
                            self.ledger[b.tid][1] += 1
            busy_total += busy
            makespan = max(makespan, t)
        return makespan, busy_total

    def _lockstep_decode(self, lengths: list[int]) -> float:
        """Time for a batch decoding in lockstep; a member leaves when its chunk is done."""
        t, done, active = 0.0, 0, len(lengths)
        for n in sorted(lengths):
            t += (n - done) * (self.c.decode_base_s + self.c.decode_per_seq_s * active)
            done, active = n, active - 1
        return t

    # -- (2)-(4) request-level async -----------------------------------------------------------
    def _async_step(self, runs: list[_Run]) -> tuple[float, float, list[_Run]]:
        self.reps = [_Replica(i) for i in range(self.R)]
        self.heap: list[tuple] = []
        self.seq = 0
        self.pending = len(runs)
        self.carried: list[_Run] = []
        self.last = 0.0
        for i, r in enumerate(runs):  # new step: weights changed, every cache is stale
            r.seg_tokens = r.seg_calls = 0
            r.unprefilled = r.context
            r.weight = 0
            # carried trajectories are re-dispatched like new ones: their cache is stale anyway
            r.replica = None if self.s.router == "prefix_aware" else i % self.R
        self.rr_next = len(runs) % self.R
        # largest first, so the router places the heavy carried trajectories before new ones
        order = sorted(runs, key=lambda r: -r.context) if self.s.router == "prefix_aware" else runs
        for r in order:
            if r.tool_pending:
                r.tool_pending = False
                self._start_tool(r, 0.0)
            else:
                self._dispatch(r, 0.0, resume=False)
        while self.pending and self.heap:
            t, _, kind, obj, version = heapq.heappop(self.heap)
            if kind == _BOUNDARY:
                if version == obj.version:
                    self._boundary(obj, t)
            else:
                self._dispatch(obj, t, resume=True)
        assert self.pending == 0, "simulation stalled"
        busy = sum(rep.busy for rep in self.reps)
        return self.last, busy, self.carried

    def _push(self, t: float, kind: int, obj, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, version))

    def _start_tool(self, r: _Run, t: float) -> None:
        self._push(t + r.traj.tool_latencies[r.calls], _TOOL_DONE, r)

    def _dispatch(self, r: _Run, t: float, resume: bool) -> None:
        """A trajectory is ready to decode (new, or back from a tool): pick a replica, queue it."""
        if resume:  # back from a tool call
            r.context += r.traj.tool_outputs[r.calls]
            r.unprefilled += r.traj.tool_outputs[r.calls]
            r.calls += 1
            r.seg_calls += 1
            self.ledger[r.traj.tid][1] += 1
        if self.s.router == "prefix_aware":
            self._route(r, resume)
        elif resume and self.s.router == "round_robin_per_turn":
            self._drop_cache(self.reps[r.replica], r)
            r.unprefilled = r.context
            r.replica = self.rr_next
            self.rr_next = (self.rr_next + 1) % self.R
        rep = self.reps[r.replica]
        rep.queue.append(r)
        self._wake(rep, t)

    def _route(self, r: _Run, sticky: bool) -> None:
        loads = [rep.load for rep in self.reps]
        if r.replica is not None and r.weight:
            loads[r.replica] -= r.weight
        least = min(range(self.R), key=lambda i: (loads[i], i))
        target = least
        if sticky and r.replica is not None:
            if loads[r.replica] - loads[least] <= self.s.rebalance_threshold:
                target = r.replica
            else:
                self.migrations += 1
                self._drop_cache(self.reps[r.replica], r)
                r.unprefilled = r.context
        if r.replica is not None and r.weight:
            self.reps[r.replica].load -= r.weight
        r.weight = r.context // self.s.l_base + self.s.w_base
        r.replica = target
        self.reps[target].load += r.weight

    def _drop_cache(self, rep: _Replica, r: _Run) -> None:
        n = rep.parked.pop(r.traj.tid, None)
        if n is not None:
            rep.parked_total -= n

    def _wake(self, rep: _Replica, t: float) -> None:
        """New work at time t: make the replica admit it at its next decode-step boundary."""
        if not rep.scheduled:
            self._boundary(rep, t)
            return
        if t <= rep.decode_from:
            steps = 0  # still prefilling: admit right after
        else:
            steps = min(rep.planned, math.ceil((t - rep.decode_from) / rep.dt - 1e-9))
        if steps < rep.planned:
            rep.planned = steps
            rep.version += 1
            self._push(rep.decode_from + steps * rep.dt, _BOUNDARY, rep, rep.version)

    def _remaining(self, r: _Run) -> int:
        rem = r.traj.chunks[r.chunk] - r.in_chunk
        if self.s.partial:
            rem = min(rem, self.s.seg_tokens - r.seg_tokens)
        return rem

    def _boundary(self, rep: _Replica, t: float) -> None:
        c = self.c
        if rep.scheduled and rep.planned:  # apply the decode steps made since decode_from
            k = rep.planned
            rep.busy += k * rep.dt
            for r in rep.running:
                r.in_chunk += k
                r.seg_tokens += k
                r.context += k
                self.ledger[r.traj.tid][0] += k
            self.tokens_this_step += k * len(rep.running)
        still = []
        for r in rep.running:
            if self._remaining(r) > 0:
                still.append(r)
                continue
            rep.reserved -= r.reservation
            r.reservation = 0
            self._leave(rep, r, t)
        rep.running = still
        # admit FIFO while a slot and KV space are free
        prefill = 0
        while rep.queue and len(rep.running) < c.max_batch:
            r = rep.queue[0]
            cached = rep.parked.get(r.traj.tid)
            if cached is None:
                r.unprefilled = r.context
            need = r.context + self._remaining(r)
            free = c.kv_capacity_tokens - rep.reserved - rep.parked_total + (cached or 0)
            while free < need and len(rep.parked) > (1 if cached is not None else 0):
                tid, n = next(kv for kv in rep.parked.items() if kv[0] != r.traj.tid)
                del rep.parked[tid]
                rep.parked_total -= n
                free += n
            if free < need:
                break
            rep.queue.popleft()
            self._drop_cache(rep, r)
            prefill += r.unprefilled
            r.unprefilled = 0
            r.reservation = need
            rep.reserved += need
            rep.running.append(r)
        self.max_batch_seen = max(self.max_batch_seen, len(rep.running))
        self.max_kv_seen = max(self.max_kv_seen, rep.reserved + rep.parked_total)
        p = prefill * c.prefill_per_token_s
        rep.busy += p
        rep.decode_from = t + p
        rep.version += 1
        if rep.running:
            rep.dt = c.decode_base_s + c.decode_per_seq_s * len(rep.running)
            rep.planned = min(self._remaining(r) for r in rep.running)
            rep.scheduled = True
            self._push(rep.decode_from + rep.planned * rep.dt, _BOUNDARY, rep, rep.version)
        elif rep.queue:  # cannot happen: an empty replica always fits one trajectory
            raise AssertionError("replica cannot admit any trajectory")
        else:
            rep.scheduled = False
            rep.planned = 0

    def _leave(self, rep: _Replica, r: _Run, t: float) -> None:
        """r has no tokens left to decode before its next event: finish, pause or call a tool."""
        traj = r.traj
        if r.in_chunk == traj.chunks[r.chunk]:
            if r.chunk == traj.calls:  # last chunk: done
                self._retire(rep, r, t, carried=False)
                return
            r.chunk += 1
            r.in_chunk = 0
            r.tool_pending = True
        seg_done = self.s.partial and (
            r.seg_tokens >= self.s.seg_tokens
            or (r.tool_pending and r.seg_calls >= self.s.seg_calls)
        )
        if seg_done:
            self._retire(rep, r, t, carried=True)
            return
        r.tool_pending = False
        rep.parked[traj.tid] = r.context  # the cache stays on the replica while the tool runs
        rep.parked_total += r.context
        self._start_tool(r, t)

    def _retire(self, rep: _Replica, r: _Run, t: float, carried: bool) -> None:
        self.pending -= 1
        self.last = max(self.last, t)
        rep.load -= r.weight
        r.weight = 0
        if carried:
            self.carried.append(r)


def simulate(
    schedule: Schedule,
    workload: WorkloadSpec | None = None,
    cost: CostModel | None = None,
    *,
    replicas: int = 8,
    seed: int = 0,
    n_steps: int = 1,
    warmup: int = 0,
    drain: bool = False,
    trajectories: list[list[SimTrajectory]] | None = None,
) -> SimResult:
    """Simulate `n_steps` trainer steps; `trajectories` (one list per step) overrides the
    generated workload; `drain` keeps stepping without new prompts until nothing is carried."""
    sim = Simulator(workload or WorkloadSpec(), cost or CostModel(), schedule, replicas)
    return sim.run(seed, n_steps, warmup, drain, trajectories)


def describe(obj) -> list[tuple[str, object]]:
    """(name, value) pairs of a parameter dataclass, nested ones flattened, for printing."""
    out = []
    for f in fields(obj):
        v = getattr(obj, f.name)
        if hasattr(v, "__dataclass_fields__"):
            out += [(f"{f.name}.{k}", x) for k, x in describe(v)]
        else:
            out.append((f.name, v))
    return out
