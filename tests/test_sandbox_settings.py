"""One sandbox settings type (`tirl.sandbox.config.SandboxConfig`), and what derives from it.

Every check here is generated from the dataclasses, so a limit added to `SandboxLimits` and to
`SandboxConfig` is checked with no edit here, and one added to only one of them fails:

- every session limit is a setting of the `sandbox:` section with the same default, a doc and
  (for a number) a range, and `SandboxConfig.limits()` carries every one of them;
- `tirl sandbox serve` has a flag for every setting that shapes its sessions, with the same
  default and range as the config: a value just outside the range is refused by both, the
  bound is accepted by both, and the settings the server's sessions get are the config's;
- a transport registered by a plugin declares settings of its own, which a config sets under
  `sandbox.options` and its factory receives, checked in one line when the config loads.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import typing
from dataclasses import dataclass, fields

import pytest

from tirl.cli.sandbox import add_parser, served_settings
from tirl.cliargs import ArgumentParser
from tirl.config import ConfigError, Range, from_dict, load_config, setting
from tirl.sandbox.config import (
    DEFAULT_PRELOAD,
    SANDBOX_TRANSPORTS,
    SERVED_SETTINGS,
    SandboxConfig,
    make_sandbox,
)
from tirl.sandbox.limits import MATH_PRELOAD, SandboxLimits

CONFIG_FIELDS = {f.name: f for f in fields(SandboxConfig)}
LIMIT_NAMES = [f.name for f in fields(SandboxLimits)]
HINTS = typing.get_type_hints(SandboxConfig)


def serve_parser() -> argparse.ArgumentParser:
    """The parser of `tirl sandbox serve`, as `tirl` builds it."""
    root = ArgumentParser(prog="tirl")
    add_parser(root.add_subparsers(dest="command"))
    (sandbox,) = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    (serve,) = [
        a for a in sandbox.choices["sandbox"]._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return serve.choices["serve"]


SERVE = serve_parser()
FLAGS = {a.dest: a for a in reversed(SERVE._actions) if a.option_strings}  # a dest's first


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def number_type(name: str) -> type | None:
    """int or float for a numeric setting (`int | None` included), else None."""
    found = [t for t in (HINTS[name], *typing.get_args(HINTS[name])) if t in (int, float)]
    return found[0] if found else None


def edge_values(name: str) -> tuple[object, object]:
    """(a value just outside the setting's range, a bound inside it), as the setting's type."""
    cast = number_type(name)
    rng: Range = CONFIG_FIELDS[name].metadata["range"]
    if rng.low is not None:
        outside = rng.low if rng.low_open else rng.low - 1
    else:
        outside = rng.high if rng.high_open else rng.high + 1
    inside = rng.high if rng.high is not None and not rng.high_open else rng.low + 1
    return cast(outside), cast(inside)


# ------------------------------------------------------------------ the one settings type


@pytest.mark.parametrize("name", LIMIT_NAMES)
def test_every_session_limit_is_a_documented_setting_with_the_same_default(name):
    f = CONFIG_FIELDS.get(name)
    assert f is not None, f"SandboxLimits.{name} is not a setting of SandboxConfig"
    assert getattr(SandboxConfig(), name) == getattr(SandboxLimits(), name)
    assert f.metadata.get("doc"), f"sandbox.{name} has no doc"
    if number_type(name) is not None:
        assert f.metadata.get("range") is not None, f"sandbox.{name} has no range"
    assert name in SERVED_SETTINGS


def test_limits_carries_every_setting_of_the_section():
    changed = {}
    for name in LIMIT_NAMES:
        if number_type(name) is None:
            changed[name] = not getattr(SandboxLimits(), name)
        else:
            changed[name] = edge_values(name)[1]
    cfg = from_dict(SandboxConfig, changed, "sandbox")
    assert dataclasses.asdict(cfg.limits()) == changed


def test_the_default_config_keeps_the_sessions_of_a_run_as_they_were():
    """tirl train / eval: the same three preloads and the same limits as before."""
    cfg = SandboxConfig()
    assert cfg.preload == list(DEFAULT_PRELOAD) == ["math", "fractions", "itertools"]
    assert cfg.limits() == SandboxLimits()
    assert "sympy" in MATH_PRELOAD and "sympy" not in DEFAULT_PRELOAD  # Sandbox()'s own default


# ------------------------------------------------------------------ tirl sandbox serve


@pytest.mark.parametrize("name", SERVED_SETTINGS)
def test_every_served_setting_is_a_serve_flag_with_the_configs_default(name):
    action = FLAGS.get(name)
    assert action is not None, f"tirl sandbox serve has no flag for sandbox.{name}"
    assert flag(name) in action.option_strings and flag(name) in SERVE.format_help()
    assert action.default == getattr(SandboxConfig(), name)
    if number_type(name) is not None:
        assert str(action.type.range) == str(CONFIG_FIELDS[name].metadata["range"])


@pytest.mark.parametrize("name", [n for n in SERVED_SETTINGS if number_type(n) is not None])
def test_a_served_number_has_one_range_in_the_config_and_the_flag(name):
    outside, inside = edge_values(name)
    with pytest.raises(ConfigError, match=f"sandbox.{name} must be"):
        from_dict(SandboxConfig, {name: outside}, "sandbox")
    with pytest.raises(ConfigError, match=flag(name)):
        SERVE.parse_args([flag(name), str(outside)])
    assert getattr(from_dict(SandboxConfig, {name: inside}, "sandbox"), name) == inside
    assert getattr(SERVE.parse_args([flag(name), str(inside)]), name) == inside


def test_the_served_sessions_get_the_settings_the_config_would_give():
    values = {"preload": ["math"], "kill_background": False, "cpu_s": 7}
    values |= {n: edge_values(n)[1] for n in SERVED_SETTINGS if n not in values and number_type(n)}
    argv = [flag("preload"), "math", "--no-kill-background"]
    argv += [x for n, v in values.items() if number_type(n) for x in (flag(n), str(v))]
    args = SERVE.parse_args([*argv, "--max-timeout-s", "86400"])
    assert served_settings(args) == from_dict(SandboxConfig, values, "sandbox")
    assert served_settings(SERVE.parse_args([])) == SandboxConfig()
    assert SERVE.parse_args(["--keep-background"]).kill_background is False  # the older flag
    assert SERVE.parse_args(["--preload", ""]).preload == []
    with pytest.raises(ConfigError, match="--preload: must list installed modules"):
        SERVE.parse_args(["--preload", "math,no_such_module_x"])


# ------------------------------------------------------------------ a plugin's own settings

PLUGIN = '''
"""A transport of a plugin: a cell budget over a local sandbox, with a setting of its own."""

from dataclasses import dataclass, replace

from tirl.config import setting
from tirl.sandbox.api import SandboxClient
from tirl.sandbox.config import make_sandbox
from tirl.sandbox.registration import register_transport
from tirl.sandbox.result import ExecResult, Status


@dataclass
class BudgetOptions:
    max_cells: int = setting(1, ">= 1", "cells it runs before it refuses more")


class BudgetSandbox(SandboxClient):
    def __init__(self, inner, max_cells):
        self.inner, self.left = inner, max_cells

    async def start(self):
        await self.inner.start()

    async def close(self):
        await self.inner.close()

    async def session(self):
        return await self.inner.session()

    async def run_once(self, code, timeout_s=None):
        if self.left == 0:
            return ExecResult(Status.ERROR, detail="the cell budget is spent")
        self.left -= 1
        return await self.inner.run_once(code, timeout_s)


@register_transport("budget_for_tests", options=BudgetOptions)
def budget_sandbox(cfg, options):
    return BudgetSandbox(make_sandbox(replace(cfg, kind="local", options={})), options.max_cells)
'''


@dataclass
class PluginRun:
    """A config with plugins and a sandbox section, as every tirl command's has."""

    plugins: list[str] = setting(factory=list)
    sandbox: SandboxConfig = setting(factory=SandboxConfig)


@pytest.fixture()
def plugin_config(tmp_path):
    """Write the plugin and a config naming it; load that config (with overrides)."""
    (tmp_path / "budget_plugin.py").write_text(PLUGIN, encoding="utf-8")
    path = tmp_path / "run.yaml"
    path.write_text(
        "plugins: [budget_plugin.py]\n"
        "sandbox: {kind: budget_for_tests, preload: [math], options: {max_cells: 2}}\n",
        encoding="utf-8",
    )
    yield lambda *overrides: load_config(PluginRun, path, overrides).sandbox
    SANDBOX_TRANSPORTS.unregister("budget_for_tests")
    sys.modules.pop("tirl_plugin_budget_plugin", None)


def test_a_plugin_transport_declares_settings_that_the_config_sets(plugin_config):
    cfg = plugin_config()
    assert "budget_for_tests" in SANDBOX_TRANSPORTS and cfg.transport_options().max_cells == 2

    async def use():
        async with make_sandbox(cfg) as sandbox:
            return [await sandbox.run_once(f"print({i} * 7)") for i in range(3)]

    first, second, third = asyncio.run(use())
    assert (first.stdout, second.stdout) == ("0\n", "7\n")
    assert third.detail == "the cell budget is spent"
    assert plugin_config("sandbox.options={}").transport_options().max_cells == 1  # its default


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("sandbox.options.max_cells=0", "sandbox.options.max_cells must be >= 1, got 0"),
        ("sandbox.options.max_cels=3", "unknown key 'sandbox.options.max_cels'"),
        ("sandbox.kind=local", "sandbox.options: transport local has no settings of its own"),
    ],
)
def test_a_bad_transport_setting_is_one_line_when_the_config_loads(plugin_config, override, words):
    with pytest.raises(ConfigError) as err:
        plugin_config(override)
    assert words in str(err.value) and "\n" not in str(err.value)
