"""`verify_answer` from where reward functions really get called, each a real `sys.executable`
subprocess: a script with no `if __name__ == "__main__"` guard, `python -` reading standard input,
daemonic `multiprocessing.Pool` workers and `multiprocessing.Process` children (fork and spawn),
and a caller that put a source folder on `sys.path` instead of installing tirl. Also the pool's
process promises: workers die with the process that started them, and workers that cannot start
give a clear error.

Time bounds here are "does not hang" bounds, not speed thresholds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import math_verify
import pytest

from tirl.rewards.verify import MathVerifier

SRC = Path(__file__).resolve().parents[1] / "src"
HANG_S = 180  # a subprocess still running after this is hung

# One equal and one unequal pair, and the verdicts they must get.
CHECK = r"""
from tirl.rewards.verify import verify_answer

for gold, pred in [("\\frac{1}{2}", "0.5"), ("\\frac{1}{2}", "0.6")]:
    verdict = verify_answer(gold, pred)
    print("VERDICT", verdict.correct, verdict.reason)
"""
EXPECTED = ["VERDICT True equivalent", "VERDICT False not equivalent"]


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=HANG_S, **kwargs
    )


def _verdicts(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("VERDICT")]


def test_verify_answer_works_from_a_script_without_a_main_guard(tmp_path):
    script = tmp_path / "score.py"
    script.write_text(CHECK)
    assert _verdicts(_python(str(script), cwd=tmp_path)) == EXPECTED


def test_verify_answer_works_from_standard_input(tmp_path):
    assert _verdicts(_python("-", input=CHECK, cwd=tmp_path)) == EXPECTED


POOL_AND_PROCESS = r"""
import json
import multiprocessing as mp

from tirl.rewards.verify import verify_answer

PAIRS = [("\\frac{1}{2}", "0.5"), ("\\frac{1}{2}", "0.6")]


def judge_all(_=None):
    verdicts = [verify_answer(gold, pred) for gold, pred in PAIRS]
    return {"daemon": mp.current_process().daemon, "verdicts": [v.correct for v in verdicts]}


def in_process(queue):
    queue.put(judge_all())


if __name__ == "__main__":
    print(json.dumps({"where": "parent", **judge_all()}))  # forked children inherit this verifier
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        with ctx.Pool(1) as pool:
            print(json.dumps({"where": f"pool/{method}", **pool.apply(judge_all)}))
        queue = ctx.Queue()
        child = ctx.Process(target=in_process, args=(queue,))
        child.start()
        print(json.dumps({"where": f"process/{method}", **queue.get(timeout=120)}))
        child.join()
"""


def test_verify_answer_works_in_daemonic_pool_workers_and_in_processes(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(POOL_AND_PROCESS)
    out = _python(str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["where"] for r in rows] == [
        "parent",
        "pool/fork",
        "process/fork",
        "pool/spawn",
        "process/spawn",
    ]
    assert all(r["verdicts"] == [True, False] for r in rows)
    assert all(r["daemon"] for r in rows if r["where"].startswith("pool/"))  # daemonic workers


def test_workers_find_tirl_in_a_source_folder_the_caller_put_on_sys_path(tmp_path):
    # -S: no site-packages and no .pth files, so the editable install is invisible; the workers
    # inherit -S, and find tirl only because the pool passes them the folder it came from. The
    # folder is put on sys.path relative to a working directory the caller then leaves.
    site_packages = str(Path(math_verify.__file__).resolve().parents[1])
    script = f"""
import os, sys
sys.path.append({site_packages!r})
sys.path.insert(0, "src")
import tirl
assert tirl.__file__.startswith({str(SRC)!r}), tirl.__file__
os.chdir({str(tmp_path)!r})
{CHECK}
"""
    assert _verdicts(_python("-S", "-", input=script, cwd=SRC.parent)) == EXPECTED


DIES_WITH_PARENT = r"""
import os, signal, threading, time
from tirl.rewards.verify import MathVerifier


def children():
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if int(fields[1]) == os.getpid():  # fields: state, ppid, ...
            found.append((int(name), fields[0]))
    return found


verifier = MathVerifier(workers=1, timeout_s=600)
assert verifier.verify("1", "1").correct
# A comparison that runs for minutes in C code: the worker cannot notice its socket closing.
threading.Thread(target=verifier.verify, args=("1", "\\prod_{k=1}^{10^{7}} k"), daemon=True).start()
deadline = time.monotonic() + 60
while not any(state == "R" for _, state in children()) and time.monotonic() < deadline:
    time.sleep(0.05)
print("WORKERS", *[pid for pid, state in children() if state == "R"], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            is_worker = b"_verify_worker" in f.read()
    except OSError:
        return False
    return state != "Z" and is_worker


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_busy_worker_dies_with_the_process_that_started_it(tmp_path):
    # stderr to a file: a surviving worker would hold a pipe open and hang the run.
    with open(tmp_path / "stderr", "w") as stderr:
        out = subprocess.run(
            [sys.executable, "-"],
            input=DIES_WITH_PARENT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            timeout=HANG_S,
            cwd=tmp_path,
        )
    assert out.returncode == -9, (tmp_path / "stderr").read_text()
    line = next(line for line in out.stdout.splitlines() if line.startswith("WORKERS"))
    workers = [int(pid) for pid in line.split()[1:]]
    assert len(workers) == 1  # the worker was running the long comparison when its parent died
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:  # do not leave it computing after a failure
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def test_workers_that_cannot_start_give_a_clear_error():
    # 40 MB of address space is too little to import sympy: every start fails in the worker.
    # Where the limit strikes varies (the worker's own report of its MemoryError may fail too,
    # and it exits instead), so what is checked is the stable part: one line that names the
    # start failure and the limit.
    verifier = MathVerifier(workers=1, memory_limit_mb=40)
    try:
        with pytest.raises(RuntimeError) as failed:
            verifier.verify("1", "1")
        message = str(failed.value)
        assert message.startswith("math-verify workers fail to start (memory_limit_mb=40): ")
        assert "\n" not in message
        with pytest.raises(RuntimeError, match="fail to start"):  # and it stays broken
            verifier.verify_batch([("1", "1")])
    finally:
        verifier.close()
