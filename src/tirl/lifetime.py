"""Child processes that do not outlive the process that started them.

A parent killed outright (`kill -9`, the OOM killer) runs no clean-up, so on Linux a child asks
the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`, prctl(2)): nothing trains or
runs on, unseen, after the command is gone. The signal follows the *thread* that forked the
child; tirl starts its children from threads that outlive them (the main thread, or the event
loop's thread that waits for them).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)

_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with(parent: int) -> None:
    """SIGKILL this process when `parent` dies; if it died already, exit now. Linux only: a
    no-op elsewhere and where the kernel refuses."""
    if _prctl is None or _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # the parent's own clean-up is all there is
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)


def dies_with_this_process():
    """A `preexec_fn` for `subprocess`/`asyncio` children: the child gets SIGKILL when this
    process dies. The libc function is resolved here, before the fork, so the child only
    makes the one system call between fork and exec."""
    parent = os.getpid()
    return lambda: die_with(parent)
