"""Linux primitives behind the sandbox's isolation, called from the zygote and session processes.

Each function does one thing with one kernel interface (namespaces, mounts, credentials,
seccomp) and reports failure instead of raising where the caller can degrade. The policy (which
of them a session gets, and what happens when one is missing) lives in `_zygote.py` (the
zygote's own namespaces and uid block) and `_session_process.py` (each session's), and what it
means for users is written down in the docstring of `tirl.sandbox.local`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import random
import shutil
import stat
import struct
import tempfile
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
) | CLONE_NEWNET

MS_NOSUID, MS_NODEV, MS_MOVE, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8192, 4096, 16384, 1 << 18
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 1
# the same numbers on x86_64 and aarch64 (syscalls added since 5.0 are numbered alike)
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, MOVE_MOUNT_F_EMPTY_PATH = 1, os.O_CLOEXEC, 0x4

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def prctl(option: int, arg: int | ctypes._Pointer = 0) -> bool:
    return _libc.prctl(option, arg, 0, 0, 0) == 0


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


# ---------------------------------------------------------------------------------------------
# Namespaces and mounts


def last_error() -> str:
    """The message of the errno the last failed libc call left behind."""
    return os.strerror(ctypes.get_errno())


def unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


def unshare_with_user_namespace(flags: int) -> bool:
    """unshare(CLONE_NEWUSER | flags), keeping our uid and gid mapped to themselves (the only
    mapping an unprivileged process may write itself; no fake root inside). The new user
    namespace gives the capabilities the other new namespaces need to be set up."""
    uid, gid = os.getuid(), os.getgid()  # once unshared, they read as the overflow id
    if not unshare(CLONE_NEWUSER | flags):
        return False
    for path, text in (
        ("/proc/self/setgroups", "deny"),
        ("/proc/self/uid_map", f"{uid} {uid} 1"),
        ("/proc/self/gid_map", f"{gid} {gid} 1"),
    ):
        with open(path, "w") as f:
            f.write(text)
    return True


def _bytes_or_none(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    ret = _libc.mount(
        _bytes_or_none(source),
        target.encode(),
        _bytes_or_none(fstype),
        flags,
        data.encode() or None,
    )
    _check(ret, f"mount {target}")


def umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def make_mounts_private() -> None:
    """Nothing mounted from here on propagates back to the host's mount namespace."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns_fd")]


def _mount_setattr(path: str, recursive: bool, set_: int, clr: int) -> bool:
    attr = _MountAttr(set_, clr, 0, 0)
    ret = _libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(path.encode()),
        ctypes.c_uint(AT_RECURSIVE if recursive else 0),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    return ret == 0


def make_root_readonly() -> bool:
    """Every mount under / becomes read-only, recursively (mount_setattr, Linux 5.12+), except
    /proc itself: a process writes its own uid_map there to enter a user namespace, and procfs
    checks its files' permissions on its own. Mounts made afterwards (a session's tmpfs) are
    writable."""
    if not _mount_setattr("/", True, MOUNT_ATTR_RDONLY, 0):
        return False
    _mount_setattr("/proc", False, 0, MOUNT_ATTR_RDONLY)
    return True


def mount_tmpfs(target: str, size_mb: int, uid: int, gid: int, mode: str = "0755") -> None:
    opts = f"size={size_mb}m,mode={mode},uid={uid},gid={gid}"
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def _others_can_enter(path: str) -> bool:
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


def _minimal_paths(paths: list[str]) -> list[str]:
    """Existing directories among `paths`, without those inside another one of them."""
    dirs = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)} - {"/"})
    kept: list[str] = []
    for d in dirs:
        if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(d)
    return kept


def expose_paths(paths: list[str]) -> list[str]:
    """Make `paths` reachable by unprivileged uids in this mount namespace.

    Python is often installed under a directory only its owner may enter (pyenv in /root, a
    virtualenv in a private home, a clone in a 0700 directory under /tmp). A session running as
    an unprivileged uid could then not import anything that was not preloaded. For each
    directory on the way to a path that others may not enter, this mounts an empty tmpfs (mode
    0755) over it and puts bind mounts of just the needed paths into it, so nothing else of that
    directory becomes visible. Returns the blocking directories that were covered. Call in a
    private mount namespace, before make_root_readonly.

    The bind mounts are detached copies made with open_tree (Linux 5.2+) before the tmpfs hides
    their sources, so nothing is created on the host's file system. Older kernels fall back to a
    staging directory under the temporary directory, named after this process
    (`tirl-expose-<pid>-*`, removed at once; `remove_stale_dirs` removes one left by a process
    that was killed in between).
    """
    blocked: dict[str, list[str]] = {}
    for p in _minimal_paths(paths):
        parts = p.strip("/").split("/")
        for i in range(1, len(parts)):  # ancestors only: the path itself is readable or not
            ancestor = "/" + "/".join(parts[:i])
            if not _others_can_enter(ancestor):
                blocked.setdefault(ancestor, []).append(p)
                break
    if not blocked:
        return []
    try:
        _expose_detached(blocked)
    except _NoOpenTree:
        _expose_staged(blocked)
    return sorted(blocked)


class _NoOpenTree(Exception):
    """The kernel has no open_tree/move_mount (before 5.2), or refuses them here."""


def _open_tree_clone(path: str) -> int:
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPEN_TREE),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(path.encode()),
        ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE),
    )
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"open_tree {path}: {os.strerror(e)}")
    return fd


def _move_mount_fd(fd: int, target: str) -> None:
    ret = _libc.syscall(
        ctypes.c_long(SYS_MOVE_MOUNT),
        ctypes.c_int(fd),
        ctypes.c_char_p(b""),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(target.encode()),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
    )
    _check(ret, f"move_mount {target}")


def _expose_detached(blocked: dict[str, list[str]]) -> None:
    clones: list[tuple[int, str]] = []
    try:
        for needed in blocked.values():
            for p in needed:
                try:
                    clones.append((_open_tree_clone(p), p))
                except OSError as e:
                    if e.errno in (errno.ENOSYS, errno.EPERM) and not clones:
                        raise _NoOpenTree from e  # the first call tells whether it works at all
                    raise
        for top in blocked:
            mount_tmpfs(top, 1, 0, 0, "0755")
        for fd, p in clones:
            os.makedirs(p, mode=0o755, exist_ok=True)
            _move_mount_fd(fd, p)
    finally:
        for fd, _ in clones:
            os.close(fd)


def _expose_staged(blocked: dict[str, list[str]]) -> None:
    stage = tempfile.mkdtemp(prefix=f"{EXPOSE_PREFIX}{os.getpid()}-")
    try:
        mount_tmpfs(stage, 1, 0, 0, "0700")
        try:
            staged = []
            for top, needed in blocked.items():
                for p in needed:  # one slot per path over all tops: names must not collide
                    slot = f"{stage}/{len(staged)}"
                    os.mkdir(slot)
                    mount(p, slot, None, MS_BIND | MS_REC)
                    staged.append((top, slot, p))
            for top in blocked:
                mount_tmpfs(top, 1, 0, 0, "0755")
            for _, slot, p in staged:
                os.makedirs(p, mode=0o755, exist_ok=True)
                mount(slot, p, None, MS_MOVE)
        finally:
            umount(stage)
    finally:
        os.rmdir(stage)


# Names of what the sandbox creates in the temporary directory. Both carry the pid of the process
# that made them, so a later start can tell (remove_stale_dirs) whether their owner is gone.
EXPOSE_PREFIX = "tirl-expose-"
HOST_DIR_PREFIX = "tirl-sandbox-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_dirs(tmpdir: str | None = None) -> list[str]:
    """Remove `tirl-expose-<pid>-*` and `tirl-sandbox-<pid>-*` directories of the temporary
    directory whose owning process is gone (it was killed before it could clean up). Only
    directories owned by this process's uid are touched, and one whose pid is alive (or
    reused) is left alone. Returns what was removed."""
    tmpdir = tmpdir or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(tmpdir))
    except OSError:
        return removed
    for entry in entries:
        for prefix in (EXPOSE_PREFIX, HOST_DIR_PREFIX):
            if not entry.name.startswith(prefix):
                continue
            pid_text, dash, _ = entry.name[len(prefix) :].partition("-")
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                break
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                break
            if not (dash and pid_text.isdigit()):
                # named by an older tirl, without the pid: only an expose stage (always empty
                # on the host) that has not been touched for an hour
                if prefix != EXPOSE_PREFIX or time.time() - st.st_mtime < 3600:
                    break
            elif _pid_alive(int(pid_text)):
                break
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
            break
    return removed


# ---------------------------------------------------------------------------------------------
# Credentials


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]


def drop_capabilities() -> None:
    """Empty the effective, permitted and inheritable capability sets (for good: nothing this
    process execs can regain them, see `no_new_privileges`)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit data words
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def become(uid: int, gid: int) -> None:
    """Switch every id to uid/gid with no supplementary groups. From root to another uid this
    also clears all capabilities."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


class UidBlock:
    """A block of 65,536 uids that no other tirl sandbox on this machine uses at the same time.

    As root, each session family (a session and its forks) runs as its own uid, so the kernel
    keeps families apart: they cannot signal or ptrace one another, RLIMIT_NPROC counts per
    family, and a family is ended by killing every process of its uid. Uids are global to the
    machine, so concurrently running sandboxes must not hand out the same ones: each claims a
    block by holding an exclusive flock on a file named after it in LOCK_DIR, which the kernel
    releases when the process dies.

    Lock files do not pile up: `release` unlinks the file while still holding the lock, and a
    new block first takes the locks of files nobody holds (left by a zygote that was SIGKILLed)
    and unlinks them. Both are safe against a process that opened the file just before it was
    unlinked, because a holder only trusts its lock after checking that the path still names
    the inode it locked (`_lock`). Before letting go of those stale blocks, and before using its
    own, it kills every process still running with one of their uids (what a SIGKILLed
    zygote's sessions may have left running), so a family never shares its uid with a stranger.
    """

    BASE = 1 << 31  # far above the uids of real accounts
    SIZE = 1 << 16
    COUNT = (1 << 15) - 1  # BASE + COUNT * SIZE stays below 2**32 - 1 (the invalid uid)
    LOCK_DIR = "/run/tirl-sandbox-uids"

    def __init__(self) -> None:
        os.makedirs(self.LOCK_DIR, mode=0o700, exist_ok=True)
        # Kept to unlink our file at exit: an fd opened before the zygote enters its own mount
        # namespace still refers to the host's (writable) mount after the root is made
        # read-only there. So make the block before unsharing.
        self._dir_fd = os.open(self.LOCK_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        stale = self._lock_stale()
        try:
            for index in random.sample(range(self.COUNT), 64):
                fd = self._lock(f"{self.LOCK_DIR}/{index}")
                if fd is not None:
                    break
            else:
                raise OSError(errno.EAGAIN, "no free block of sandbox uids")
            self._fd, self._path = fd, f"{self.LOCK_DIR}/{index}"
            self.first = self.BASE + index * self.SIZE
            self._free = list(range(self.first + self.SIZE - 1, self.first - 1, -1))
            # While every lock is held, so that no other sandbox can hand these uids out yet.
            self.leftovers_killed = _kill_blocks({index, *stale}, self.BASE, self.SIZE)
        finally:
            for path, stale_fd in stale.values():
                os.unlink(path)  # still holding the lock: see the class docstring
                os.close(stale_fd)
        self.swept = len(stale)

    @staticmethod
    def _lock(path: str) -> int | None:
        """An fd holding the exclusive lock of `path`, or None if another process holds it."""
        # read-only: an fd open for writing would keep its mount from becoming read-only
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = os.fstat(fd)
            now = os.stat(path)
            if (locked.st_dev, locked.st_ino) == (now.st_dev, now.st_ino):
                return fd
        except (BlockingIOError, FileNotFoundError):
            pass  # held by someone, or unlinked by its holder after we opened it
        os.close(fd)
        return None

    @classmethod
    def _lock_stale(cls) -> dict[int, tuple[str, int]]:
        """Lock every lock file nobody holds (its zygote was killed): block index -> (path,
        fd). The caller kills what still runs in those blocks, then unlinks and closes."""
        stale: dict[int, tuple[str, int]] = {}
        try:
            names = os.listdir(cls.LOCK_DIR)
        except OSError:
            return stale
        for name in names:
            if not name.isdigit() or not 0 <= int(name) < cls.COUNT:
                continue
            path = f"{cls.LOCK_DIR}/{name}"
            try:
                fd = cls._lock(path)
            except OSError:
                continue
            if fd is not None:
                stale[int(name)] = (path, fd)
        return stale

    def take(self) -> int:
        if not self._free:
            raise OSError(errno.EAGAIN, f"all {self.SIZE} sandbox uids of this zygote are in use")
        return self._free.pop()

    def give_back(self, uid: int) -> None:
        self._free.append(uid)

    def release(self) -> None:
        """Unlink the lock file, then drop the lock. Idempotent."""
        if self._fd < 0:
            return
        try:
            os.unlink(os.path.basename(self._path), dir_fd=self._dir_fd)
        except OSError:
            pass
        os.close(self._fd)
        os.close(self._dir_fd)
        self._fd = -1


def _kill_blocks(blocks: set[int], base: int, size: int) -> int:
    """SIGKILL every process whose real uid lies in one of the uid blocks `blocks` (what a
    SIGKILLed zygote's sessions may have left running). One pass over /proc; returns how many
    were found."""
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        uid = -1
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        uid = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
        if uid >= base and (uid - base) // size in blocks:
            found += 1
            try:
                os.kill(int(name), 9)
            except OSError:
                pass
    return found


# ---------------------------------------------------------------------------------------------
# seccomp

EPERM_RET = 0x00050000 | errno.EPERM
ENOSYS_RET = 0x00050000 | errno.ENOSYS
ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000

# Syscalls a math session never needs that widen the kernel's attack surface, by architecture:
# (audit arch, {name: number}). Numbers from the kernel's syscall tables.
_SYSCALLS = {
    "x86_64": (
        0xC000003E,
        dict(
            ptrace=101,
            process_vm_readv=310,
            process_vm_writev=311,
            mount=165,
            umount2=166,
            pivot_root=155,
            chroot=161,
            unshare=272,
            setns=308,
            keyctl=250,
            add_key=248,
            request_key=249,
            bpf=321,
            perf_event_open=298,
            userfaultfd=323,
            kexec_load=246,
            kexec_file_load=320,
            init_module=175,
            finit_module=313,
            delete_module=176,
            clock_settime=227,
            settimeofday=164,
            adjtimex=159,
            clock_adjtime=305,
            swapon=167,
            swapoff=168,
            reboot=169,
            acct=163,
            syslog=103,
            quotactl=179,
            sethostname=170,
            setdomainname=171,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            open_by_handle_at=304,
            name_to_handle_at=303,
            fanotify_init=300,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            setrlimit=160,
            iopl=172,
            ioperm=173,
            vhangup=153,
            socket=41,
            kill=62,
            clone=56,
            clone3=435,
            prlimit64=302,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            ptrace=117,
            process_vm_readv=270,
            process_vm_writev=271,
            mount=40,
            umount2=39,
            pivot_root=41,
            chroot=51,
            unshare=97,
            setns=268,
            keyctl=219,
            add_key=217,
            request_key=218,
            bpf=280,
            perf_event_open=241,
            userfaultfd=282,
            kexec_load=104,
            kexec_file_load=294,
            init_module=105,
            finit_module=273,
            delete_module=106,
            clock_settime=112,
            settimeofday=170,
            adjtimex=171,
            clock_adjtime=266,
            swapon=224,
            swapoff=225,
            reboot=142,
            acct=89,
            syslog=116,
            quotactl=60,
            sethostname=161,
            setdomainname=162,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            open_by_handle_at=265,
            name_to_handle_at=264,
            fanotify_init=262,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            setrlimit=164,
            vhangup=58,
            socket=198,
            kill=129,
            clone=220,
            clone3=435,
            prlimit64=261,
        ),
    ),
}
_SPECIAL = {"socket", "kill", "clone", "clone3", "prlimit64"}
AF_UNIX = 1

# classic BPF opcodes
_LD_ABS, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_ARCH_OFFSET, _NR_OFFSET = 4, 0


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # seccomp_data.args[i], low 32 bits (little-endian)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The session's seccomp filter as classic BPF, or None on an architecture we have no
    syscall table for. Denied (EPERM): the syscalls in `_SYSCALLS` other than the special ones;
    sockets of any family but AF_UNIX; kill(-1, ...) (signal everything we may signal); clone
    with namespace flags; prlimit64 that sets a limit. clone3 gets ENOSYS, which makes the C
    library fall back to clone, whose flags (unlike clone3's) the filter can see. A syscall of
    another ABI (x32, 32-bit) kills the process: its numbers would bypass the table."""
    machine = machine or platform.machine()
    if machine not in _SYSCALLS:
        return None
    arch, table = _SYSCALLS[machine]
    blocks: list[tuple[int, list[bytes]]] = []
    for name, nr in table.items():
        if name not in _SPECIAL:
            blocks.append((nr, [_insn(_RET, EPERM_RET)]))
    blocks.append(
        (
            table["socket"],
            [
                _insn(_LD_ABS, _arg_low(0)),
                _insn(_JEQ, AF_UNIX, 0, 1),
                _insn(_RET, ALLOW),
                _insn(_RET, EPERM_RET),
            ],
        )
    )
    blocks.append(
        (
            table["kill"],
            [
                _insn(_LD_ABS, _arg_low(0)),
                _insn(_JEQ, 0xFFFFFFFF, 0, 1),
                _insn(_RET, EPERM_RET),
                _insn(_RET, ALLOW),
            ],
        )
    )
    blocks.append(
        (
            table["clone"],
            [
                _insn(_LD_ABS, _arg_low(0)),
                _insn(_JSET, NAMESPACE_FLAGS, 0, 1),
                _insn(_RET, EPERM_RET),
                _insn(_RET, ALLOW),
            ],
        )
    )
    blocks.append((table["clone3"], [_insn(_RET, ENOSYS_RET)]))
    blocks.append(
        (
            table["prlimit64"],
            [  # prlimit64(pid, resource, new_limit, old_limit)
                _insn(_LD_ABS, _arg_low(2)),
                _insn(_JEQ, 0, 0, 3),
                _insn(_LD_ABS, _arg_low(2) + 4),
                _insn(_JEQ, 0, 0, 1),
                _insn(_RET, ALLOW),
                _insn(_RET, EPERM_RET),
            ],
        )
    )
    prog = [
        _insn(_LD_ABS, _ARCH_OFFSET),
        _insn(_JEQ, arch, 1, 0),
        _insn(_RET, KILL_PROCESS),
        _insn(_LD_ABS, _NR_OFFSET),
    ]
    if machine == "x86_64":
        prog += [_insn(_JGE, 0x40000000, 0, 1), _insn(_RET, KILL_PROCESS)]  # the x32 ABI
    for nr, body in blocks:
        prog.append(_insn(_JEQ, nr, 0, len(body)))
        prog.extend(body)
        # every body ends in a return, so the accumulator (maybe an argument now) is never
        # compared against the next syscall number
    prog.append(_insn(_RET, ALLOW))
    return b"".join(prog)


def install_seccomp(program: bytes) -> bool:
    """Install `program` for this process and its future children. Sets no_new_privs first
    (required, and it also keeps exec'd setuid binaries from gaining privileges)."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    if not prctl(PR_SET_NO_NEW_PRIVS, 1):
        return False
    return _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
