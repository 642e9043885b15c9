"""Ends the processes of a local Ray cluster once the process that started it has ended.

Run as a script (no tirl import) by `tirl.sandbox.ray_cluster.init_local_ray`:
`python -I _ray_reaper.py RAYLET_PID`, its stdin a pipe from the starting process, in a
session of its own (a Ctrl-C in the terminal is not for it). It notes the processes below the
raylet (the dashboard and runtime-env agents, idle workers, actors) at once and writes one line
to its stdout, which the starter waits for; then, while the pipe is open, it notes them again
every `LOOK_EVERY_S`. When the starting process ends, however it ends (kill -9 included), the
pipe reads EOF and every noted process that still runs is killed.

Why: Ray's GCS and raylet die with their starter (they ask the kernel to), but the agents the
raylet starts only notice a dead raylet by polling, and then try to report it to the dead GCS,
which holds them for one to three minutes (Ray 2.60); a killed `tirl train` would leave them
behind that long. They are found by the process tree, noted beforehand because a dead raylet's
children are re-parented, and not by their environment, which their process titles overwrite.
A pid is killed only if its start time is still the noted one (never a reused pid). The first
note comes before the starter goes on: a starter killed within the first look would otherwise
leave the agents unnoted (it happened under load: Ray started, an RL step, kill -9, all within
a second of the reaper's start).
"""

from __future__ import annotations

import os
import select
import signal
import sys

LOOK_EVERY_S = 1.0


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, start time) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[19].decode()


def below(root: int) -> dict[int, str]:
    """The processes below `root` now, with their start times."""
    children: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(name)) is not None:
            children.setdefault(stat[0], []).append((int(name), stat[1]))
    found, todo = {}, [root]
    while todo:
        for pid, started in children.get(todo.pop(), []):
            found[pid] = started
            todo.append(pid)
    return found


def main() -> None:
    raylet = int(sys.argv[1])
    noted = below(raylet)
    os.write(1, b"noted\n")
    while True:
        readable, _, _ = select.select([0], [], [], LOOK_EVERY_S)
        if readable and not os.read(0, 4096):  # EOF: the starting process has ended
            break
        noted.update(below(raylet))
    noted.update(below(raylet))  # the raylet may not have died yet
    for pid, started in noted.items():
        stat = _stat(str(pid))
        if stat is not None and stat[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main()
