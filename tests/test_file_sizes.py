"""No source file of tirl grows past 900 lines (issue 44): a module that long does more than one
job, and the fix is to split it by job (as `tirl.sandbox` split its Ray pool into the cluster
setup, the calls to one actor and the pool), not to cut it anywhere."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tirl"
MAX_LINES = 900


def test_no_source_file_is_longer_than_900_lines():
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")}
    assert len(sizes) > 50  # the walk found the package
    long = [
        f"{p.relative_to(SRC.parent)}: {n} lines" for p, n in sorted(sizes.items()) if n > MAX_LINES
    ]
    assert not long, f"split these by job (at most {MAX_LINES} lines each): {long}"
