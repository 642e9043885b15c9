"""tirl as a verl plugin: verl runs the cluster, the vLLM/SGLang servers, FSDP/Megatron and the
weight sync; tirl supplies what verl lacks (exact-match code boundaries, stateful sandbox
sessions, rewards from model tokens only, the budget schedule and stage expansion, RACES data
and the synthesis output).

Importing this package does not import verl: the data export and the config translation work
without it. Modules that need verl call `require_verl()` first, which names the extra to
install when verl is missing or is another version.
"""

from __future__ import annotations

from tirl.integrations import require_package

AGENT_LOOP_NAME = "tirl"  # the name tirl's agent loop is registered under in verl
VERL_VERSION = "0.9.1"  # the version tirl's plugin is built and tested against
INSTALL_HINT = f"pip install 'tirl[verl]' (verl=={VERL_VERSION} and the packages it needs)"


def require_verl() -> None:
    """Raise a one-line ConfigError unless verl VERL_VERSION is importable."""
    require_package("verl", "verl", VERL_VERSION, "tirl's plugin", INSTALL_HINT)
