"""The processes below a process, read from /proc, for tests that kill a `tirl` command and
check that nothing it started lives on."""

from __future__ import annotations

import os
import time


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def left_after(pids: set[int], timeout: float = 30.0) -> dict[int, str]:
    """The pids still in /proc (zombies included) after waiting up to `timeout` seconds for
    them to go, with their command lines. The timeout only keeps a leak from hanging."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if os.path.exists(f"/proc/{p}")}
    return {p: command_line(p)[:200] for p in left}
