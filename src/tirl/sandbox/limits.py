"""What a sandbox session starts with and may use: `SandboxLimits` and the preload sets.

These are plain values, light to import (the local sandbox sends them to its zygote as a dict).
The settings a user writes (`sandbox:` in a config, `tirl sandbox serve`'s flags) are
`tirl.sandbox.config.SandboxConfig`, which takes every limit's default from here and builds a
`SandboxLimits` from its fields (`SandboxConfig.limits()`).
"""

from __future__ import annotations

from dataclasses import dataclass

# The `sandbox.preload` setting's default, so the preload of every run (`tirl train`, `eval`,
# `synth`) and of `tirl sandbox serve`: small modules, so a sandbox starts in a blink; a cell that
# needs numpy or sympy imports it itself.
DEFAULT_PRELOAD = ("math", "fractions", "itertools")
# The default of a `Sandbox` or `RaySandboxPool` made in code (the README's example, the
# benchmarks): what math code reaches for, numpy and sympy included, sympy's caches warmed
# (SYMPY_WARMUP); a config or `tirl sandbox serve` asks for it with these names in `preload`.
MATH_PRELOAD = (
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "functools",
    "collections",
    "random",
    "statistics",
    "numpy",
    "sympy",
)
# Run once in the zygote when sympy is preloaded, so sessions inherit sympy's caches warm: a
# session's first sympy cell then costs milliseconds instead of tens of them, and the cache
# pages are shared copy-on-write instead of being rebuilt in every session.
SYMPY_WARMUP = """
from sympy import (Rational, factor, expand, factorint, integrate, isprime, simplify, sin, cos,
                   solve, sqrt, symbols, binomial, Matrix, nsimplify, diff, limit, oo, series)
x, y = symbols("x y")
factor(expand((x + 3) ** 6 - 1)); solve(x**2 - 5 * x + 6, x); simplify(sin(x)**2 + cos(x)**2)
integrate(x**2 * sin(x), x); diff(x**3 * y, x); limit(sin(x) / x, x, 0); series(sin(x), x, 0, 6)
Rational(3, 7) + Rational(1, 3); sqrt(8); isprime(1009); factorint(360); binomial(10, 3)
Matrix([[1, 2], [3, 4]]).det(); nsimplify(0.5)
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-session limits.

    timeout_s: wall clock per cell, counted from the moment the session has read the cell (time
        the request waited for a fork slot, the control socket or the CPU before that is not
        charged). On expiry the session's process group gets SIGINT (KeyboardInterrupt inside
        the cell, the namespace survives); if the cell has not answered `grace_s` after the
        interrupt was delivered, the session is killed and becomes dead.
    memory_mb: RLIMIT_DATA of the session (heap and private mappings, including what it inherits
        from the zygote's preloaded modules). Exceeding it raises MemoryError -> Status.MEMORY.
    capture_chars: per stream and cell; the first and last halves are kept.
    cpu_s: optional RLIMIT_CPU: CPU seconds over the session's whole lifetime (all cells, all
        threads; a fork of a session starts again from 0). Exceeding it kills the session and
        the cell returns Status.TIMEOUT. Each process the session starts has its own allowance
        of the same size (rlimits are per process); `kill_background` ends those after each cell.
    grace_s: time between the delivered SIGINT and the kill.
    file_size_mb: RLIMIT_FSIZE: the largest file a cell may write (also bounds fd 1/2 capture).
    max_open_files: RLIMIT_NOFILE.
    max_processes: RLIMIT_NPROC: processes and threads of a session and its forks together,
        the session itself included (binding only where sessions run as their own uid or in
        their own user namespace; see the module docstring).
    disk_mb: size of the session's private /tmp (its working directory lives there).
    kill_background: when a cell returns, kill every process it started that is still running
        (subprocess.Popen, os.fork, double forks and setsid included), so nothing outlives its
        cell and uses CPU afterwards. Turn off only for code that must keep a process across
        cells (a multiprocessing pool); then such processes live until the session closes.
        The session also reaps the cell's children, so a Popen object kept for a later cell
        reports returncode 0 for a process it had not waited for (Python's answer to ECHILD).
    """

    timeout_s: float = 5.0
    memory_mb: int = 1024
    capture_chars: int = 8192
    cpu_s: int | None = None
    grace_s: float = 0.5
    file_size_mb: int = 64
    max_open_files: int = 256
    max_processes: int = 32
    disk_mb: int = 64
    kill_background: bool = True

    def __post_init__(self) -> None:
        positive = ("timeout_s", "memory_mb", "capture_chars", "grace_s", "file_size_mb")
        for name in (*positive, "max_open_files", "max_processes", "disk_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        if self.cpu_s is not None and (not isinstance(self.cpu_s, int) or self.cpu_s <= 0):
            raise ValueError(
                f"SandboxLimits.cpu_s must be a positive int or None, got {self.cpu_s!r}"
            )
        if not isinstance(self.kill_background, bool):
            raise ValueError(
                f"SandboxLimits.kill_background must be True or False, got {self.kill_background!r}"
            )
