"""Growth: adding an environment to the RACES library leaves every recorded test green.

The recorded tests (`tests/data/races_golden.jsonl` in `tests/test_envs_races.py`, the old
generator's statistics in `tests/test_envs_races_distribution.py`) build over the frozen list of
environments (`tests/races_frozen.py`), not over whatever the library holds. Here the library
gets one more environment, registered first (before every recorded one: the place that would
move the most) through the same `atomic` decorator a library module uses, and the recorded
rows and statistics must come out unchanged. Over the whole grown library the same build does
change, so the check is not vacuous. The real registry is left as it was.
"""

from __future__ import annotations

import pytest
from races_frozen import frozen_registry
from test_envs_races import assert_golden_rows
from test_envs_races_distribution import build_statistics

import tirl.envs.library  # noqa: F401
from tirl.envs import core
from tirl.envs.core import Environments, atomic
from tirl.envs.dataset import BuildConfig, build_tasks
from tirl.envs.types import Int

ADDED = "numbers.growth_test_odd_digits"  # a name no library module will take


@pytest.fixture()
def grown_library(monkeypatch) -> Environments:
    """The library with one more environment, registered first; `core.REGISTRY` while the
    test runs."""
    library = list(core.REGISTRY)
    grown = Environments()
    monkeypatch.setattr(core, "REGISTRY", grown)  # what a library module registers into

    @atomic("numbers", Int(0, 10**12), Int(0, 13), "Count the odd decimal digits of the input.")
    def growth_test_odd_digits(n):
        return sum(int(c) % 2 for c in str(n))

    for env in library:
        grown.add(env)
    assert len(grown) == len(library) + 1 and ADDED in core.REGISTRY
    return grown


def test_an_added_environment_changes_a_build_over_the_whole_library(grown_library):
    config = BuildConfig(n=150, seed=0)  # the new environment is first drawn at task 121
    library = _without_added(grown_library)
    before = [t.to_dict() for t in build_tasks(library, config)]
    after = [t.to_dict() for t in build_tasks(grown_library, config)]
    assert before != after
    assert any(ADDED in (*t["envs"], *t["candidates"]) for t in after)


def test_an_added_environment_changes_no_recorded_row(grown_library):
    assert ADDED not in frozen_registry()
    assert_golden_rows()


def test_an_added_environment_changes_no_recorded_statistic(grown_library, monkeypatch):
    grown = build_statistics(seed=0, n=2000)
    monkeypatch.setattr(core, "REGISTRY", _without_added(grown_library))
    assert build_statistics(seed=0, n=2000) == grown


def _without_added(registry: Environments) -> Environments:
    """The library as it was: every environment but the added one, in registration order."""
    return registry.subset([e.name for e in registry if e.name != ADDED])
