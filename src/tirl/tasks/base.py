"""The one task interface: what training, evaluation and synthesis all ask a problem.

A `Task` is one problem: an id, its split, the problem text the user turn shows (the prompt is
built from it by `tirl.tasks.prompts`, plainly or through a chat template), a reference answer
for reports, and a scorer. The scorer sees the model's own prose only (architecture.md invariant 3;
`tirl.tasks.scoring` hands it `tirl.rewards.answer.prose_text`: no interpreter output, and not
the inside of the model's own code blocks) and returns a `Score`:
the task's reward in [0, 1] (1 iff correct for exact-answer tasks; RACES's SEQUENTIAL and
PARALLEL give partial credit), whether it is correct, and why.

A `TaskSource` makes the tasks of one family, by split and position: `item(split, index)` is
deterministic, so a stream is resumable from its position and a run's tasks do not depend on
when they are asked for. Sources are registered by name (`tirl.tasks.registry`); a source that
can write teacher-free demonstrations for SFT (arithmetic, RACES mappers) returns them from
`demonstration`, as `Demo` parts the pipeline renders in the run's protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tirl.protocol.score import Score  # the type a Trajectory carries; re-exported here

__all__ = ["SPLITS", "Code", "DemoPart", "Score", "Scorer", "Task", "TaskSource", "Think"]

SPLITS = ("train", "test")


Scorer = Callable[[str], Score]  # the model's prose (see the module doc) -> Score


@dataclass(frozen=True)
class Task:
    """One problem. `id` is unique within its source and split (e.g. "arithmetic/test/17");
    `problem` is the text of the user turn; `answer` a reference answer (shown, not used to
    score: the scorer decides)."""

    id: str
    split: str
    problem: str
    answer: str
    scorer: Scorer = field(compare=False, repr=False)
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def score(self, model_text: str) -> Score:
        return self.scorer(model_text)


@dataclass(frozen=True)
class Think:
    """Model text of a demonstration (reasoning or the final answer)."""

    text: str


@dataclass(frozen=True)
class Code:
    """A code block of a demonstration and the interpreter's output. `output` None: the
    pipeline runs the block with its tool (`tirl.tools`, as a rollout does) in the
    demonstration's sandbox session and appends the real output; a recorded output (from a
    `tirl synth` file, whose outputs are real sandbox outputs) is used as it is. Either way the
    run's protocol renders it, as `tool`'s block (default Python: the protocol's own block)."""

    source: str
    output: str | None = None
    tool: str = "python"


DemoPart = Think | Code


@runtime_checkable
class TaskSource(Protocol):
    """A family of tasks, addressed by (split, index)."""

    name: str

    def item(self, split: str, index: int) -> Task:
        """The index-th task of `split` (index >= 0). Deterministic."""
        ...

    def size(self, split: str) -> int | None:
        """How many distinct tasks `split` holds, or None for an unbounded generator. A finite
        source cycles: `item(split, i)` for i >= size starts another pass over it."""
        ...

    def demonstration(self, task: Task, use_tools: bool) -> Sequence[DemoPart] | None:
        """A teacher-free demonstration of `task` (with or without code), or None when the
        source has no demonstrator."""
        ...
