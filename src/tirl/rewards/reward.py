"""Outcome rewards: map "was the final answer correct" to a scalar.

CIR (section 3.1) uses a binary reward, "+1 if correct, else -1"; `zero_one` is the 1/0 variant
used by most math-RL setups. Composite shaping (format, tool-use bonuses, overlong penalties)
is out of scope here. Each function's range is declared so downstream code (normalization,
plots, dynamic sampling's "all correct / all wrong" test) does not hard-code it.
"""

from __future__ import annotations

from collections.abc import Callable

BINARY_REWARD_RANGE: tuple[float, float] = (-1.0, 1.0)
ZERO_ONE_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)


def binary_reward(correct: bool) -> float:
    """+1.0 if correct, else -1.0 (CIR section 3.1). Range: `BINARY_REWARD_RANGE`."""
    return BINARY_REWARD_RANGE[1] if correct else BINARY_REWARD_RANGE[0]


def zero_one_reward(correct: bool) -> float:
    """1.0 if correct, else 0.0. Range: `ZERO_ONE_REWARD_RANGE`."""
    return ZERO_ONE_REWARD_RANGE[1] if correct else ZERO_ONE_REWARD_RANGE[0]


REWARD_FNS: dict[str, Callable[[bool], float]] = {
    "binary": binary_reward,
    "zero_one": zero_one_reward,
}

REWARD_RANGES: dict[str, tuple[float, float]] = {
    "binary": BINARY_REWARD_RANGE,
    "zero_one": ZERO_ONE_REWARD_RANGE,
}


def get_reward_fn(name: str) -> Callable[[bool], float]:
    """Look up a reward function by name; raise ValueError listing the valid names."""
    try:
        return REWARD_FNS[name]
    except KeyError:
        valid = ", ".join(sorted(REWARD_FNS))
        raise ValueError(f"unknown reward {name!r}; valid: {valid}") from None
