"""Run commands on a small tmpfs, growing it between them: how tests/test_disk_full.py fills a
disk for real. Started inside a private mount namespace (`unshare -m` as root, or
`unshare -c -m --keep-caps` otherwise), so the mount is seen by nothing else and goes away with
the namespace.

    python tests/tmpfs_steps.py PLAN.json

PLAN: {"mount": DIR, "results": DIR, "steps": [{"size": "64k", "cmd": [...]}, ...]}. Before
step i the tmpfs at `mount` is mounted (step 0) or remounted with `size`; after it, its return
code, stdout and stderr go to `results/step<i>.json` and the whole tmpfs is copied to
`results/step<i>/`. Exit code 3 if the tmpfs cannot be mounted (the test then skips).

A step `[python, -m, tirl.cli, ARGS...]` runs in a child process forked from this driver after
it imported tirl, torch and transformers once, doing what `python -m tirl.cli` does
(`sys.exit(main(ARGS))`, then the exit handlers): the same code on the same files, without
paying the imports (seconds on a 2-core machine) again for every step. Any other command runs
as a plain subprocess.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

MS_REMOUNT = 32  # <sys/mount.h>

# What `tirl train` and `tirl eval` import lazily; imported once here, before any step forks.
PRELOAD = (
    "torch",
    "transformers",
    "tirl.cli",
    "tirl.models.tiny",
    "tirl.train.pipeline",
    "tirl.train.run_folder",
    "tirl.eval.evaluate",
    "tirl.eval.benchmark_eval",
    "tirl.rollout.runner",
    "tirl.sandbox",
)


def mount_tmpfs(target: str, size: str, remount: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = MS_REMOUNT if remount else 0
    if libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, f"size={size}".encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs size={size}: {os.strerror(err)}", target)


def is_tirl_cli(cmd: list[str]) -> bool:
    return cmd[1:3] == ["-m", "tirl.cli"]


def run_tirl_forked(args: list[str], out_dir: Path) -> dict:
    """`python -m tirl.cli ARGS` in a forked child whose stdout and stderr go to files."""
    stdout, stderr = out_dir / "stdout.txt", out_dir / "stderr.txt"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the driver's loop
        code = 1
        try:
            for fd, path in ((1, stdout), (2, stderr)):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(target, fd)
                os.close(target)
            sys.argv = ["tirl", *args]
            import tirl.cli

            try:
                code = tirl.cli.main(args)
            except SystemExit as e:
                code = e.code
            atexit._run_exitfuncs()  # as at a normal interpreter exit
            code = code if isinstance(code, int) else (0 if code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    record = {"rc": rc, "stdout": stdout.read_text(), "stderr": stderr.read_text()}
    stdout.unlink()
    stderr.unlink()
    return record


def main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    mount, results = plan["mount"], Path(plan["results"])
    if any(is_tirl_cli(step["cmd"]) for step in plan["steps"]):
        for name in PRELOAD:
            importlib.import_module(name)
    for i, step in enumerate(plan["steps"]):
        try:
            mount_tmpfs(mount, step["size"], remount=i > 0)
        except OSError as e:
            print(e, file=sys.stderr)
            return 3
        if is_tirl_cli(step["cmd"]):
            record = run_tirl_forked(step["cmd"][3:], results)
        else:
            proc = subprocess.run(step["cmd"], capture_output=True, text=True, timeout=600)
            record = {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        (results / f"step{i}.json").write_text(json.dumps(record))
        shutil.copytree(mount, results / f"step{i}", symlinks=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
