"""A single-machine Ray cluster that only ever talks over loopback: `init_local_ray`.

`RaySandboxPool.start()` (tirl.sandbox.ray_pool) calls it when Ray is not initialized yet; the
verl plugin's tests and the benchmarks call it directly. Plain `ray.init()` is not
loopback-only, even with `_node_ip_address="127.0.0.1"` (checked in Ray 2.60's source and with
strace in an isolated network namespace):
- `ray.init` passes that address through `resolve_ip_for_localhost`, which turns a loopback
  address into `node_ip_address_from_perspective()`: a UDP `connect()` to 8.8.8.8:53 (or
  [2001:4860:4860::8888]:53) to learn the outgoing interface's address, which then becomes the
  node address, so GCS, raylet and workers talk over the external interface. We make Ray's
  `get_node_ip_address` return the loopback address instead (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  for Ray's processes, the same constant patched in this process for the duration of `ray.init`).
- even with `include_dashboard=False`, Ray starts a minimal dashboard process for its usage-stats
  module, which probes cloud metadata services (http://169.254.169.254, a DNS lookup of
  metadata.google.internal) whether or not usage stats are enabled. Ray's processes get an HTTP
  proxy on a closed loopback port, with loopback itself exempt, so those requests fail locally.
- RAY_USAGE_STATS_ENABLED=0 keeps Ray from reporting usage to usage-stats.ray.io, and
  RAY_USAGE_STATS_REPORT_URL points at the closed loopback port in case a report is sent anyway
  (a cluster started by `ray start` sends one "disabled" report even when usage stats are off).
The result was checked by tracing every process's connect/sendto calls while the Ray pool's tests
ran: only 127.0.0.1 appeared.
A local cluster ends with the process that started it, kill -9 included: Ray's GCS and raylet
die with it on their own, and `tirl.sandbox._ray_reaper` ends the raylet's agents and workers,
which would otherwise linger for minutes. At a normal exit the cluster is shut down and the
reaper waited for, so that none of it outlives the process and no reaper is left running.
Sandbox sessions inherit none of this: the zygote starts from an allowlist of variables, and
each session has its own network namespace where that works (see `tirl.sandbox.local`).

Only for one machine: on a real cluster Ray uses the nodes' real addresses, by design ("On a
real cluster" in `tirl.sandbox.ray_pool`), and these proxy variables would keep the nodes from
reaching each other (gRPC honours them too).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from tirl.sandbox.api import SandboxError

# A proxy on a loopback port where nothing listens: HTTP requests by Ray's own processes fail
# there instead of reaching cloud metadata services. Port 9 is "discard".
DEAD_PROXY = "http://127.0.0.1:9"
LOOPBACK_NAMES = "127.0.0.1,localhost,::1"


def _loopback_env() -> dict[str, str]:
    """Variables that keep Ray's own processes (GCS, raylet, dashboard, workers) on loopback.

    Only for a single-machine cluster: gRPC honours the proxy variables as well, and goes
    direct only to the loopback names in no_proxy."""
    env = {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_USAGE_STATS_REPORT_URL": DEAD_PROXY + "/",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # get_node_ip_address -> loopback, no 8.8.8.8
        "no_proxy": LOOPBACK_NAMES,
        "NO_PROXY": LOOPBACK_NAMES,
    }
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = DEAD_PROXY
    return env


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """Set `_loopback_env()` and Ray's ENABLE_RAY_CLUSTER constant, and put both back after.

    The processes `ray.init` starts inherit the variables; this process keeps its own. The
    constant is patched too because Ray read the variable when it was first imported."""
    from ray._private import ray_constants

    saved_env = {k: os.environ.get(k) for k in _loopback_env()}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(_loopback_env())
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# How long to wait for a reaper: its first note at start, its end at exit (it takes ms)
REAPER_WAIT_S = 30.0
_REAPERS: list[subprocess.Popen] = []  # kept: their stdin pipes must stay open while we live


def _raylet_pid() -> int | None:
    """The pid of the raylet `ray.init` started here (None if Ray's internals changed)."""
    from ray._private import ray_constants

    try:
        node = ray._private.worker._global_node
        return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    except (AttributeError, KeyError, IndexError):
        return None


def _reap_when_gone(raylet_pid: int | None) -> None:
    """Start `tirl.sandbox._ray_reaper`: when this process ends, however it ends, the agents
    and workers of the local cluster end too, not minutes later (see that module)."""
    if raylet_pid is None or not sys.platform.startswith("linux"):
        return
    script = Path(__file__).with_name("_ray_reaper.py")
    reaper = subprocess.Popen(
        [sys.executable, "-I", str(script), str(raylet_pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C in the terminal is not for it
    )
    _REAPERS.append(reaper)
    # Its first note of the raylet's processes, before anything else happens here (a kill
    # right after `ray.init` would otherwise find nothing noted). The timeout only keeps a
    # reaper that cannot start from hanging us; the cluster then ends as Ray ends it.
    if select.select([reaper.stdout], [], [], REAPER_WAIT_S)[0]:
        reaper.stdout.readline()
    reaper.stdout.close()
    if len(_REAPERS) == 1:
        atexit.register(_end_reapers)


def _end_reapers() -> None:
    """At a normal exit: shut the local cluster down, then close each reaper's pipe, as a kill
    would, so that it ends the agents Ray leaves behind, and wait for it. Registered after
    `import ray`, this runs before Ray's own exit handler, whose shutdown is then a no-op."""
    ray.shutdown()
    for reaper in _REAPERS:
        reaper.stdin.close()
        try:
            reaper.wait(timeout=REAPER_WAIT_S)
        except subprocess.TimeoutExpired:
            pass  # it has read EOF and ends on its own


def init_local_ray(num_cpus: int | None = None, **ray_init_kwargs: Any) -> None:
    """Start a single-machine Ray cluster that sends nothing outside 127.0.0.0/8.

    Extra keyword arguments go to `ray.init`. Raises SandboxError (after shutting Ray down) if
    Ray still chose a non-loopback node address, which would mean its internals changed."""
    with _loopback_only():
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            **ray_init_kwargs,
        )
    _reap_when_gone(_raylet_pid())
    address = ray.util.get_node_ip_address()
    if not address.startswith("127."):
        ray.shutdown()
        raise SandboxError(
            f"Ray chose the node address {address} instead of a loopback one; refusing to run"
            " a local cluster that is reachable from the network"
        )
