"""Plugins (`tirl.plugins`): a package of the user's own extends `tirl train` without a line of
tirl changed, from an installed entry point or from the config's `plugins:` list, and a plugin
that cannot load is one line naming it.

The plugin package is tests/data/plugin_pkg (a task source, an advantage estimator and a tool);
each entry notes in $TIRL_DEMO_PLUGIN_LOG that it ran. Everything that registers runs in a
subprocess, so the registries of this test process stay as tirl ships them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from side_venv import layered_venv
from tiny_run import TINY, offline_env

from tirl.config import ConfigError
from tirl.plugins import AUTOLOAD_ENV, load_plugins

PLUGIN = Path(__file__).parent / "data" / "plugin_pkg"
# What the plugin registers, named by a config: its source, its estimator with a parameter,
# and its tool enabled beside Python (the source's demonstrations call it).
CONFIG = """\
variants: [code]
tools: [python, calc]
data:
  train: [{source: addition, digits: 2}]
rl:
  advantage: centered
  advantage_params: {scale: 2.0}
"""
SMALL = [a for a in TINY if not a.startswith(("rl.checkpoint_every", "variants"))]


def _tirl(python: Path | str, *args: str, log: Path, timeout: float = 600, **env: str):
    return subprocess.run(
        [str(python), "-m", "tirl.cli", *args],
        env={**offline_env(), "TIRL_DEMO_PLUGIN_LOG": str(log), **env},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _notes(log: Path) -> set[str]:
    return set(log.read_text().splitlines()) if log.exists() else set()


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory) -> Path:
    """A venv layered on this one with the plugin package pip-installed into it (a copy, so
    the build leaves nothing in the repository); its python."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, root / "src")
    python = layered_venv(root / "venv")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-build-isolation", "--no-index", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return python


def test_an_installed_plugin_extends_tirl_train_with_a_source_an_estimator_and_a_tool(
    plugin_venv, tmp_path
):
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    log = tmp_path / "notes.txt"
    done = _tirl(plugin_venv, "train", str(config), f"out_dir={tmp_path}", *SMALL, log=log)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = _notes(log)
    assert "source.demonstration" in notes  # SFT data came from the plugin's source
    assert "tool.calc" in notes  # its demonstrations' blocks ran with the plugin's tool
    assert "advantage.centered scale=2.0" in notes  # RL used its estimator, with the parameter
    records = [json.loads(x) for x in (tmp_path / "quickstart" / "metrics.jsonl").open()]
    assert {r["phase"] for r in records} == {"sft", "rl"}

    # Without the plugin the same config is refused in one line naming what is missing.
    done = _tirl(sys.executable, "config", str(config), log=log)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "'calc'" in done.stderr, done.stderr
    # ... and so it is in the plugin's venv with the autoloading switched off.
    done = _tirl(plugin_venv, "config", str(config), log=log, **{AUTOLOAD_ENV: "0"})
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_config_keys_lists_what_an_installed_plugin_registers(plugin_venv, tmp_path):
    done = _tirl(plugin_venv, "config", "--keys", log=tmp_path / "notes.txt")
    assert done.returncode == 0, done.stderr
    registered = done.stdout[done.stdout.index("registered") :]
    for line in ("task sources (", "advantage estimators (", "tools ("):
        assert line in registered
    for name in ("addition", "centered", "calc", "arithmetic", "grpo", "python"):
        assert f" {name}" in registered, name


def test_a_plugin_file_named_by_the_config_is_read_beside_it(tmp_path):
    folder = tmp_path / "experiment"
    folder.mkdir()
    shutil.copy(PLUGIN / "tirl_demo_plugin" / "__init__.py", folder / "my_plugin.py")
    config = folder / "run.yaml"
    config.write_text("plugins: [my_plugin.py]\n" + CONFIG)
    log = tmp_path / "notes.txt"
    # run from elsewhere: the file is found beside the config, not in the working directory
    done = _tirl(sys.executable, "config", str(config), log=log)
    assert done.returncode == 0, done.stderr
    assert f"- {folder / 'my_plugin.py'}" in done.stdout  # saved absolute: a resume finds it
    assert "source: addition" in done.stdout and "advantage: centered" in done.stdout


@pytest.mark.parametrize(
    ("plugins", "expected"),
    [
        ("nope", "plugins must be a list"),
        ([3], "plugins[0] must be a module name or a .py file"),
        (["tirl_no_such_module"], "plugins[0] 'tirl_no_such_module': cannot load:"),
        (["missing.py"], "plugins[0] '"),
        (["broken.py"], "cannot load: ZeroDivisionError: division by zero"),
    ],
)
def test_a_plugin_that_cannot_load_is_one_line_naming_it(tmp_path, plugins, expected):
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    with pytest.raises(ConfigError) as err:
        load_plugins(plugins, tmp_path)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_command_line_reports_a_broken_plugin_without_a_traceback(tmp_path):
    (tmp_path / "bad.py").write_text(
        textwrap.dedent("""\
            from tirl.tasks import register_source
            register_source("arithmetic")(object)  # not a source, and a name tirl has
        """)
    )
    (tmp_path / "run.yaml").write_text("plugins: [bad.py]\n")
    done = _tirl(sys.executable, "config", str(tmp_path / "run.yaml"), log=tmp_path / "n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "plugins[0]" in done.stderr and "cannot load: TypeError" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("import sys\nsys.exit(0)\n", "cannot load: SystemExit: the plugin exited (sys.exit(0))"),
        ("raise GeneratorExit\n", "cannot load: GeneratorExit"),
        ("raise BaseException('odd')\n", "cannot load: BaseException: odd"),
    ],
)
def test_a_plugin_that_exits_or_raises_a_base_exception_is_one_line(tmp_path, body, expected):
    (tmp_path / "exits.py").write_text(body)
    with pytest.raises(ConfigError) as err:
        load_plugins(["exits.py"], tmp_path)
    assert "plugins[0]" in str(err.value) and expected in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_plugin_interrupted_by_ctrl_c_is_still_an_interrupt(tmp_path):
    (tmp_path / "slow.py").write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_plugins(["slow.py"], tmp_path)


def test_a_plugin_that_calls_sys_exit_0_cannot_fake_a_finished_train(tmp_path):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "run.yaml").write_text("plugins: [exits.py]\n")
    done = _tirl(sys.executable, "train", str(tmp_path / "run.yaml"), f"out_dir={tmp_path}",
                 log=tmp_path / "n", timeout=120)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "plugins[0]" in done.stderr, done.stderr
    assert "SystemExit" in done.stderr and not (tmp_path / "quickstart").exists()


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """An entry point of the `tirl.plugins` group naming the module `tirl_fake_plugin` in
    tmp_path (whose body the test writes), seen by this process's next `load_installed`."""
    import importlib.metadata

    import tirl.plugins

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tirl.plugins, "_installed_loaded", False)
    monkeypatch.delitem(sys.modules, "tirl_fake_plugin", raising=False)
    point = importlib.metadata.EntryPoint("fake", "tirl_fake_plugin", "tirl.plugins")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [point])
    return tmp_path / "tirl_fake_plugin.py"


def test_an_installed_plugin_that_exits_names_the_switch_that_skips_it(installed_plugin):
    from tirl.plugins import load_installed

    installed_plugin.write_text("raise SystemExit(3)\n")
    with pytest.raises(ConfigError) as err:
        load_installed()
    message = str(err.value)
    assert "plugin 'fake'" in message and "SystemExit" in message, message
    assert f"{AUTOLOAD_ENV}=0" in message and "\n" not in message


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "No", "off", " off "])
def test_every_usual_spelling_of_false_switches_autoload_off(installed_plugin, monkeypatch, value):
    from tirl.plugins import load_installed

    installed_plugin.write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.setenv(AUTOLOAD_ENV, value)
    load_installed()  # nothing imported, so nothing raised


@pytest.mark.parametrize("value", ["1", "true", "Yes", "ON", ""])
def test_every_usual_spelling_of_true_loads_installed_plugins(installed_plugin, monkeypatch, value):
    from tirl.plugins import load_installed

    installed_plugin.write_text("raise RuntimeError('imported')\n")
    monkeypatch.setenv(AUTOLOAD_ENV, value)
    with pytest.raises(ConfigError, match="imported"):
        load_installed()


@pytest.mark.parametrize("value", ["nope", "2", "disable"])
def test_an_unknown_autoload_value_is_refused_in_one_line_naming_the_variable(
    installed_plugin, monkeypatch, value
):
    from tirl.plugins import load_installed

    installed_plugin.write_text("")
    monkeypatch.setenv(AUTOLOAD_ENV, value)
    with pytest.raises(ConfigError) as err:
        load_installed()
    assert AUTOLOAD_ENV in str(err.value) and repr(value) in str(err.value)
    assert "\n" not in str(err.value)
