"""Seeds derived from a hash, so that no two (environment, config, split, seed, index) share one.

DESIGN.md invariant 5: every generated item comes from a hash of where it belongs. Train and test
are kept apart twice over: their seeds are derived from different strings, and each item is
assigned to exactly one split by a hash of its own content (`split_of`), so even two different
seeds that happen to draw the same numbers cannot put one item in both splits.
"""

from __future__ import annotations

import hashlib
import json
import random

SPLITS = ("train", "test")
TEST_SHARE_DENOMINATOR = 8  # one item in 8 of the whole item space belongs to the test split


def _digest(*parts: object) -> int:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")


def item_rng(env: str, config_key: str, split: str, seed: int, index: int) -> random.Random:
    """A private random generator for one item."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return random.Random(_digest(env, config_key, split, seed, index))


def split_of(env: str, content: str) -> str:
    """The one split an item belongs to, decided by its content alone."""
    return "test" if _digest(env, content) % TEST_SHARE_DENOMINATOR == 0 else "train"
