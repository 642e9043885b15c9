"""`arithmetic`: the quickstart's seeded multiplication family (`tirl.envs.arithmetic`).

Scored by the integer in the model's last `\\boxed{}` (formatting such as 1,234 accepted).
Teacher-free demonstrations: with tools, the code that computes the answer and the answer
copied from it; without, the boxed answer stated outright.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tirl.config import setting
from tirl.envs.arithmetic import KINDS, ArithmeticEnv, ArithmeticItem
from tirl.rewards.answer import extract_boxed, normalize_integer_answer
from tirl.tasks.base import Code, DemoPart, Score, Task, Think
from tirl.tasks.registration import register_source

ANSWER_TEMPLATE = "The answer is \\boxed{{{answer}}}."
# Text-only answers are guesses; a different lead-in keeps a model that learns both styles
# from mixing "copy the interpreter's output" with "guess" at the same context.
TEXT_ANSWER_TEMPLATE = "My estimate is \\boxed{{{answer}}}."


def score_integer(gold: int, model_text: str) -> Score:
    """Reward 1 iff the last boxed answer is the integer `gold`."""
    predicted = extract_boxed(model_text)
    if predicted is None:
        return Score(0.0, False, "no \\boxed{} answer", None)
    value = normalize_integer_answer(predicted)
    if value is None:
        return Score(0.0, False, "the boxed answer is not an integer", predicted)
    correct = value == gold
    return Score(float(correct), correct, "equal" if correct else "different value", predicted)


@register_source("arithmetic")
@dataclass
class ArithmeticSource:
    """Products, products mod m and short chains of multi-digit numbers."""

    kinds: list[Literal["product", "mod", "chain"]] = setting(
        factory=lambda: list(KINDS), doc="problem kinds mixed in the stream"
    )
    digits: int = setting(3, "[1, 9]", "digits of each operand")
    seed: int = setting(0, ">= 0", "seeds the items (default: the run's seed)")
    name: str = field(default="arithmetic", init=False, repr=False)

    def __post_init__(self) -> None:
        self._env = ArithmeticEnv(tuple(self.kinds), self.digits, self.seed)  # checks kinds

    def item(self, split: str, index: int) -> Task:
        return self.task(self._env.item(split, index))

    def task(self, item: ArithmeticItem) -> Task:
        gold = int(item.answer)
        return Task(
            id=f"arithmetic/{item.split}/{item.index}",
            split=item.split,
            problem=item.question,
            answer=item.answer,
            scorer=lambda text: score_integer(gold, text),
            source=self.name,
            meta={"scoring": "integer", "kind": item.kind, "expression": item.expression},
        )

    def size(self, split: str) -> int | None:
        return None

    def demonstration(self, task: Task, use_tools: bool) -> list[DemoPart]:
        if not use_tools:
            return [Think(TEXT_ANSWER_TEMPLATE.format(answer=task.answer))]
        return [
            Code(f"print({task.meta['expression']})"),
            Think(ANSWER_TEMPLATE.format(answer=task.answer)),
        ]
