"""The environments' registry with every built-in environment in it: code that reads
environments by name imports `REGISTRY` from here (as `tirl.tasks.registry` is read for task
sources), never from `tirl.envs.core`, whose registry holds only what was registered so far.

The three parts of the extension point, the dependency running one way: the registry and its
decorator `atomic` (`tirl.envs.core`), the built-in environments (`tirl.envs.library`, which
registers ~460 of them on import), and this module, which imports the library and re-exports
the registry. A read of it also loads installed plugins first (`tirl.plugins`), so a plugin's
environments sit beside the library's.
"""

from __future__ import annotations

import tirl.envs.library  # noqa: F401  (registers the built-in environments)
from tirl.envs.core import REGISTRY

__all__ = ["REGISTRY"]
