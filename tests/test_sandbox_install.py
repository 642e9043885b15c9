"""The sandbox starts from a fresh clone wherever it lives, and leaves nothing behind.

The project is cloned (`git clone --local` of this repository, offline) into a 0700 directory
made by `tempfile.mkdtemp()` under /tmp, as CI systems do, and installed in a venv there with
`pip install --no-deps --no-build-isolation --no-index -e .`, so nothing is downloaded. That venv
is layered on the environment the suite runs in (`side_venv.layered_venv`), whether that is a
venv or the base interpreter: it builds with the suite's own setuptools (the dev extra asks for
one that builds editables without `wheel`), never the base interpreter's. The clone gets this
checkout's uncommitted `src/` copied over it, so the test exercises the code under test rather
than the last commit.

An owner process (the venv's python, cwd "/") then runs sandboxes with and without isolation,
and it is checked that no `tirl-*` entry is left in the temporary directory and no uid-block
lock file in /run after: success; a failed start (a preload module that does not exist);
SIGTERM and SIGKILL of the owner (the zygote cleans up on its death signal); and SIGKILL of the
zygotes themselves, which do leave things behind, removed by the next start. Each owner gets a
private TMPDIR so that other test runs sharing /tmp cannot disturb the count. As root, the same
is run again as `nobody` (uid 65534), which reaches Python under /root only through the
mount namespace the existing unprivileged test also uses.

Limits: Linux only; the clone needs `git`; the non-root run needs root to start it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from side_venv import layered_venv

from tirl.sandbox import _isolation as iso

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
WAIT_S = 60.0  # generous: only a machine that is stuck takes this long

OWNER = r"""
import asyncio, json, sys
from tirl.sandbox import Sandbox, SandboxError, SandboxLimits

mode = sys.argv[1]
limits = SandboxLimits(timeout_s=30.0)

async def main():
    if mode == "bad_preload":
        try:
            async with Sandbox(limits, preload=("math", "tirl_no_such_module")):
                pass
        except SandboxError as e:
            print(json.dumps({"error": str(e)}), flush=True)
        return
    async with Sandbox(limits, preload=("math",)) as isolated, \
            Sandbox(limits, preload=("math",), isolate=False) as plain:
        out = {"zygotes": [isolated.zygote_pid, plain.zygote_pid],
               "isolation": isolated.isolation, "workdir": plain.workdir}
        for name, sb in (("isolated", isolated), ("plain", plain)):
            s = await sb.session()
            r = await s.run("import tirl, os\nprint(os.path.dirname(tirl.__file__), 6 * 7)")
            out[name] = r.to_dict()
        print(json.dumps(out), flush=True)
        if mode == "hold":
            await asyncio.Event().wait()  # until the test kills us

asyncio.run(main())
"""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)[:300]} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def clone():
    if shutil.which("git") is None:
        pytest.skip("needs git")
    top = tempfile.mkdtemp()  # 0700, under /tmp
    try:
        repo, venv = Path(top, "repo"), Path(top, "venv")
        _run(["git", "clone", "-q", "--local", str(REPO), str(repo)])
        shutil.copytree(
            REPO / "src", repo / "src", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pyc")
        )
        python = layered_venv(venv)
        _run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
            + ["--no-index", "-e", str(repo)],
            cwd=repo,
        )
        yield Path(top), python
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _owner_env(tmpdir: Path) -> dict[str, str]:
    # no PYTHONPATH: the venv alone must find the clone's tirl
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": str(tmpdir)}


def _private_tmp(top: Path, name: str, owner: int | None = None) -> Path:
    d = top / name
    d.mkdir(mode=0o700)
    if owner is not None:
        os.chown(d, owner, owner)
    return d


def _lock_file(isolation: dict) -> Path | None:
    first = (isolation.get("uid_range") or [None])[0]
    if first is None:
        return None
    return Path(iso.UidBlock.LOCK_DIR, str((first - iso.UidBlock.BASE) // iso.UidBlock.SIZE))


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            return True
        time.sleep(0.05)
    return False


def _check_cells(out: dict, repo: Path) -> None:
    for name in ("isolated", "plain"):
        assert out[name]["status"] == "ok", out[name]
        assert out[name]["stdout"] == f"{repo / 'src' / 'tirl'} 42\n"


def test_a_fresh_clone_in_a_private_tmp_dir_runs_cells_and_leaves_nothing(clone):
    top, python = clone
    tmp = _private_tmp(top, "tmp-success")
    proc = _run([str(python), "-c", OWNER, "run"], env=_owner_env(tmp), cwd="/")
    out = json.loads(proc.stdout)
    _check_cells(out, top / "repo")
    if os.geteuid() == 0 and out["isolation"].get("uid") == "family":
        assert str(top) in out["isolation"]["exposed"]  # the 0700 dir the clone lives in
        assert not _lock_file(out["isolation"]).exists()
    assert out["workdir"].startswith(f"{tmp}/tirl-sandbox-")
    assert _gone(out["zygotes"])
    assert list(tmp.iterdir()) == []


def test_a_failed_start_leaves_nothing(clone):
    top, python = clone
    tmp = _private_tmp(top, "tmp-failure")
    proc = _run([str(python), "-c", OWNER, "bad_preload"], env=_owner_env(tmp), cwd="/")
    assert "tirl_no_such_module" in json.loads(proc.stdout)["error"]
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_owners_death_leaves_nothing(clone, sig):
    top, python = clone
    tmp = _private_tmp(top, f"tmp-owner-{sig.name}")
    owner = subprocess.Popen(
        [str(python), "-c", OWNER, "hold"],
        env=_owner_env(tmp),
        cwd="/",
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out = json.loads(owner.stdout.readline())
        _check_cells(out, top / "repo")
        assert any(tmp.iterdir())  # the unisolated sandbox's directory, while it runs
    finally:
        owner.send_signal(sig)
        owner.wait(WAIT_S)
        owner.stdout.close()
    assert _gone(out["zygotes"])  # they got SIGTERM from the kernel (PR_SET_PDEATHSIG)
    assert list(tmp.iterdir()) == []
    lock = _lock_file(out["isolation"])
    assert lock is None or not lock.exists()


def test_what_killed_zygotes_leave_is_removed_by_the_next_start(clone):
    top, python = clone
    tmp = _private_tmp(top, "tmp-stale")
    owner = subprocess.Popen(
        [str(python), "-c", OWNER, "hold"],
        env=_owner_env(tmp),
        cwd="/",
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out = json.loads(owner.stdout.readline())
        for pid in out["zygotes"]:  # no chance to clean up
            os.kill(pid, signal.SIGKILL)
    finally:
        owner.kill()
        owner.wait(WAIT_S)
        owner.stdout.close()
    assert _gone(out["zygotes"])
    left = sorted(p.name for p in tmp.iterdir())
    assert len(left) == 1 and left[0].startswith(f"tirl-sandbox-{out['zygotes'][1]}-")

    proc = _run([str(python), "-c", OWNER, "run"], env=_owner_env(tmp), cwd="/")
    after = json.loads(proc.stdout)
    _check_cells(after, top / "repo")
    assert _gone(after["zygotes"])
    assert list(tmp.iterdir()) == []  # the stale directory went at the next start
    # The stale lock file: unlinked by the next start here, or by any other sandbox starting on
    # this machine meanwhile; either way it does not stay.
    lock = _lock_file(out["isolation"])
    assert lock is None or not lock.exists()


_AS_NOBODY = """
import os, sys
from tirl.sandbox import _isolation as iso
paths = sys.argv[1].split(os.pathsep)
if not iso.unshare(iso.CLONE_NEWNS):
    sys.exit("no mount namespace")
iso.make_mounts_private()
iso.expose_paths(paths)  # Python lives under /root, which nobody may enter
iso.become(NOBODY, NOBODY)
env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv finds tirl itself
os.execve(sys.argv[2], sys.argv[2:], env)
""".replace("NOBODY", str(NOBODY))


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_a_fresh_clone_runs_as_nobody_and_leaves_nothing(clone):
    top, python = clone
    tmp = _private_tmp(top, "tmp-nobody", owner=NOBODY)
    for path in (top, *top.rglob("*")):
        os.lchown(path, NOBODY, NOBODY)
    try:
        python_paths = os.pathsep.join([sys.prefix, sys.base_prefix, *filter(None, sys.path)])
        # The launcher is this interpreter (it can enter /root); it then becomes nobody and
        # execs the venv's python. No PYTHONPATH reaches the owner.
        launcher = [sys.executable, "-c", _AS_NOBODY, python_paths, str(python), "-c", OWNER]
        env = _owner_env(tmp)
        env["PYTHONPATH"] = str(REPO / "src")  # for the launcher only: it imports tirl
        probe = subprocess.run(
            [*launcher, "run"], capture_output=True, text=True, timeout=300, env=env, cwd="/"
        )
        if probe.returncode != 0 and "no mount namespace" in probe.stderr:
            pytest.skip("cannot make a mount namespace here")
        assert probe.returncode == 0, probe.stderr[-3000:]
        out = json.loads(probe.stdout)
        _check_cells(out, top / "repo")
        assert out["isolation"]["uid"] == "caller"  # not root: user namespaces stand in
        assert _gone(out["zygotes"])
        assert list(tmp.iterdir()) == []

        owner = subprocess.Popen([*launcher, "hold"], env=env, cwd="/", stdout=subprocess.PIPE)
        try:
            held = json.loads(owner.stdout.readline())
        finally:
            owner.kill()
            owner.wait(WAIT_S)
            owner.stdout.close()
        assert _gone(held["zygotes"])
        assert list(tmp.iterdir()) == []
    finally:
        for path in (top, *top.rglob("*")):
            os.lchown(path, 0, 0)
