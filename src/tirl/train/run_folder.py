"""Run folders of `tirl train` / `tirl quickstart` (`out_dir/name`) and `tirl ablate` (`--out`):
what is checked, locked and cleared before a run starts. Nothing here imports torch, so the CLI
can call it before the slow imports.

Rules:
- `name` must be a plain folder name (`tirl.files.check_plain_name`: not empty, no path
  separator, not '.' or '..', no NUL), checked here whatever the config layer checked, so a run
  folder is always one level inside `out_dir`.
- A fresh run locks the folder (`tirl.files.lock_folder`), then removes only the entries tirl
  writes there (`RUN_ENTRIES` / `ABLATE_ENTRIES`, with their `.NAME.tmp` / `.NAME.old`
  temporaries); a file a user put in the folder stays. A folder that is not empty and that tirl
  did not make (no `.tirl.lock`) or that another tirl command made (an eval folder, an
  ablation) is refused, not cleared.
- `--resume` needs the folder; it removes nothing.
- Links: tirl never writes through a symbolic link out of its run folder. A fresh run removes a
  link standing where it writes (`code -> ../../elsewhere`: the link, not what it points to);
  `--resume` refuses one, in one line.
- A second process on a locked folder is refused in one line naming the holder
  (`tirl.files.FolderInUse`, a `ConfigError`: `tirl.cli.main` prints it, exit code 2). The lock
  lasts as long as the process; the kernel drops it when the process dies, even by kill -9.
- Under torchrun only rank 0 (environment RANK=0) checks, locks and clears; other ranks touch
  nothing (they read the folder on resume, which therefore must be on a shared file system).

Limits: entries are matched by name, so a user file given a name tirl uses (`report.md`,
`plots/`, `code/sft`) is tirl's. Folders made by a tirl older than the lock file have no
`.tirl.lock` and are refused for a fresh run (they can still be resumed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tirl.config import ConfigError
from tirl.files import (
    LOCK_NAME,
    FolderLock,
    check_plain_name,
    check_unlocked,
    lock_folder,
    read_lock_info,
    remove,
)

# Entries a training run writes, as regular expressions over the path's parts (each part must
# match in full). Folders named as a prefix (`code`, `text`) are containers: only the listed
# entries inside them are removed, then the container if it is left empty.
RUN_ENTRIES: tuple[str, ...] = (
    r"config\.yaml",
    r"metrics\.jsonl",
    r"eval\.json",
    r"eval_progress\.json",
    r"report\.md",
    r"report\.html",
    r"plots",
    r"samples",
    r"tensorboard",
    r"wandb",
    r"(code|text)/(sft|rl|rl_state|metrics\.jsonl|eval_progress\.json)",
)

# An ablation folder: its summary files and one run folder per seed (`seed0`, `seed1`, ...),
# whose content is the ablation's own.
ABLATE_ENTRIES: tuple[str, ...] = (
    r"results\.json",
    r"ablation\.md",
    r"metrics\.jsonl",
    r"report\.md",
    r"report\.html",
    r"plots",
    r"seed\d+",
)


def is_main_process() -> bool:
    """True unless this is a torchrun rank other than 0 (read from the environment, before any
    process group exists)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return True
    return int(os.environ.get("RANK", "0") or 0) == 0


def _matches(folder: Path, parts: list[str]) -> Iterator[Path]:
    """Paths under `folder` whose parts match `parts` in full; the last part also matches the
    `.NAME.tmp` / `.NAME.old` temporaries of `tirl.files.replacing`."""
    if not parts or not folder.is_dir() or folder.is_symlink():
        return
    head, rest = parts[0], parts[1:]
    leaf = re.compile(rf"(?:{head})" if rest else rf"(?:{head})|\.(?:{head})\.(?:tmp|old)")
    for entry in sorted(folder.iterdir()):
        if not leaf.fullmatch(entry.name):
            continue
        if rest:
            yield from _matches(entry, rest)
        else:
            yield entry


def entry_links(folder: Path, entries: Sequence[str]) -> list[Path]:
    """Symbolic links under `folder` where tirl writes (an entry, or a container of one, such
    as `code`): a run writing through one would write outside its folder."""
    found = []

    def walk(where: Path, parts: list[str]) -> None:
        if not parts or not where.is_dir():
            return
        head = re.compile(rf"(?:{parts[0]})|\.(?:{parts[0]})\.(?:tmp|old)")
        for entry in sorted(where.iterdir()):
            if not head.fullmatch(entry.name):
                continue
            if entry.is_symlink():
                found.append(entry)
            else:
                walk(entry, parts[1:])

    for pattern in entries:
        walk(folder, pattern.split("/"))
    return found


def clear_entries(folder: Path, entries: Sequence[str]) -> list[Path]:
    """Remove the entries of `folder` that match `entries` (see `RUN_ENTRIES`); a container
    left empty goes too. Returns what was removed."""
    removed = []
    for pattern in entries:
        for path in list(_matches(folder, pattern.split("/"))):
            remove(path)
            removed.append(path)
    for path in {p.parent for p in removed if p.parent != folder}:
        try:
            path.rmdir()  # only if empty: a user's file inside keeps its container
        except OSError:
            pass
    return removed


def check_fresh(folder: Path, kind: str) -> None:
    """Refuse to start a fresh run in a folder that is not empty and that tirl's `kind`
    command did not make. Reads only."""
    if not os.path.lexists(folder):
        return
    if not folder.is_dir():
        raise ConfigError(f"{folder} exists and is not a folder; choose another name or out_dir")
    if not any(folder.iterdir()):
        return
    if not (folder / LOCK_NAME).is_file():
        raise ConfigError(
            f"refusing to start a fresh run in {folder}: it is not empty and tirl did not make it"
            f" (no {LOCK_NAME}); move its files away or choose another folder"
        )
    made_by = read_lock_info(folder).get("made_by")
    if made_by and made_by != kind:
        raise ConfigError(
            f"refusing to start a fresh run in {folder}: it is a `tirl {made_by}` folder; choose"
            " another folder"
        )


@contextmanager
def claim_folder(
    folder: Path, kind: str, entries: Sequence[str], *, resume: bool
) -> Iterator[FolderLock | None]:
    """Hold `folder` for a run of `kind` (see the module doc): refuse, lock, and on a fresh run
    clear tirl's earlier entries. Yields the lock (None on a torchrun rank other than 0)."""
    if not is_main_process():
        yield None
        return
    if resume:
        if not folder.is_dir():
            raise ConfigError(f"cannot resume {folder}: no such folder (no run started there)")
        with lock_folder(folder, kind) as lock:
            check_no_links(folder, entries)
            yield lock
        return
    check_fresh(folder, kind)
    with lock_folder(folder, kind) as lock:
        for link in entry_links(folder, entries):  # the link goes, never what it points to
            link.unlink()
        clear_entries(folder, entries)
        yield lock


def check_no_links(folder: Path, entries: Sequence[str]) -> None:
    """A resumed run writes into what is there: refuse links where it would write."""
    links = entry_links(folder, entries)
    if links:
        raise ConfigError(
            f"cannot resume {folder}: {links[0]} is a symbolic link, and tirl does not write"
            " through links out of its run folder; replace it with a folder"
        )


@contextmanager
def run_folder(
    out_dir: str | Path, name: str, *, resume: bool, kind: str = "train"
) -> Iterator[Path]:
    """`out_dir/name`, checked, locked and (fresh run) cleared for the duration of the block."""
    check_plain_name(name, "name")
    folder = Path(out_dir) / name
    with claim_folder(folder, kind, RUN_ENTRIES, resume=resume):
        yield folder


def check_run_folder(out_dir: str | Path, name: str, *, resume: bool, kind: str = "train") -> None:
    """What `run_folder` would refuse, checked without creating, locking or removing anything,
    so the CLI can refuse at once, before the slow imports. The lock is taken again (for real)
    when the run starts, so a process that claims the folder meanwhile is still refused."""
    check_plain_name(name, "name")
    folder = Path(out_dir) / name
    if not is_main_process():
        return
    if resume and not folder.is_dir():
        raise ConfigError(f"cannot resume {folder}: no such folder (no run started there)")
    if not resume:
        check_fresh(folder, kind)
    check_unlocked(folder)
