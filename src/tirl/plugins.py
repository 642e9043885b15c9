"""Plugins: modules of the user's own that register extension points without editing tirl.

A plugin is any module whose import registers entries (`@register_source`, `@register_tool`,
`@register_advantage`, ...; the list is in docs/extending.md). tirl imports plugins from two
places, both before a config is checked, so a config may name what a plugin registers:

- the config's `plugins:` list: a module name (`my_lab.tirl_tasks`) or a `.py` file, relative
  to the config file's folder (`plugins: [tasks.py]`), imported by `load_config`;
- the `tirl.plugins` entry-point group of every installed distribution, loaded the first time
  any registry is read or a config is loaded, so an installed plugin works in every command,
  in a verl worker and from Python alike. An entry point names a module, or a function that
  is called once with no arguments. `TIRL_PLUGINS_AUTOLOAD=0` (or false, no, off) turns this
  off (pytest's switch for the same thing is PYTEST_DISABLE_PLUGIN_AUTOLOAD).

A plugin that cannot be imported is a one-line `ConfigError` naming it and why, never a
traceback, and so is one that exits (`sys.exit(0)` must not pass for a finished command) or
raises any other BaseException; only KeyboardInterrupt goes on, as the user's Ctrl-C. A plugin
is imported once per process, however often it is named.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tirl.errors import ConfigError

ENTRY_POINT_GROUP = "tirl.plugins"
AUTOLOAD_ENV = "TIRL_PLUGINS_AUTOLOAD"
_SKIP_HINT = f"{AUTOLOAD_ENV}=0 skips installed plugins"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

_installed_loaded = False


def autoload_enabled() -> bool:
    """Whether $TIRL_PLUGINS_AUTOLOAD lets installed plugins load (unset or empty: yes). Any
    usual spelling of true or false counts; anything else is refused rather than read as
    "on", since a user who wrote `nope` meant to switch them off."""
    raw = os.environ.get(AUTOLOAD_ENV, "")
    value = raw.strip().lower()
    if value in ("", *_TRUE):
        return True
    if value in _FALSE:
        return False
    raise ConfigError(
        f"{AUTOLOAD_ENV}={raw!r} must be one of {', '.join(_TRUE)} (load installed plugins) "
        f"or {', '.join(_FALSE)} (skip them)"
    )


def load_installed() -> None:
    """Import every `tirl.plugins` entry point (once per process)."""
    global _installed_loaded
    if _installed_loaded or not autoload_enabled():
        return
    _installed_loaded = True  # first: a plugin that reads a registry must not load us again
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"plugin {point.name!r} ({point.value}, entry point group {ENTRY_POINT_GROUP})"
        loaded = _guarded(where, point.load, hint=_SKIP_HINT)
        if callable(loaded):
            _guarded(where, loaded, hint=_SKIP_HINT)


def load_plugins(names: object, base_dir: Path | None = None, key: str = "plugins") -> list[str]:
    """Import the modules a config's `plugins:` list names (`key` is where it sits, for
    messages); a `.py` path is read relative to `base_dir` (the config file's folder). Returns
    the list with each file's path made absolute, as a saved copy of the config must hold it."""
    load_installed()
    if names is None:
        return []
    if not isinstance(names, Sequence) or isinstance(names, str):
        raise ConfigError(f"{key} must be a list of module names or .py files, got {names!r}", key)
    loaded = []
    for i, name in enumerate(names):
        where = f"{key}[{i}]"
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where} must be a module name or a .py file, got {name!r}", where)
        if name.endswith(".py"):
            path = Path(name) if Path(name).is_absolute() else (base_dir or Path.cwd()) / name
            name = str(path.resolve())
            _guarded(f"{where} {name!r}", lambda p=Path(name): _import_file(p), where)
        else:
            _guarded(f"{where} {name!r}", lambda n=name: importlib.import_module(n), where)
        loaded.append(name)
    return loaded


def _import_file(path: Path) -> None:
    """Import a plugin file under its stem's name (once: a second config naming it reuses it)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = f"tirl_plugin_{path.stem}"
    module = sys.modules.get(name)
    if module is not None:
        if getattr(module, "__file__", None) != str(path):
            raise ImportError(f"another plugin file named {path.stem}.py is already loaded")
        return
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a fixed file is imported afresh on the next try
        raise


def _guarded(where: str, load, key: str | None = None, hint: str = ""):
    """`load()`, with any failure turned into one line naming the plugin (and `hint`, how to
    do without it). BaseException too: a plugin's `sys.exit(0)` would otherwise end the
    command with success and no output, and a GeneratorExit would be a traceback. Only the
    user's Ctrl-C (KeyboardInterrupt) goes on as itself."""
    after = f" ({hint})" if hint else ""
    try:
        return load()
    except KeyboardInterrupt:
        raise
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}{after}", key) from None
    except BaseException as e:  # a plugin's own bug: say which plugin and what, not a traceback
        text = " ".join(str(e).split()) or type(e).__name__
        if isinstance(e, SystemExit):
            text = f"the plugin exited (sys.exit({e.code!r}))"
        message = f"{where}: cannot load: {type(e).__name__}: {text}{after}"
        raise ConfigError(message, key) from None
