"""The tests against the real verifiers 0.4.0 (`tests/verifiers_side/`), run in a venv of its
own (`tirl[verifiers]`: its pins clash with the dev environment; tests/side_venv.py), so that
this suite's one command runs them, never skipped; and the errors a user without verifiers,
or with a name verifiers does not know, gets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import SIDE_SUITES
from side_venv import ROOT, extra_python, side_suite


@pytest.mark.side_suite("verifiers_side")
def test_the_verifiers_tests_pass_against_the_real_package():
    summary = side_suite("verifiers_side")
    SIDE_SUITES.append(f"tests/verifiers_side, against the real verifiers 0.4.0: {summary}")


def source_error(python, entry: str, block_verifiers: bool = False) -> str:
    """The one-line ConfigError `make_source(entry)` gives under `python` (exit 2)."""
    code = (
        "import sys\n"
        + ("sys.modules['verifiers'] = None\n" if block_verifiers else "")  # as when absent
        + "import tirl.tasks.sources.verifiers_env\n"
        "from tirl.config import ConfigError\nfrom tirl.tasks import make_source\n"
        f"try:\n    make_source({entry}, 'data.train[0]')\n"
        "except ConfigError as e:\n    print(e, file=sys.stderr); sys.exit(2)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [str(python), "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line
    return line


def test_without_verifiers_the_source_says_how_to_install_it():
    entry = "{'source': 'verifiers', 'env': 'anything'}"
    line = source_error(sys.executable, entry, block_verifiers=True)
    assert line.startswith("data.train[0]: env:") and "pip install 'tirl[verifiers]'" in line


def test_an_unknown_environment_name_is_one_line():
    line = source_error(extra_python("verifiers"), "{'source': 'verifiers', 'env': 'no-such-env'}")
    assert line.startswith("data.train[0]: env: unknown verifiers environment 'no-such-env'")
