"""The `tirl` command: a thin parser. Each subcommand is a module here (`tirl.cli.train`,
`tirl.cli.eval`, ...) with its `add_parser(subparsers)` beside its command function, which
parses, loads a config and calls library functions; the envs, synth and verl subcommands add
their parsers from their own packages. `main` turns user errors into one line and an exit code:
2 for a bad command line, config or path; 1 for failed samples, a failed weight push, a sandbox
that cannot start, a variant's process that died, or a full disk; 130 when interrupted."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

from tirl.backends.engine import WeightPushError  # light: no torch
from tirl.cli import ablate, config, eval, openenv, sandbox, serve, study, train, view
from tirl.cli.common import DEFAULT_CONFIG, DEFAULT_PRESET, preset_path
from tirl.cliargs import ArgumentParser
from tirl.config import ConfigError
from tirl.envs.cli import add_envs_parser
from tirl.eval.evaluate import FailedSamplesError  # light: no torch
from tirl.integrations.verl.cli import add_parser as add_verl_parser
from tirl.sandbox.api import SandboxError
from tirl.synth.cli import add_synth_parser
from tirl.train.apart import ChildDied  # light: no torch

__all__ = ["DEFAULT_CONFIG", "DEFAULT_PRESET", "build_parser", "main", "preset_path"]


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="tirl",
        description="Train and evaluate language models that reason with a Python interpreter.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (train, ablate, study, eval, config, sandbox, serve, view):
        command.add_parser(sub)
    add_envs_parser(sub)
    add_synth_parser(sub)
    add_verl_parser(sub)
    openenv.add_parser(sub)
    return parser


def _split_overrides(args: argparse.Namespace, extra: list[str]) -> None:
    """Let the config path be omitted (`tirl quickstart rl.steps=5` is all overrides), and
    take overrides that come after an option (`tirl eval URL --tokenizer T eval.k=2`, which
    argparse leaves over: it matches a command's positionals once, before the option)."""
    for item in extra:
        if not getattr(args, "takes_overrides", False) or item.startswith("-"):
            raise ConfigError(f"unrecognized arguments: {' '.join(extra)} (see tirl --help)")
        if args.config is None and "=" not in item:
            args.config = item
        else:
            args.overrides = [*args.overrides, item]
    if args.config and "=" in args.config and not _is_file(args.config):
        args.overrides = [args.config, *args.overrides]
        args.config = None


def _is_file(text: str) -> bool:
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


# Errors of the machine rather than of tirl: one line each (with the file), no traceback.
_PATH_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR}
_PATH_ERRORS |= {errno.ENAMETOOLONG, errno.EEXIST}
_SPACE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _os_error_line(err: OSError) -> str:
    where = err.filename if err.filename is not None else ""
    text = f"{err.strerror or err}" + (f": {str(where)!r}" if where != "" else "")
    if err.errno in _SPACE_ERRORS:
        text += " (what was finished is kept; free space, then rerun with --resume)"
    return text


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    try:
        args, extra = build_parser().parse_known_args(argv)
        _split_overrides(args, extra)
        return args.func(args)
    except ConfigError as err:
        print(f"tirl: error: {err}", file=sys.stderr)
        return 2
    except (FailedSamplesError, WeightPushError, SandboxError, ChildDied) as err:
        # results and the last checkpoint are kept; a rerun (--resume) continues from them
        print(f"tirl: error: {_one_line(err)}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.errno not in _PATH_ERRORS | _SPACE_ERRORS or os.environ.get("TIRL_DEBUG"):
            raise
        print(f"tirl: error: {_os_error_line(err)}", file=sys.stderr)
        return 2 if err.errno in _PATH_ERRORS else 1
    except KeyboardInterrupt:
        print("tirl: interrupted", file=sys.stderr)
        return 130
