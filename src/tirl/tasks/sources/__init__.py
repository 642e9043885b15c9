"""The built-in task sources; each module registers itself (`tirl.tasks.registry`)."""

from tirl.tasks.sources import arithmetic, benchmark, dataset, races  # noqa: F401
