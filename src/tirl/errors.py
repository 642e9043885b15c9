"""The user-error type every layer raises (here, below `tirl.config`, so that `tirl.plugins`,
which the config loader calls, can raise it too)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user error in a config: the message names the file or override (if any), the dotted
    key, the bad value and what was expected, on one line."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key  # the dotted key it is about; lets load_config say which input set it
