"""tirl's task sources as an OpenEnv environment server (Meta/Hugging Face `openenv-core`).

OpenEnv environments are Gymnasium-style (`reset` / `step` / `state`) servers that trainers drive
over a WebSocket (TRL's `environment_factory`, among others). `tirl.integrations.openenv.server`
serves any tirl task source that way: `reset` gives a task, `step` takes the model's message,
runs its code blocks in a tirl sandbox session kept for the episode and returns their output,
or, for a message without code, scores it with the task's own scorer (the reward is tirl's).
`tirl.integrations.openenv.client.TirlEnvClient` is OpenEnv's `EnvClient` for it.

Importing this package does not import openenv: modules that need it call `require_openenv()`
first, which names the extra to install when it is missing or is another version.
"""

from __future__ import annotations

import os

from tirl.integrations import require_package

OPENENV_VERSION = "0.3.0"  # the openenv-core release this adapter is built and tested against
INSTALL_HINT = f"pip install 'tirl[openenv]' (openenv-core=={OPENENV_VERSION})"

# openenv-core imports gradio and huggingface_hub (its optional web UI, its Hub helpers). Neither
# is used here, and neither may report usage or reach the Hub from a training machine.
QUIET_ENV = {
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "ENABLE_WEB_INTERFACE": "false",  # openenv's create_app would mount the Gradio UI
}


def require_openenv() -> None:
    """Raise a one-line ConfigError unless openenv-core OPENENV_VERSION is importable; before
    importing it, turn off the telemetry of the packages it pulls in (QUIET_ENV)."""
    for key, value in QUIET_ENV.items():
        os.environ[key] = value
    require_package(
        "openenv", "openenv-core", OPENENV_VERSION, "tirl's environment server", INSTALL_HINT
    )
