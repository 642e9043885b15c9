"""Command-line argument checks shared by every `tirl` subcommand.

- `ArgumentParser` reports a bad flag in one line (`tirl: error: argument -k: ...`) instead of
  argparse's usage block, with exit code 2 like every other user error.
- `number(int, ">= 1")` is an argparse `type=` that accepts only finite numbers in the documented
  range, the same range syntax as config fields (`tirl.config.Range`); its range is in `--help`.
- `output_dir` and `output_file` check an output path before any work is done: not a file where a
  folder is wanted (or the reverse), and inside a folder that can be written. They create
  nothing; a path that exists is left as it is.

Errors here are about what the user typed; what the machine does later (a full disk) is
reported by `tirl.cli.main`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from tirl.config import ConfigError, Range

_HOST = re.compile(r"[A-Za-z0-9._:%-]+")


def bind_host(text: str) -> str:
    """An argparse `type=`: the address or host name a server binds (IPv6 without brackets)."""
    if text.startswith("[") and text.endswith("]"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: write an IPv6 address without brackets, e.g. {text[1:-1]}"
        )
    if not _HOST.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an address or host name (letters, digits, '.', ':', '-'; no spaces)"
        )
    return text


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are `ConfigError`s, which `tirl.cli.main` prints as one line with
    exit code 2 (argparse prints its usage block); subparsers made from it inherit this."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")


def number(cast: type, bounds: str) -> Callable[[str], float]:
    """An argparse `type=`: `cast` (int or float) of the text, finite and within `bounds`."""
    rng = Range.parse(bounds)
    kind = "an integer" if cast is int else "a number"

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {kind} {_words(rng)}, got {text!r}"
            ) from None
        if not math.isfinite(value) or value not in rng:
            raise argparse.ArgumentTypeError(f"must be {kind} {_words(rng)}, got {text!r}")
        return value

    parse.__name__ = f"{cast.__name__} {bounds}"
    parse.range = rng  # type: ignore[attr-defined]  # for tests and help text
    return parse


def _words(rng: Range) -> str:
    text = str(rng)
    return f"in {text}" if text[0] in "[(" else text


def _path(text: str) -> Path:
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"must be a path, got {text!r}")
    return Path(text)


def _writable_parent(path: Path) -> None:
    """The nearest existing folder above `path` must be a folder we can write in."""
    parent = path.absolute().parent
    try:
        while not parent.exists():
            parent = parent.parent
    except OSError as e:  # a name too long
        raise argparse.ArgumentTypeError(f"{path}: {e.strerror}") from None
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{path}: cannot write in {parent} (permission denied)")


def output_dir(text: str) -> Path:
    """An argparse `type=` for an output folder (it may exist; a file there is refused)."""
    path = _path(text)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e.strerror}") from None
    if exists and not is_dir:
        raise argparse.ArgumentTypeError(f"{path} is a file, not a folder")
    if exists and not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {path} (permission denied)")
    if not exists:
        _writable_parent(path)
    return path


def output_file(text: str) -> Path:
    """An argparse `type=` for an output file (replaced if it exists; a folder is refused)."""
    path = _path(text)
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e.strerror}") from None
    if is_dir or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{path} is a folder; give a file name")
    if exists and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {path} (permission denied)")
    _writable_parent(path)
    return path


def input_path(text: str) -> Path:
    """An argparse `type=` for a file or folder that must exist."""
    path = _path(text)
    try:
        if path.exists():
            return path
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e.strerror}") from None
    raise argparse.ArgumentTypeError(f"{path} does not exist")


def require_device(device: str) -> None:
    """The configured torch device must exist on this machine (its name was checked on load;
    this imports torch, so it runs after every other config check)."""
    import torch

    kind, _, index = device.partition(":")
    present = {
        "cpu": lambda: True,
        "cuda": lambda: torch.cuda.is_available() and int(index or 0) < torch.cuda.device_count(),
        "mps": lambda: torch.backends.mps.is_available(),
        "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
    }[kind]()
    if not present:
        raise ConfigError(f"device {device!r} is not available on this machine (try device=cpu)")


def check_model_source(name: str, what: str, need_weights: bool = True) -> None:
    """A local model folder must exist and hold a saved model; a `.gguf` file must be one; a
    shipped model's short name is fetched and converted when it is loaded
    (`tirl.models.sources`); anything else with at most one '/' is taken for a hub name
    (loaded, or refused offline, by transformers), unless it is close to a shipped name."""
    from tirl.models.sources import SHIPPED_MODELS, gguf_file_problem, unknown_name_problem

    path = Path(name).expanduser()
    if name.lower().endswith(".gguf"):
        problem = gguf_file_problem(path)
        if problem:
            raise ConfigError(f"{what} {name!r}: {problem}")
        return
    local = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if not path.exists():
        if name in SHIPPED_MODELS:
            return
        if local or not name.strip():
            raise ConfigError(f"{what} {name!r}: no such folder (and not a hub name)")
        problem = unknown_name_problem(name)
        if problem:
            raise ConfigError(f"{what}: {problem}")
        return
    if not path.is_dir():
        raise ConfigError(
            f"{what} {name}: is a file; give the folder a model was saved in (or a .gguf file)"
        )
    wanted = "config.json" if need_weights else "tokenizer_config.json"
    if not (path / wanted).is_file():
        raise ConfigError(f"{what} {name}: the folder holds no saved model (no {wanted})")
