"""How tirl writes to disk, so that a crash, a `kill -9` or a full disk never leaves a half-written
file that looks finished, and two tirl processes never write one folder at once.

- `replacing(path)` / `open_replacing(path)` / `write_text` / `write_bytes`: a file or a folder is
  written under a temporary sibling name (`.NAME.tmp`), flushed to disk (fsync), then renamed over
  `path`. Readers see the old version or the new one, never a part. On any error the temporary is
  removed and the error re-raised; an I/O error comes out as an `OSError` with its errno and the
  final path as filename (`tirl.cli.main` prints it in one line), also when the serializer hid it
  (torch's zip writer says "unexpected pos", safetensors wraps it in its own error type).
- Append-only JSONL (`repair_jsonl`, `read_jsonl`, `JsonlAppender`): records are appended one
  whole line per write; before the first append the file's torn tail (a last line cut short by a
  crash or a full disk) is cut off, so a new record never lands on a fragment. Readers skip lines
  that are not JSON objects.
- `lock_folder(folder, kind)`: an exclusive `fcntl.flock` on `folder/.tirl.lock`, held while the
  process runs and released by the kernel when it ends however it ends (kill -9 included), so a
  lock is never stale. The file names the holder (pid, host, command, start time) for the
  one-line refusal a second process gets, and which tirl command made the folder (`made_by`).
  `held_lock_fds()` lists this process's held locks, so that processes it starts to write the
  same folder (`tirl.train.apart`) can share them: the lock is then held until the last of them
  ends, and a folder is never taken over while any of its writers lives.
- `read_whole`: read a file back with a parser, a damaged file reported in one line.
- `json_text`: strict JSON (a nan written as null), for every JSON file tirl writes.
- `check_plain_name`: a name that must stay one folder level deep.

Limits: durability is what fsync and rename give on a local POSIX file system. On network file
systems rename is atomic on NFS but fsync and flock semantics depend on the server (flock over
NFSv4 is emulated with byte-range locks; over NFSv3 without a lock daemon it may not lock at
all). fcntl makes this module POSIX-only. Temporaries left by a killed process are removed by the
next write of the same path or by a fresh run of the folder (`tirl.train.run_folder`).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from tirl.config import ConfigError

LOCK_NAME = ".tirl.lock"


# ---------------------------------------------------------------------------------------------
# Whole files and folders, replaced atomically


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """Where `path` is written before it is renamed into place: `.NAME.tmp` beside it."""
    return path.with_name(f".{path.name}.{tag}")


def remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder tree; nothing if absent."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush a file, or every file and folder of a tree, to the disk."""
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                _fsync_path(Path(root) / name)
            _fsync_path(Path(root))
    else:
        _fsync_path(path)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync_path(path)
    except OSError:  # some file systems cannot fsync a folder; the rename is done either way
        pass


def as_os_error(exc: BaseException, path: Path, tmp: Path | None = None) -> OSError | None:
    """`exc` as an OSError naming `path`, when it is an I/O error that does not name its file
    (or names the temporary it was written under); None when it is no I/O error or already says
    where. safetensors reports I/O errors as text ("... (os error 28)"): its errno is read back."""
    if isinstance(exc, OSError):
        if exc.errno is None:
            return None
        where = None if exc.filename is None else str(exc.filename)
        if where is not None and (tmp is None or not where.startswith(str(tmp))):
            return None
        return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))
    found = re.search(r"os error (\d+)", str(exc))
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code), str(path))
    return None


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield the temporary path to write `path` under (a file or a folder: the caller decides);
    when the block ends without error, flush it to disk and rename it over `path` (an existing
    folder is moved aside first, then removed). On any error the temporary is removed and the
    error re-raised (an I/O error as an OSError naming `path`, see `as_os_error`)."""
    path = Path(path)
    if os.path.lexists(path) and not (path.is_file() or path.is_dir()):
        raise OSError(
            errno.EINVAL, "not a regular file or folder, refusing to replace it", str(path)
        )
    tmp, old = temp_sibling(path), temp_sibling(path, "old")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove(tmp)  # left by a process killed while writing this path
    try:
        yield tmp
        if not os.path.lexists(tmp):
            raise FileNotFoundError(errno.ENOENT, "nothing was written", str(path))
        _fsync_tree(tmp)
        if tmp.is_dir() and path.is_dir() and not path.is_symlink():
            remove(old)
            os.rename(path, old)
            os.rename(tmp, path)
            remove(old)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        try:
            remove(tmp)
        except OSError:
            pass
        named = as_os_error(exc, path, tmp)
        if named is not None:
            raise named from exc
        raise


class _RecordingFile:
    """A binary file that remembers the first OSError a write raised, for serializers that
    replace it with their own message."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str) -> Any:  # tell, seek, fileno, ...
        return getattr(self.file, name)


@contextmanager
def open_replacing(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file object that becomes `path` when the block ends without error (see
    `replacing`). `torch.save(obj, f)` into it: a full disk surfaces as OSError(ENOSPC) naming
    `path`, not as torch's "unexpected pos", and leaves no temporary behind."""
    with replacing(path) as tmp:
        recording = _RecordingFile(open(tmp, "wb"))
        try:
            yield recording  # type: ignore[misc]
            recording.file.close()  # a buffered write can fail here, on the last flush
        except BaseException:
            try:
                recording.file.close()
            except OSError:
                pass
            if recording.error is not None:
                raise recording.error from None
            raise


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `path` whole (atomically, see `replacing`)."""
    with open_replacing(path) as f:
        f.write(data)


def write_text(path: str | Path, text: str) -> None:
    """Write `path` whole as UTF-8 (atomically, see `replacing`)."""
    write_bytes(path, text.encode("utf-8"))


class DamagedFile(ConfigError):
    """A file tirl wrote cannot be read back; the message names it and what to do."""


def read_whole(path: str | Path, load: Callable[[BinaryIO], Any], remedy: str) -> Any:
    """`load(f)` of the file at `path`. I/O errors propagate as they are; anything else the
    parser raises (a file damaged outside tirl: a disk error, a truncated copy) becomes one
    DamagedFile line naming the file, the parser's first line and `remedy`."""
    with open(path, "rb") as f:
        try:
            return load(f)
        except OSError:
            raise
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            first = first.split(". ")[0][:200]  # torch's messages run on with advice
            raise DamagedFile(f"{path} cannot be read ({first}); {remedy}") from e


# ---------------------------------------------------------------------------------------------
# Append-only JSONL


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # not JSON, not UTF-8
        return False


def _lines_backwards(f: BinaryIO, size: int, chunk: int = 1 << 16) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) from the last line to the first."""
    pos, head = size, b""
    while pos > 0:
        step = min(chunk, pos)
        pos -= step
        f.seek(pos)
        parts = (f.read(step) + head).split(b"\n")
        head = parts[0]  # may begin in the chunk before
        offset, found = pos + len(head) + 1, []
        for part in parts[1:]:
            found.append((offset, part))
            offset += len(part) + 1
        yield from reversed(found)
    yield 0, head


def repair_jsonl(path: str | Path) -> int:
    """Cut the torn tail off an append-only JSONL file, so the next append starts a clean line.

    From the end back, every line that is not a whole JSON object is dropped (a last line cut
    short by a crash or a full disk, the NUL bytes some file systems leave after a power loss, a
    fragment an older tirl appended a record onto); the walk stops at the first good line. A good
    last line that only lacks its newline gets it. Lines before that one are left as they are
    (readers skip bad lines). Returns the number of bytes cut; 0 for a missing or non-regular
    file (e.g. /dev/null)."""
    path = Path(path)
    if not path.is_file():
        return 0
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        keep = 0
        for offset, line in _lines_backwards(f, size):
            if offset == size:  # the empty remainder after a final newline
                continue
            if _is_record(line):
                keep = offset + len(line) + 1
                if keep > size:  # a whole record that lost only its newline
                    f.seek(size)
                    f.write(b"\n")
                    return 0
                break
        if keep < size:
            f.truncate(keep)
        return size - keep


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """The JSON objects of a JSONL file, in order; lines that are not one are skipped."""
    path = Path(path)
    if not path.is_file():
        return
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


class JsonlAppender:
    """Appends records to a JSONL file, one whole line per `write` call.

    The file is repaired (`repair_jsonl`) when first opened. A write that fails part-way (a full
    disk) is cut back to where its line began before the OSError (naming the file) is raised, so
    this process never leaves a partial line; a process killed mid-write may, and the next opener
    repairs it. Lines reach the OS at once (no buffering); they are not fsynced one by one."""

    def __init__(self, path: str | Path, dumps: Callable[[Any], str] = json.dumps) -> None:
        self.path = Path(path)
        self.dumps = dumps
        self._file: BinaryIO | None = None

    def _open(self) -> BinaryIO:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            repair_jsonl(self.path)
            self._file = open(self.path, "ab", buffering=0)
        return self._file

    def append(self, record: dict) -> None:
        line = memoryview((self.dumps(record) + "\n").encode("utf-8"))
        f = self._open()
        start = os.fstat(f.fileno()).st_size
        try:
            while line:
                written = f.write(line)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                line = line[written:]
        except OSError as e:
            try:
                os.ftruncate(f.fileno(), start)
            except OSError:
                pass  # the next opener cuts the fragment
            named = as_os_error(e, self.path)
            if named is not None:
                raise named from e
            raise

    def rewrite(self, records: Iterable[dict]) -> None:
        """Replace the file by `records` (atomically), then go on appending to the new file."""
        self.close()
        if os.path.lexists(self.path) and not self.path.is_file():
            return  # /dev/null and the like: nothing to rewrite
        with open_replacing(self.path) as f:
            for record in records:
                f.write((self.dumps(record) + "\n").encode("utf-8"))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Folder locks


class FolderInUse(ConfigError):
    """Another process holds the folder's lock; the message names it."""


def check_plain_name(name: str, what: str = "name") -> None:
    """A name that stays one level inside its parent: not empty, no path separator, not '.' or
    '..', no NUL. Raises ConfigError. (The config layer checks too; folder code does not rely
    on it.)"""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{what} must not be empty", "name")
    if "\0" in name:
        raise ConfigError(f"{what} {name!r} must not contain a NUL byte", "name")
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if name in (".", "..") or any(s in name for s in seps):
        raise ConfigError(
            f"{what} {name!r} must be a plain folder name (no '/', '\\', '.' or '..')", "name"
        )


def _command() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("cli.py", "tirl", "__main__.py"):
        argv[0] = "tirl"
    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


def _read_info(fd: int) -> dict:
    try:
        data = os.pread(fd, 65536, 0)
        info = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def read_lock_info(folder: str | Path) -> dict:
    """What the folder's lock file says (the last holder; {} if there is none)."""
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return _read_info(fd)
    finally:
        os.close(fd)


def _pid_ended(info: dict) -> bool:
    """True if the named holder ran on this host and has ended (the lock is then held by
    processes it started: see `held_lock_fds`)."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


def describe_holder(info: dict) -> str:
    if not info.get("pid"):
        return "another process (it has not written its name yet)"
    details = []
    if info.get("command"):
        details.append(str(info["command"]))
    if info.get("started"):
        details.append(f"started {info['started']}")
    text = f"pid {info['pid']} on {info.get('host', '?')}"
    text += f" ({', '.join(details)})" if details else ""
    if _pid_ended(info):
        text += "; that process has ended, but processes it started still write there"
    return text


_HELD: set[int] = set()  # descriptors of the folder locks this process holds


def held_lock_fds() -> list[int]:
    """The descriptors of the folder locks this process holds. A process started with a
    duplicate of one shares the lock (flock belongs to the open file, not the process): the
    folder stays locked until every holder has ended or closed it."""
    return sorted(_HELD)


class FolderLock:
    """The held lock of a folder (see `lock_folder`); `release()` or leave the `with` block."""

    def __init__(self, folder: Path, fd: int, info: dict) -> None:
        self.folder = folder
        self.info = info
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_unlocked(folder: str | Path) -> None:
    """Raise FolderInUse if another process holds `folder`'s lock; writes nothing (a probe
    before the real `lock_folder`, which is still needed: the answer can change meanwhile)."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise FolderInUse(
            f"{folder} is in use by {describe_holder(_read_info(fd))}; wait for it to end (or"
            " stop it), or use another folder"
        ) from None
    finally:
        os.close(fd)


def lock_folder(folder: str | Path, kind: str) -> FolderLock:
    """Create `folder` if needed and take its lock, or raise FolderInUse naming the holder.

    `kind` is the tirl command working in the folder ("train", "eval", "synth", ...); the lock
    file keeps the kind of the command that first locked it as `made_by`. The lock file stays
    when the lock is released (removing it would let two processes lock two different files)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_info(fd)
        os.close(fd)
        raise FolderInUse(
            f"{folder} is in use by {describe_holder(holder)}; wait for it to end (or stop it),"
            " or use another folder"
        ) from None
    except OSError as e:
        os.close(fd)
        raise OSError(e.errno, f"cannot lock the folder: {e.strerror}", str(path)) from e
    info = {
        "made_by": _read_info(fd).get("made_by") or kind,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": _command(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    try:
        data = (json.dumps(info) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as e:  # a full disk: the lock is held all the same, without the holder's name
        os.close(fd)
        named = as_os_error(e, path)
        raise (named or e) from e
    _HELD.add(fd)
    return FolderLock(folder, fd, info)


def json_text(value: Any, indent: int | None = 2) -> str:
    """`value` as strict JSON, a nan or infinite float (a rate with nothing to divide by)
    written as null: JSON has no NaN, and strict readers (jq, JavaScript, Go) refuse the `NaN`
    that `json.dumps` writes by default."""
    return json.dumps(_finite_or_none(value), indent=indent, allow_nan=False)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
