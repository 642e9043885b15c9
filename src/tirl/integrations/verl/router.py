"""tirl's prefix-aware weighted load balancing (`tirl.rollout.router`) as verl's load balancer.

verl 0.9.1 routes every generation request of its agent loops through one shared balancer
actor (`verl.workers.rollout.router.RequestLoadBalancer`, a Protocol): `LLMServerClient`
calls `acquire_server(request_id, **fields)` before a request and `release_server(server_id,
**fields)` after it. Its default, `GlobalRequestLoadBalancer`, pins a request id to a server
and counts in-flight requests, all of the same weight. This balancer applies tirl's policy
instead (AgentMath §4, "前缀感知加权负载均衡"):

- a request of L prompt tokens weighs w = floor(L / l_base) + w_base (`request_weight`): verl
  sends a trajectory's whole history as `prompt_ids` with every turn, so L is its prefix;
- a server's load is the sum of the weights of its in-flight requests;
- a request id's first request goes to the least-loaded server (ties: fewest pinned request
  ids, then the earliest added); its later requests go back to the server holding its prefix
  cache unless staying is clearly worse, by the router's rule
  load[home] + w > rebalance_ratio * (load[best] + w) + w_base (`choose_replica`);
- a request id new to the balancer whose first `affinity_tokens` prompt ids were last sent to
  some server treats that server as its home under the same rule, so the `rollout.n` samples
  of one prompt (a GRPO group) share the prompt's prefix cache while the loads allow.

The policy is not re-implemented here: weights and choices come from the pure functions
`tirl.rollout.router.Router` uses (`request_weight`, `choose_replica`), over this balancer's
server table. Servers verl removes keep their slot and are passed to `choose_replica` as
already tried, so they are never chosen; a server added again gets a fresh slot.

Use it in verl (0.9.1) with one override, `actor_rollout_ref.rollout.router_config_path=PATH`,
where PATH is a YAML file holding `router_class:
tirl.integrations.verl.router.TirlRequestLoadBalancer` and, optionally, this balancer's
settings (`ROUTER_YAML`, `write_router_yaml`). verl then builds
`ray.remote(TirlRequestLoadBalancer).remote(servers, yaml_dict)`
(`verl.workers.rollout.router._create_plugin_extension`). A trainer that passes
`load_balancer_cls` to `LLMServerManager` ignores that YAML (none in verl 0.9.1 does).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import yaml

from tirl.config import ConfigError
from tirl.rollout.router import choose_replica, request_weight

ROUTER_CLASS = "tirl.integrations.verl.router.TirlRequestLoadBalancer"
DEFAULT_SETTINGS: dict[str, Any] = {
    "l_base": 1024,  # tokens of prefix per extra unit of weight (AgentMath §4)
    "w_base": 1,  # every request's base weight
    "rebalance_ratio": 2.0,  # how much busier home may be before a request id moves
    "max_sticky": 100_000,  # request ids (and prompt prefixes) remembered, least recent dropped
    "affinity_tokens": 1024,  # leading prompt ids that identify a shared prefix; 0: off
}
ROUTER_YAML = yaml.safe_dump({"router_class": ROUTER_CLASS, **DEFAULT_SETTINGS}, sort_keys=False)


def write_router_yaml(path: str | Path, **settings: Any) -> Path:
    """Write the YAML `actor_rollout_ref.rollout.router_config_path` names; `settings` override
    `DEFAULT_SETTINGS` (checked here, so a bad one fails before verl starts)."""
    config = {"router_class": ROUTER_CLASS, **DEFAULT_SETTINGS, **settings}
    _settings_of(config, where=str(path))
    path = Path(path)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _settings_of(config: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """The balancer's settings from verl's router YAML dict (`router_class` and defaults)."""
    config = dict(config or {})
    config.pop("router_class", None)
    unknown = sorted(set(config) - set(DEFAULT_SETTINGS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown router setting(s) {unknown}; known: {sorted(DEFAULT_SETTINGS)}"
        )
    settings = {**DEFAULT_SETTINGS, **config}
    ints = ("l_base", "w_base", "max_sticky", "affinity_tokens")
    for name in ints:
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: router setting {name} must be an integer, got {value!r}")
    ratio = settings["rebalance_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise ConfigError(
            f"{where}: router setting rebalance_ratio must be a number, got {ratio!r}"
        )
    if (
        settings["l_base"] < 1
        or settings["w_base"] < 0
        or ratio < 1.0
        or settings["max_sticky"] < 1
        or settings["affinity_tokens"] < 0
    ):
        raise ConfigError(
            f"{where}: router settings need l_base >= 1, w_base >= 0, rebalance_ratio >= 1, "
            f"max_sticky >= 1, affinity_tokens >= 0; got {settings}"
        )
    return settings


class _ServerPool:
    """verl's servers as the replica table `choose_replica` reads: slot i is
    one added server; `dead` stays False (verl removes servers instead of reporting them
    dead) and removed slots are passed to `choose_replica` as tried."""

    def __init__(self, l_base: int, w_base: int, rebalance_ratio: float) -> None:
        self.l_base = l_base
        self.w_base = w_base
        self.rebalance_ratio = rebalance_ratio
        self.replicas: list[str] = []  # server id per slot
        self.handles: list[Any] = []
        self.load: list[int] = []  # sum of in-flight request weights
        self.dead: list[bool] = []
        self._resident: list[int] = []  # request ids pinned to each slot
        self.inflight: list[int] = []  # in-flight request count (verl's own measure)
        self.removed: set[int] = set()
        self.slot_of: dict[str, int] = {}  # active server id -> slot

    def add(self, server_id: str, handle: Any) -> None:
        if server_id in self.slot_of:  # re-registration: keep counts, take the new handle
            self.handles[self.slot_of[server_id]] = handle
            return
        self.slot_of[server_id] = len(self.replicas)
        self.replicas.append(server_id)
        self.handles.append(handle)
        for column in (self.load, self._resident, self.inflight):
            column.append(0)
        self.dead.append(False)

    def remove(self, server_id: str) -> None:
        slot = self.slot_of.pop(server_id, None)
        if slot is not None:
            self.removed.add(slot)

    def weight(self, prefix_len: int) -> int:
        return request_weight(prefix_len, self.l_base, self.w_base)

    def choose(self, home: int | None, weight: int) -> int | None:
        return choose_replica(
            self.load, self._resident, self.dead, home, weight, set(self.removed),
            self.rebalance_ratio, self.w_base,
        )  # fmt: skip


class TirlRequestLoadBalancer:
    """verl's `RequestLoadBalancer` with tirl's prefix-aware weighted policy.

    A plain class: verl wraps it with `ray.remote`, so its methods run one at a time in one
    actor. `servers` maps server id (verl: the server address) to its handle; `config` is the
    router YAML as a dict (see `DEFAULT_SETTINGS`).
    """

    def __init__(self, servers: dict[str, Any], config: dict[str, Any] | None = None) -> None:
        settings = _settings_of(config, where="router_config_path")
        self.max_sticky = settings["max_sticky"]
        self.affinity_tokens = settings["affinity_tokens"]
        self._pool = _ServerPool(
            settings["l_base"], settings["w_base"], settings["rebalance_ratio"]
        )
        self._sticky: OrderedDict[str, int] = OrderedDict()  # request id -> slot of its cache
        self._prefix_home: OrderedDict[int, int] = OrderedDict()  # hash of a prefix -> slot
        self._acquired: dict[str, list[tuple[int, int]]] = {}  # request id -> (slot, weight)
        self._moves = 0
        self._sticky_hits = 0
        self._prefix_hits = 0
        self.add_servers(servers)

    # ------------------------------------------------------------------ verl's protocol
    def require_acquire_fields(self) -> list[str]:
        """The prompt ids give the weight and the shared-prefix key."""
        return ["prompt_ids"]

    def require_release_fields(self) -> list[str]:
        """The release looks up the request's slot and weight by its id."""
        return ["request_id"]

    def acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        """The server for one request of `request_id` (`prompt_ids` in `extra`; without it the
        request weighs w_base and has no shared-prefix key)."""
        pool = self._pool
        if not pool.slot_of:
            raise RuntimeError("No available servers in load balancer")
        prompt_ids = extra.get("prompt_ids")
        prompt_ids = [] if prompt_ids is None else prompt_ids  # a list (or an array) of ids
        weight = pool.weight(len(prompt_ids))
        home = self._sticky.get(request_id)
        # A request id's first request carries the key of its prompt's leading ids (a hash:
        # Python's hash of a tuple of ints is not salted, and 64 bits make collisions moot).
        prefix = None
        if home is None and self.affinity_tokens and len(prompt_ids):
            prefix = hash(tuple(int(t) for t in prompt_ids[: self.affinity_tokens]))
        from_prefix = prefix is not None and prefix in self._prefix_home
        if from_prefix:
            home = self._prefix_home[prefix]
        slot = pool.choose(home, weight)
        if slot is None:  # unreachable while slot_of is non-empty; kept as a guard
            raise RuntimeError("No available servers in load balancer")
        if slot == home:
            if from_prefix:
                self._prefix_hits += 1
            else:
                self._sticky_hits += 1
        elif home is not None and not from_prefix and home not in pool.removed:
            self._moves += 1
        self._pin(request_id, slot)
        if prefix is not None:
            self._prefix_home[prefix] = slot
            self._prefix_home.move_to_end(prefix)
            while len(self._prefix_home) > self.max_sticky:
                self._prefix_home.popitem(last=False)
        pool.load[slot] += weight
        pool.inflight[slot] += 1
        self._acquired.setdefault(request_id, []).append((slot, weight))
        return pool.replicas[slot], pool.handles[slot]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """Take one finished request's weight off its server (a removed server: nothing)."""
        records = self._acquired.get(request_id, []) if request_id is not None else []
        mine = [i for i, (slot, _) in enumerate(records) if self._pool.replicas[slot] == server_id]
        if mine:
            slot, weight = records.pop(mine[0])
            if not records:
                del self._acquired[request_id]
        else:  # not acquired here (or released without its id): count it at the base weight
            slot, weight = self._pool.slot_of.get(server_id), self._pool.w_base
            if slot is None:
                return
        if slot in self._pool.removed:
            return
        self._pool.load[slot] = max(0, self._pool.load[slot] - weight)
        self._pool.inflight[slot] = max(0, self._pool.inflight[slot] - 1)

    def add_servers(self, servers: dict[str, Any]) -> None:
        for server_id, handle in servers.items():
            self._pool.add(server_id, handle)

    def remove_servers(self, server_ids: list[str]) -> None:
        """Stop routing to `server_ids`; request ids pinned there move at their next request."""
        for server_id in server_ids:
            self._pool.remove(server_id)

    def get_all_servers(self) -> list[str]:
        return list(self._pool.slot_of)

    def get_total_inflight(self) -> int:
        return sum(self._pool.inflight[slot] for slot in self._pool.slot_of.values())

    def get_status(self) -> dict[str, Any]:
        """verl's keys (`servers`: in-flight counts, `total_inflight`, `active_servers`) plus
        tirl's weighted loads and counters."""
        slots = self._pool.slot_of
        return {
            "servers": {sid: self._pool.inflight[s] for sid, s in slots.items()},
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(slots),
            "registered_handles": list(slots),
            "weighted_loads": {sid: self._pool.load[s] for sid, s in slots.items()},
            "pinned_request_ids": {sid: self._pool._resident[s] for sid, s in slots.items()},
            "sticky_hits": self._sticky_hits,
            "prefix_hits": self._prefix_hits,
            "moves": self._moves,
        }

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Forget every request id's and prefix's server (verl calls this on phase switches and
        fully-async rebalancing); in-flight loads stay, so new requests spread by them."""
        request_ids, prefixes = len(self._sticky), len(self._prefix_home)
        self._sticky.clear()
        self._prefix_home.clear()
        self._pool._resident = [0] * len(self._pool.replicas)
        slots = self._pool.slot_of
        return {
            "cleared_entries": request_ids + prefixes,
            "cleared_request_ids": request_ids,
            "cleared_prefixes": prefixes,
            "server_loads": {sid: self._pool.inflight[s] for sid, s in slots.items()},
            "weighted_loads": {sid: self._pool.load[s] for sid, s in slots.items()},
        }

    # ------------------------------------------------------------------ stickiness
    def _pin(self, request_id: str, slot: int) -> None:
        """Pin `request_id` to `slot` (LRU-bounded by max_sticky), as `Router._pin` does."""
        old = self._sticky.get(request_id)
        if old != slot:
            if old is not None:
                self._pool._resident[old] -= 1
            self._sticky[request_id] = slot
            self._pool._resident[slot] += 1
        self._sticky.move_to_end(request_id)
        while len(self._sticky) > self.max_sticky:
            _, evicted = self._sticky.popitem(last=False)
            self._pool._resident[evicted] -= 1
