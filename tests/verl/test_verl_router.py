"""tirl's prefix-aware weighted balancer as verl 0.9.1's `RequestLoadBalancer`: sticky request
ids, shared prefixes, weighted spreading, release, removal, the sticky-cache reset, the
Protocol's signatures, and verl's own plugin path (router YAML -> class -> instance).

Server handles are plain strings where the balancer only hands them back; the last test runs
the whole path verl runs: the balancer as the Ray actor verl's `get_router_handle` makes from
the router YAML, called by verl's own `LLMServerClient` in front of two server actors."""

from __future__ import annotations

import inspect

import pytest

from tirl.config import ConfigError
from tirl.integrations.verl.router import (
    ROUTER_CLASS,
    TirlRequestLoadBalancer,
    write_router_yaml,
)

SERVERS = {"s0": "handle-0", "s1": "handle-1", "s2": "handle-2"}


def balancer(**settings) -> TirlRequestLoadBalancer:
    config = {"l_base": 100, "affinity_tokens": 16, **settings}
    return TirlRequestLoadBalancer(dict(SERVERS), {"router_class": ROUTER_CLASS, **config})


def prompt(seed: int, length: int = 20) -> list[int]:
    return [seed * 1000 + i for i in range(length)]


def test_a_request_ids_later_turns_stay_unless_its_server_is_much_busier():
    """tirl's rule: move iff load[home] + w > 2 * (load[best] + w) + 1, so a long prefix
    (large w, costly to re-prefill elsewhere) stays where a short one moves."""
    lb = balancer()
    lb.remove_servers(["s1", "s2"])
    for rid, length in (("long", 500), ("short", 20)):
        sid, handle = lb.acquire_server(rid, prompt_ids=prompt(1 if rid == "long" else 2, length))
        assert (sid, handle) == ("s0", "handle-0")
        lb.release_server(sid, request_id=rid)
    for i in range(5):  # five other requests (w = 1) in flight on s0
        lb.acquire_server(f"fill{i}", prompt_ids=prompt(10 + i))
    lb.add_servers({"s1": "handle-1b", "s2": "handle-2b"})  # idle servers arrive
    # The long trajectory's next turn (w = 600 // 100 + 1 = 7): 5 + 7 <= 2 * 7 + 1, it stays.
    assert lb.acquire_server("long", prompt_ids=prompt(1, 600))[0] == "s0"
    lb.release_server("s0", request_id="long")
    # The short one's (w = 1): 5 + 1 > 2 * 1 + 1, it moves, and its later turns follow it.
    assert lb.acquire_server("short", prompt_ids=prompt(2, 40)) == ("s1", "handle-1b")
    lb.release_server("s1", request_id="short")
    assert lb.acquire_server("short", prompt_ids=prompt(2, 60))[0] == "s1"
    status = lb.get_status()
    assert (status["moves"], status["sticky_hits"]) == (1, 2)


def test_requests_sharing_a_long_prefix_land_on_one_server_while_loads_allow():
    lb = balancer(rebalance_ratio=2.0)
    shared = prompt(7, 16)
    a, _ = lb.acquire_server("sample-a", prompt_ids=shared + [1, 2, 3])
    b, _ = lb.acquire_server("sample-b", prompt_ids=shared + [4, 5])  # same 16 leading ids
    assert b == a  # 1 + 1 <= 2 * (0 + 1) + 1: staying with the prefix cache is allowed
    c, _ = lb.acquire_server("unrelated", prompt_ids=prompt(8, 19))
    assert c != a  # an unrelated prompt goes to the least-loaded server
    # Once the prefix's server is clearly busier, a sample of it goes elsewhere.
    d, _ = lb.acquire_server("sample-d", prompt_ids=shared + [6])
    assert d == a  # 2 + 1 <= 2 * (0 + 1) + 1
    e, _ = lb.acquire_server("sample-e", prompt_ids=shared + [7])
    assert e not in (a, c)  # 3 + 1 > 3: the idle server takes it
    assert lb.get_status()["prefix_hits"] == 2


def test_unrelated_prompts_spread_by_weighted_load():
    lb = balancer(affinity_tokens=0)
    long_sid, _ = lb.acquire_server("long", prompt_ids=prompt(0, 550))  # w = 550 // 100 + 1 = 6
    short = [lb.acquire_server(f"r{i}", prompt_ids=prompt(i + 1, 30))[0] for i in range(10)]
    # Five short requests (w = 1) go to each other server before the long one's gets any.
    assert long_sid not in short
    assert sorted(short.count(s) for s in SERVERS if s != long_sid) == [5, 5]
    status = lb.get_status()
    assert sorted(status["weighted_loads"].values()) == [5, 5, 6]
    assert status["total_inflight"] == lb.get_total_inflight() == 11
    assert lb.acquire_server("r-next", prompt_ids=prompt(99, 30))[0] != long_sid
    loads = lb.get_status()["weighted_loads"]
    assert max(loads.values()) - min(loads.values()) <= 1


def test_release_takes_the_requests_weight_and_count_off_its_server():
    lb = balancer()
    sid, _ = lb.acquire_server("traj", prompt_ids=prompt(1, 420))  # w = 5
    assert lb.get_status()["weighted_loads"][sid] == 5
    assert lb.get_status()["servers"][sid] == 1
    lb.release_server(sid, request_id="traj")
    assert lb.get_status()["weighted_loads"][sid] == 0
    assert lb.get_total_inflight() == 0
    lb.release_server(sid, request_id="traj")  # a repeated release never goes below zero
    assert lb.get_status()["weighted_loads"][sid] == 0 and lb.get_total_inflight() == 0


def test_a_removed_server_is_never_routed_to_again():
    lb = balancer()
    home, _ = lb.acquire_server("traj", prompt_ids=prompt(1))
    lb.remove_servers([home])
    assert home not in lb.get_all_servers()
    lb.release_server(home, request_id="traj")  # in flight when removed: harmless
    chosen = {lb.acquire_server("traj", prompt_ids=prompt(1) + [5])[0]}
    chosen |= {lb.acquire_server(f"r{i}", prompt_ids=prompt(1))[0] for i in range(12)}
    assert home not in chosen and chosen == set(SERVERS) - {home}
    assert home not in lb.get_status()["servers"]
    lb.remove_servers(list(chosen))
    with pytest.raises(RuntimeError, match="No available servers"):
        lb.acquire_server("late", prompt_ids=prompt(2))
    lb.add_servers({home: "new-handle"})  # back, with a fresh slot and no load
    assert lb.acquire_server("late", prompt_ids=prompt(2)) == (home, "new-handle")


def test_clear_sticky_cache_forgets_homes_and_reports_loads():
    lb = balancer()
    lb.remove_servers(["s1", "s2"])
    lb.acquire_server("traj", prompt_ids=prompt(1))
    lb.release_server("s0", request_id="traj")
    lb.acquire_server("fill0", prompt_ids=prompt(2))
    lb.acquire_server("fill1", prompt_ids=prompt(3))
    lb.add_servers({"s1": "handle-1", "s2": "handle-2"})
    # s0 is busiest, but 2 + 1 <= 2 * (0 + 1) + 1: the trajectory stays with its cache.
    assert lb.acquire_server("traj", prompt_ids=prompt(1) + [9])[0] == "s0"
    lb.release_server("s0", request_id="traj")
    report = lb.clear_sticky_cache()
    assert (report["cleared_request_ids"], report["cleared_prefixes"]) == (3, 3)
    assert report["cleared_entries"] == 6
    assert report["server_loads"] == {"s0": 2, "s1": 0, "s2": 0} == lb.get_status()["servers"]
    assert lb.get_status()["pinned_request_ids"] == {"s0": 0, "s1": 0, "s2": 0}
    # Forgotten: its next turn (and a sample sharing its prefix) goes to the least loaded.
    assert lb.acquire_server("traj", prompt_ids=prompt(1) + [9, 9])[0] == "s1"
    assert lb.acquire_server("twin", prompt_ids=prompt(1) + [8])[0] == "s1"


def test_bad_settings_raise_one_line_config_errors(tmp_path):
    for settings, word in [({"l_bse": 3}, "unknown"), ({"l_base": 0}, "l_base >= 1"),
                           ({"rebalance_ratio": "2"}, "rebalance_ratio")]:  # fmt: skip
        with pytest.raises(ConfigError, match=word) as err:
            TirlRequestLoadBalancer(dict(SERVERS), settings)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="max_sticky"):
        write_router_yaml(tmp_path / "router.yaml", max_sticky=0)


def test_every_method_of_verls_protocol_has_its_signature():
    from verl.workers.rollout.router import RequestLoadBalancer

    names = [n for n, v in vars(RequestLoadBalancer).items()
             if inspect.isfunction(v) and not n.startswith("_")]  # fmt: skip
    assert {"acquire_server", "release_server", "require_acquire_fields", "clear_sticky_cache",
            "get_total_inflight", "remove_servers"} <= set(names)  # fmt: skip
    for name in names:
        theirs = inspect.signature(getattr(RequestLoadBalancer, name)).parameters
        ours = inspect.signature(getattr(TirlRequestLoadBalancer, name)).parameters
        assert [(p.name, p.kind) for p in ours.values()] == [
            (p.name, p.kind) for p in theirs.values()
        ], name
        for p in theirs.values():
            assert ours[p.name].default == p.default, (name, p.name)
    lb = balancer()
    assert lb.require_acquire_fields() == ["prompt_ids"]
    assert lb.require_release_fields() == ["request_id"]


def test_verls_plugin_path_builds_it_from_the_router_yaml(tmp_path):
    """What `router_config_path` makes verl do, minus the Ray wrapper: load the YAML, import
    `router_class`, call it with (servers, yaml_dict)."""
    from verl.workers.rollout.router import _load_router_yaml, _resolve_router_class

    path = write_router_yaml(tmp_path / "router.yaml", l_base=50, affinity_tokens=0)
    config = _load_router_yaml(str(path))
    cls = _resolve_router_class(config["router_class"])
    assert cls is TirlRequestLoadBalancer
    lb = cls(dict(SERVERS), config)
    sid, _ = lb.acquire_server("traj", prompt_ids=prompt(1, 120))
    assert lb.get_status()["weighted_loads"][sid] == 120 // 50 + 1


def test_verls_client_routes_through_the_balancer_actor(local_ray, tmp_path):
    """verl's `LLMServerClient` -> tirl's balancer (a Ray actor built by verl from the router
    YAML) -> two server actors: a trajectory's turns stay on one server, concurrent
    trajectories spread by weighted load, and every request's weight is released."""
    import asyncio

    import ray
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    # defined here so that Ray pickles it by value (a test module is not importable in a worker)
    class _RecordingServer:
        """A stand-in for one of verl's vLLM server actors (the balancer is under test, not the
        server): it holds each request briefly, so requests overlap, and answers one token."""

        def __init__(self, name: str) -> None:
            self.name = name
            self.request_prompts: list[int] = []

        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            import asyncio
            from types import SimpleNamespace

            self.request_prompts.append(len(prompt_ids))
            await asyncio.sleep(0.3)
            # what the client reads of verl's TokenOutput (importing verl here costs seconds)
            return SimpleNamespace(token_ids=[7], stop_reason="completed", extra_fields={})

        def served(self) -> list[int]:
            return self.request_prompts

    remote = ray.remote(num_cpus=0)(_RecordingServer)
    servers = {name: remote.remote(name) for name in ("a", "b")}
    router_yaml = write_router_yaml(tmp_path / "router.yaml", l_base=100, affinity_tokens=0)
    lb = get_router_handle(servers, router_config_path=str(router_yaml))
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})
    client = LLMServerClient(config, load_balancer_handle=lb)

    async def trajectory(request_id: str, turns: int, length: int) -> None:
        for turn in range(turns):
            ids = prompt(0, length + 10 * turn)
            await client.generate(request_id, prompt_ids=ids, sampling_params={})

    async def main():
        await trajectory("one", turns=3, length=20)
        homes = {name: len(ray.get(s.served.remote())) for name, s in servers.items()}
        assert sorted(homes.values()) == [0, 3]  # its three turns on one server
        # six at once: two long (weight 4 each) and four short (weight 1 each)
        await asyncio.gather(
            *(trajectory(f"long{i}", 1, 350) for i in range(2)),
            *(trajectory(f"short{i}", 1, 20) for i in range(4)),
        )

    asyncio.run(main())
    served = {name: ray.get(s.served.remote()) for name, s in servers.items()}
    long_on = sorted(sum(n >= 350 for n in lens) for lens in served.values())
    assert long_on == [1, 1]  # the two heavy requests went to different servers
    assert sum(map(len, served.values())) == 9
    status = ray.get(lb.get_status.remote())
    assert sum(status["weighted_loads"].values()) == 0  # every weight taken off again
