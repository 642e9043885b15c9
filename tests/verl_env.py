"""verl's own Python environment for the plugin's tests (`tests/verl/`).

verl 0.9.1 pins transformers < 5.11, older than tirl's dev environment, so its tests run in a
venv of their own that shares this interpreter's other packages (torch, ray, tirl's
dependencies: `--system-site-packages`) and adds what `tirl[verl]` lists in pyproject.toml. It
lives in the user's cache, made once and reused while the pins are unchanged; making it needs
the package index (as `pip install -e .[dev]` does).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def verl_requirements() -> list[str]:
    """The `verl` extra of pyproject.toml: the one place the pins are written."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project["optional-dependencies"]["verl"])


def venv_dir(requirements: list[str]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:10]
    return cache / "tirl" / f"verl-venv-{digest}"


def ensure_verl_python() -> Path:
    """The venv's python, made (and the pins installed) if it is not there yet."""
    requirements = verl_requirements()
    venv = venv_dir(requirements)
    python = venv / "bin" / "python"
    ready = venv / ".tirl-ready"
    if not ready.is_file():
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--clear", str(venv)],
            check=True,
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             *requirements],
            check=True,
        )  # fmt: skip
        ready.write_text("\n".join(requirements), encoding="utf-8")
    return python
