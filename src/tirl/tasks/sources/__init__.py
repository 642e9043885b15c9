"""The built-in task sources; each module registers itself (`tirl.tasks.registry`)."""

from tirl.tasks.sources import (  # noqa: F401
    arithmetic,
    benchmark,
    dataset,
    races,
    reasoning_gym,
    verifiers_env,
)
