"""The library of atomic RACES environments, one module per domain.

Importing this package registers every environment in `tirl.envs.core.REGISTRY`. Each module
defines its environments with the `atomic` decorator; see `tirl.envs.core` for the contract a
mapper, its instruction and its input constraints must meet, and tests/test_envs_library.py
for the checks every one of them passes.
"""

from tirl.envs.library import (  # noqa: F401  (imported for their registrations)
    bits,
    dates,
    graphs,
    grids,
    lists,
    matrices,
    number_theory,
    numbers,
    polynomials,
    sets,
    strings,
    tables,
)
