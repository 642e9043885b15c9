"""The frozen set of RACES environments that the recorded RACES tests run over.

`tests/data/races_golden.jsonl` (exact tasks and chains per seed) and
`tests/data/races_old_distribution.json` (the old generator's statistics) were recorded over
the library as it was then, and what a seed gives depends on every registered environment (the
search walks the registry in registration order, SELECT draws candidates from it). So those
tests build over `frozen_registry()`: the environments named in
`tests/data/races_frozen_envs.txt`, in that order, taken from the live library. An environment
added to the library is not in it, and they stay green (`tests/test_envs_races.py::
test_an_environment_added_to_the_library_changes_no_recorded_row`); every other test of the
library (`tests/test_envs_library.py`, `tirl envs check`) runs over the live registry and so
checks the new environment too. An environment of the frozen set that is renamed, removed or
changed fails the recorded tests: that changes what a seed gives, and is re-recorded on purpose.
"""

from __future__ import annotations

from pathlib import Path

FROZEN_ENVS = Path(__file__).parent / "data" / "races_frozen_envs.txt"


def frozen_env_names() -> list[str]:
    """The frozen environments' names, in registration order."""
    lines = FROZEN_ENVS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def frozen_registry():
    """A registry of the frozen environments, in their recorded order, from the live library
    (`tirl.envs.core.REGISTRY`, read when called)."""
    import tirl.envs.library  # noqa: F401  (registers the library)
    from tirl.envs import core

    names = frozen_env_names()
    missing = [n for n in names if n not in core.REGISTRY]
    assert not missing, (
        f"{len(missing)} environment(s) of the frozen set ({FROZEN_ENVS.name}) are no longer in"
        f" the library: {', '.join(missing[:5])}; removing or renaming one changes what a seed"
        " gives: re-record tests/data/races_golden.jsonl and races_old_distribution.json"
    )
    return core.REGISTRY.subset(names)
