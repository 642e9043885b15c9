"""The verifiers taskset id `tirl-verifiers`: tirl's task sources inside PrimeIntellect's
verifiers (see `tirl.integrations.verifiers`). verifiers resolves a taskset id by importing the
module of that name (dashes to underscores) and taking the one `Taskset` subclass, and the
one `Harness` subclass, that its `__all__` exports (verifiers/v1/utils/loaders.py); this module
exists so that the id works after `pip install 'tirl[verifiers]'`."""

from tirl.integrations.verifiers import TirlEnv, TirlHarness, TirlTaskset

__all__ = ["TirlEnv", "TirlHarness", "TirlTaskset"]
