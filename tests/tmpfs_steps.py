"""Run commands on a small tmpfs, growing it between them: how tests/test_disk_full.py fills a
disk for real. Started inside a private mount namespace (`unshare -m` as root, or
`unshare -c -m --keep-caps` otherwise), so the mount is seen by nothing else and goes away with
the namespace.

    python tests/tmpfs_steps.py PLAN.json

PLAN: {"mount": DIR, "results": DIR, "steps": [{"size": "64k", "cmd": [...]}, ...]}. Before
step i the tmpfs at `mount` is mounted (step 0) or remounted with `size`; after it, its return
code, stdout and stderr go to `results/step<i>.json` and the whole tmpfs is copied to
`results/step<i>/`. Exit code 3 if the tmpfs cannot be mounted (the test then skips).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

MS_REMOUNT = 32  # <sys/mount.h>


def mount_tmpfs(target: str, size: str, remount: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = MS_REMOUNT if remount else 0
    if libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, f"size={size}".encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs size={size}: {os.strerror(err)}", target)


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    mount, results = plan["mount"], Path(plan["results"])
    for i, step in enumerate(plan["steps"]):
        try:
            mount_tmpfs(mount, step["size"], remount=i > 0)
        except OSError as e:
            print(e, file=sys.stderr)
            return 3
        proc = subprocess.run(step["cmd"], capture_output=True, text=True, timeout=600)
        record = {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        (results / f"step{i}.json").write_text(json.dumps(record))
        shutil.copytree(mount, results / f"step{i}", symlinks=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
