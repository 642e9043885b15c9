"""The verl plugin's tests (`tests/verl/`), run against the real pinned verl in its own
environment (`tests/side_venv.py`) so that this suite's one command runs them, never skipped;
and the error a user without verl gets."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import SIDE_SUITES
from side_venv import side_suite


@pytest.mark.side_suite("verl")
def test_the_plugin_tests_pass_against_the_pinned_verl():
    summary = side_suite("verl")
    SIDE_SUITES.append(f"tests/verl, against the pinned verl: {summary}")


def test_without_verl_the_plugin_names_what_to_install():
    code = (
        "import sys; sys.modules['verl'] = None\n"  # importing verl now fails, as when absent
        "from tirl.integrations.verl import require_verl\n"
        "require_verl()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0 and "ConfigError: verl is not installed" in run.stderr
    assert "pip install 'tirl[verl]'" in run.stderr


def test_importing_the_plugin_package_does_not_import_verl():
    code = "import sys, tirl.integrations.verl; print('verl' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
