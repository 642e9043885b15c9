"""The tests against the real OpenEnv (`tests/openenv_side/`), run with `tirl[openenv]`'s pins in
an environment of their own (`tests/side_venv.py`), so that this suite's one command runs them,
never skipped; and the one-line errors of the server's command, which need no openenv."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import SIDE_SUITES
from side_venv import ROOT, side_suite

SERVER = "tirl.integrations.openenv.server"


@pytest.mark.side_suite("openenv_side")
def test_the_openenv_tests_pass_against_the_real_package():
    summary = side_suite("openenv_side")
    SIDE_SUITES.append(f"tests/openenv_side, against the real openenv-core: {summary}")


def _serve(*args: str, hide_openenv: bool = True) -> subprocess.CompletedProcess:
    """The server's command, with openenv made unimportable (as where it is not installed)."""
    hide = "import sys; sys.modules['openenv'] = None\n" if hide_openenv else ""
    code = f"{hide}from {SERVER} import main\nraise SystemExit(main({list(args)!r}))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )


def _one_line_error(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip()
    assert "\n" not in line and line.startswith("tirl: error: "), run.stderr
    assert run.stdout == ""  # nothing listened
    return line


def test_without_openenv_the_server_names_the_extra_to_install():
    line = _one_line_error(_serve("--source", "arithmetic", "--port", "0"))
    assert "openenv-core is not installed" in line and "pip install 'tirl[openenv]'" in line


def test_another_openenv_version_is_refused_naming_the_one_needed():
    code = (
        "import sys, types\n"
        "sys.modules['openenv'] = types.SimpleNamespace(__version__='9.9.9')\n"
        f"from {SERVER} import main\n"
        "raise SystemExit(main(['--source', 'arithmetic', '--port', '0']))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    line = _one_line_error(run)
    assert "openenv-core 9.9.9 is installed" in line and "needs 0.3.0" in line
    assert "pip install 'tirl[openenv]'" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--source", "no_such_source"], r"source\.source: unknown task source 'no_such_source'"),
        (["--source", '{"source": "arithmetic", "digitz": 3}'], r"digitz"),
        (["--source", '{"source": "races", "min_size": 4, "max_size": 2}'], r"min_size \(4\)"),
        (["--source", "{not json"], r"--source: not a JSON object"),
        (["--source", "[1, 2]"], r"unknown task source '\[1, 2\]'"),
        (["--source", "arithmetic", "--set", "max_tool_calls=-1"], r"max_tool_calls"),
        (["--source", "arithmetic", "--set", "protocol=xml"], r"protocol"),
        (["--source", "arithmetic", "--set", "sandbox.timeout_s=0"], r"sandbox\.timeout_s"),
        (["--source", "arithmetic", "--set", "colour=red"], r"colour"),
        (["--source", "arithmetic", "--host", "0.0.0.0"], r"refusing to listen on '0\.0\.0\.0'"),
        (
            ["--source", "arithmetic", "--port", "70000"],
            r"--port: must be an integer in \[0, 65535\]",
        ),
    ],
)
def test_bad_server_input_is_one_line_before_anything_listens(args, expected):
    """Checked before openenv is needed: the same line whether or not it is installed."""
    line = _one_line_error(_serve(*args, "--port", "0") if "--port" not in args else _serve(*args))
    assert re.search(expected, line), line


def test_the_openenv_package_imports_without_openenv():
    """architecture.md: integrations import anything, but this one must not need openenv to be
    imported (the CLI and the settings use it), and nothing of tirl's core imports it."""
    code = (
        "import sys; sys.modules['openenv'] = None\n"
        "import tirl.integrations.openenv, tirl.integrations.openenv.settings\n"
        "import tirl.integrations.openenv.server\n"
        "print(sorted(m for m in sys.modules if m.startswith(('openenv', 'gradio'))))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['openenv']", run.stdout  # only the None placeholder
