"""The one task interface (`tirl.tasks.base`) and the registry of task sources."""

from tirl.tasks.base import Code, DemoPart, Score, Task, TaskSource, Think
from tirl.tasks.registry import Mixture, make_source, register_source, source_names

__all__ = [
    "Code",
    "DemoPart",
    "Mixture",
    "Score",
    "Task",
    "TaskSource",
    "Think",
    "make_source",
    "register_source",
    "source_names",
]
