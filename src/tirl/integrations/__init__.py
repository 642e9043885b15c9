"""Adapters to the engines users already run at scale (architecture.md: `integrations` may import
anything; nothing imports it but `cli`)."""

from __future__ import annotations

import importlib

from tirl.config import ConfigError


def require_package(module: str, distribution: str, version: str, needed_by: str, hint: str):
    """Import `module` (the pinned `distribution` `version`) or raise a one-line ConfigError
    naming what to install (`hint`); returns the module."""
    try:
        imported = importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{distribution} is not installed: {hint}") from None
    found = getattr(imported, "__version__", "unknown")
    if found != version:
        raise ConfigError(
            f"{distribution} {found} is installed; {needed_by} needs {version}: {hint}"
        )
    return imported
