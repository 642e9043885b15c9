"""Route trajectories across several engine replicas: prefix-aware load, sticky keys, failover.

`Router` has the engine interface (`generate(key, feed_ids, ...)`, `release(key)`,
`close`/`aclose`), so `Rollout(Router([...]), tokenizer, sandbox)` runs unchanged over many
`HFEngine`s or `OpenAIEngine`s (one per server).

Load (AgentMath §4, "前缀感知加权负载均衡", prefix-aware weighted load balancing): a request
whose key has a prefix of L_j tokens so far (everything fed and generated before, plus this
feed) weighs

    w_j = floor(L_j / l_base) + w_base,

and a replica's load is the sum of the weights of the requests in flight on it. Long prefixes
cost more per decoding step (attention over the cache), so they count for more.

Stickiness: a key's first request goes to the least-loaded replica (ties: the replica holding
the fewest keys' state, then the lowest index). Later requests of the key go back to the same
replica, because its KV cache (HF) or prefix cache (servers) lives there, unless staying is
clearly worse. With `home` the key's replica, `best` the least-loaded live one and w this
request's weight, the key moves iff

    load[home] + w > rebalance_ratio * (load[best] + w) + w_base.

Counting w on both sides makes a long-prefix key harder to move: a move re-prefills its whole
prefix on the new replica, which costs in proportion to w. On a move the router feeds the new
replica the key's full token history (it keeps one per key) and releases the key on the old one.

The sticky table is an LRU of at most `max_sticky` keys; an evicted idle key is released on its
replica and, at its next request, re-fed whole to whichever replica is least loaded.

Failover: a replica whose `generate` raises is marked dead and the request is retried, with the
key's full history, on the other replicas (least-loaded first); keys that lived on it move at
their next request. Only when every replica has failed the request does its error reach the
caller. Dead replicas are tried again only when no live one is left (one that then answers is
live again). The partial output of a failed request is lost, so with temperature > 0 the
retried continuation is a fresh sample.

Limits: one request per key at a time (as `Rollout` does); routing is per process, over
in-process engine objects; there is no health probing beyond the errors requests meet.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tirl.backends.engine import GenOutput, StopFn


class NoReplicaError(RuntimeError):
    """Every replica failed one request."""


def request_weight(prefix_len: int, l_base: int, w_base: int) -> int:
    """A request's weight w = floor(L / l_base) + w_base (AgentMath §4): long prefixes count
    more, and every request at least w_base."""
    return prefix_len // l_base + w_base


def choose_replica(
    load: Sequence[int],
    resident: Sequence[int],
    dead: Sequence[bool],
    home: int | None,
    weight: int,
    tried: set[int],
    rebalance_ratio: float,
    w_base: int,
) -> int | None:
    """The replica for a request of `weight` whose key lives on `home` (None: nowhere): the
    least loaded untried replica (fewest resident keys, then lowest index, break ties; a dead
    one only when no live one is left), unless `home` is a candidate and staying costs at most
    `rebalance_ratio` times moving plus w_base (moving loses the prefix cache). None when
    every replica was tried."""
    untried = [i for i in range(len(load)) if i not in tried]
    candidates = [i for i in untried if not dead[i]] or untried
    if not candidates:
        return None
    best = min(candidates, key=lambda i: (load[i], resident[i], i))
    if home is None or home not in candidates:
        return best
    if load[home] + weight > rebalance_ratio * (load[best] + weight) + w_base:
        return best
    return home


class Router:
    """An engine that spreads keys over `replicas` (each with the engine interface)."""

    def __init__(
        self,
        replicas: list[Any],
        *,
        l_base: int = 1024,
        w_base: int = 1,
        rebalance_ratio: float = 2.0,
        max_sticky: int = 100_000,
    ) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        if l_base < 1 or w_base < 0 or rebalance_ratio < 1.0 or max_sticky < 1:
            raise ValueError("need l_base >= 1, w_base >= 0, rebalance_ratio >= 1, max_sticky >= 1")
        self.replicas = list(replicas)
        self.l_base = l_base
        self.w_base = w_base
        self.rebalance_ratio = rebalance_ratio
        self.max_sticky = max_sticky
        n = len(self.replicas)
        self.load = [0] * n  # sum of in-flight request weights
        self.dead = [False] * n
        self._sticky: OrderedDict[object, int] = OrderedDict()  # key -> replica holding its state
        self._resident = [0] * n  # keys whose state lives on each replica
        self._history: dict[object, list[int]] = {}  # every id fed to and generated for a key
        self._busy: set[object] = set()  # keys with a request in flight
        self._requests = [0] * n
        self._failures = [0] * n
        self._moves = 0
        self._failovers = 0
        self._sticky_hits = 0
        self._evictions = 0

    # ------------------------------------------------------------------ engine interface
    @property
    def receives_weights(self) -> bool:
        """True iff every replica does (replicas behind HTTP never do)."""
        return all(getattr(r, "receives_weights", False) for r in self.replicas)

    async def generate(
        self,
        key: object,
        feed_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        stop: StopFn | None = None,
        seed: int | None = None,
    ) -> GenOutput:
        if not feed_ids:
            raise ValueError("generate needs at least one token to feed")
        if key in self._busy:
            raise RuntimeError(f"key {key!r} already has a request in flight")
        history = self._history.get(key, [])
        weight = self.weight(len(history) + len(feed_ids))
        tried: set[int] = set()
        last_error: BaseException | None = None
        self._busy.add(key)
        try:
            while True:
                home = self._sticky.get(key)
                target = self._choose(home, weight, tried)
                if target is None:
                    raise NoReplicaError(
                        f"all {len(self.replicas)} replicas failed a request of key {key!r}"
                    ) from last_error
                if last_error is not None:  # the key's replica just failed it
                    self._moves += 1
                    self._failovers += 1
                elif target == home:
                    self._sticky_hits += 1
                elif home is not None:  # rebalanced away from a busy replica
                    self._moves += 1
                    self._unpin(key)
                    self._release_on(home, key)
                # A replica without the key's state gets its whole prefix.
                feed = list(feed_ids) if target == home else history + list(feed_ids)
                self._pin(key, target)
                self._requests[target] += 1
                self.load[target] += weight
                try:
                    out = await self.replicas[target].generate(
                        key,
                        feed,
                        max_new_tokens=max_new_tokens,
                        temperature=temperature,
                        stop=stop,
                        **({} if seed is None else {"seed": seed}),
                    )
                except Exception as exc:  # a dead server: move the key, keep the trajectory
                    last_error = exc
                    tried.add(target)
                    self.dead[target] = True
                    self._failures[target] += 1
                    self._unpin(key)
                    self._release_on(target, key)
                    continue
                finally:
                    self.load[target] -= weight
                self.dead[target] = False
                self._history[key] = history + list(feed_ids) + list(out.ids)
                self._evict_idle(keep=key)
                return out
        finally:
            self._busy.discard(key)

    def release(self, key: object) -> None:
        """Forget a finished key, here and on the replica holding its state."""
        self._history.pop(key, None)
        home = self._sticky.get(key)
        if home is not None:
            self._unpin(key)
            self._release_on(home, key)

    async def load_weights(self, model) -> None:
        """Push `model`'s weights into every replica (all must receive weights)."""
        for replica in self.replicas:
            await replica.load_weights(model)

    def close(self) -> None:
        for replica in self.replicas:
            if hasattr(replica, "close"):
                replica.close()

    async def aclose(self) -> None:
        for replica in self.replicas:
            if hasattr(replica, "aclose"):
                await replica.aclose()
            elif hasattr(replica, "close"):
                replica.close()

    # ------------------------------------------------------------------ routing
    def weight(self, prefix_len: int) -> int:
        """w_j = floor(L_j / l_base) + w_base (AgentMath §4)."""
        return request_weight(prefix_len, self.l_base, self.w_base)

    def _choose(self, home: int | None, weight: int, tried: set[int]) -> int | None:
        """The replica for a request of `weight` whose key lives on `home` (None: nowhere)."""
        return choose_replica(
            self.load, self._resident, self.dead, home, weight, tried,
            self.rebalance_ratio, self.w_base,
        )  # fmt: skip

    def _pin(self, key: object, replica: int) -> None:
        if self._sticky.get(key) != replica:
            self._unpin(key)
            self._sticky[key] = replica
            self._resident[replica] += 1
        self._sticky.move_to_end(key)

    def _unpin(self, key: object) -> None:
        replica = self._sticky.pop(key, None)
        if replica is not None:
            self._resident[replica] -= 1

    def _evict_idle(self, keep: object) -> None:
        """Bound the sticky table: release the least recently used keys not in flight."""
        excess = len(self._sticky) - self.max_sticky
        if excess <= 0:
            return
        idle = [k for k in self._sticky if k not in self._busy and k != keep][:excess]
        for key in idle:
            home = self._sticky[key]
            self._unpin(key)
            self._release_on(home, key)
            self._evictions += 1

    def _release_on(self, replica: int, key: object) -> None:
        try:
            self.replicas[replica].release(key)
        except Exception:  # a dead replica's bookkeeping is not worth failing a trajectory for
            pass

    # ------------------------------------------------------------------ metrics
    def stats(self) -> dict[str, Any]:
        """Counters since construction; per-replica lists are indexed like `replicas`."""
        return {
            "requests": list(self._requests),
            "failures": list(self._failures),
            "load": list(self.load),
            "dead": list(self.dead),
            "resident_keys": list(self._resident),
            "moves": self._moves,
            "failovers": self._failovers,
            "sticky_hits": self._sticky_hits,
            "evictions": self._evictions,
        }
