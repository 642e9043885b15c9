"""What several subcommands share: the bundled presets, the config argument and its dotted
overrides, `--resume`, and the API-key and listening checks of the two servers."""

from __future__ import annotations

import argparse
import contextlib
import errno
import socket
from importlib import resources
from pathlib import Path

from tirl.config import ConfigError, load_config

DEFAULT_PRESET = "quickstart"
DEFAULT_CONFIG = f"{DEFAULT_PRESET}.yaml"


def preset_path(name: str) -> Path:
    """A preset bundled with tirl (`tirl/presets/NAME.yaml`)."""
    return Path(str(resources.files("tirl") / "presets" / f"{name}.yaml"))


# `--model NAME` (tirl quickstart, tirl ablate): the bundled preset for a pretrained instruct model
REAL_MODEL_PRESET = "real_model"


def with_model(
    config: str | None, overrides: list[str], model: str | None
) -> tuple[str | None, list[str]]:
    """The config and overrides of a command given `--model NAME`: the real-model preset (or
    the config given) with `model.name_or_path: NAME`; without `--model`, as given."""
    if model is None:
        return config, overrides
    return config or str(preset_path(REAL_MODEL_PRESET)), [
        f"model.name_or_path={model}",
        *overrides,
    ]


def load_study_config(cls, config: str | Path, overrides: list[str], quick: bool):
    """A study's config (`cls` has a `study.quick` list); with `--quick`, loaded again with that
    list's overrides first, so that the command's own still win (`tirl study races|synth`)."""
    cfg = load_config(cls, config, overrides)
    if quick:
        cfg = load_config(cls, config, [*cfg.study.quick, *overrides])
    return cfg


def load_run_config(path: str | None, overrides: list[str]):
    from tirl.run.config import RunConfig

    return load_config(RunConfig, path or preset_path(DEFAULT_PRESET), overrides)


def add_config_args(p: argparse.ArgumentParser, default: str = DEFAULT_CONFIG) -> None:
    """The positional config and its overrides; `default` names the preset the command loads
    without a config, as its help says."""
    p.add_argument("config", nargs="?", help=f"YAML config (default: the bundled {default})")
    p.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides, e.g. rl.lr=1e-4 data.train[0].digits=4",
    )
    p.set_defaults(takes_overrides=True)  # also those after an option (tirl.cli._split_overrides)


def add_resume_arg(p: argparse.ArgumentParser, where: str = "the run in out_dir/name") -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"continue {where}: finished phases are loaded, RL continues"
        " from its last checkpoint (rl.checkpoint_every), nothing is logged twice",
    )


@contextlib.contextmanager
def listen_errors(args: argparse.Namespace):
    """A server that cannot listen where it was told: one line naming --host / --port."""
    try:
        yield
    except socket.gaierror as e:
        raise ConfigError(f"--host {args.host!r}: no such address here ({e.strerror})") from None
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise ConfigError(f"cannot listen on {args.host} port {args.port}: {e.strerror}") from None


def server_key(args: argparse.Namespace) -> str | None:
    """The API key of `tirl serve` / `tirl sandbox serve` (tirl.httpauth), or None; refuses a
    non-loopback --host without one unless --insecure-no-auth."""
    from tirl.httpauth import APIKeyError, bind_refusal, key_from_env

    try:
        key = key_from_env(args.api_key_env)
    except APIKeyError as e:
        raise ConfigError(f"--api-key-env: {e}") from None
    refusal = bind_refusal(args.host, key, args.insecure_no_auth, "--api-key-env")
    if refusal:
        raise ConfigError(f"--host: {refusal}")
    return key


def add_auth_args(p: argparse.ArgumentParser) -> None:
    """The API-key flags of the two servers (the key itself never goes on the command line,
    where `ps` would show it)."""
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the API key clients must send as"
        " 'Authorization: Bearer <key>' (default: TIRL_API_KEY, if set; naming a variable"
        " that is unset is an error)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without an API key (anyone who can reach the port"
        " can use the server)",
    )
