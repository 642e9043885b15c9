"""A tirl plugin: a task source, an advantage estimator and a tool, registered on import.

Each entry notes in the file named by $TIRL_DEMO_PLUGIN_LOG that it ran, so a test can see
that `tirl train` used it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tirl.algos.advantages import broadcast_to_tokens, group_mean_baseline, register_advantage
from tirl.config import setting
from tirl.envs.seeding import item_rng
from tirl.protocol import Shape
from tirl.tasks import Task, register_source
from tirl.tasks.base import Code, Think
from tirl.tasks.sources.arithmetic import score_integer
from tirl.tools.base import Tool, ToolContext, ToolResult, register_tool


def _note(what: str) -> None:
    path = os.environ.get("TIRL_DEMO_PLUGIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(what + "\n")


@register_source("addition")
@dataclass
class AdditionSource:
    """a + b with `digits`-digit operands; its demonstrations add with the `calc` tool."""

    digits: int = setting(2, "[1, 9]", "digits of each operand")
    seed: int = setting(0, ">= 0", "seeds the items (default: the run's seed)")
    name: str = field(default="addition", init=False, repr=False)

    def item(self, split: str, index: int) -> Task:
        rng = item_rng(self.name, str(self.digits), split, self.seed, index)
        a, b = (rng.randrange(10 ** (self.digits - 1), 10**self.digits) for _ in range(2))
        return Task(
            id=f"addition/{split}/{index}",
            split=split,
            problem=f"What is {a} + {b}?",
            answer=str(a + b),
            scorer=lambda text: score_integer(a + b, text),
            source=self.name,
            meta={"expression": f"{a} + {b}"},
        )

    def size(self, split: str) -> int | None:
        return None

    def demonstration(self, task: Task, use_tools: bool):
        _note("source.demonstration")
        answer = Think(f"The answer is \\boxed{{{task.answer}}}.")
        return [Code(task.meta["expression"], tool="calc"), answer] if use_tools else [answer]


@register_advantage("centered")
def centered(rewards, group_ids, mask, *, gamma, kl, kl_coef, scale=1.0):
    """scale * (R - mean of the group's rewards), on every model token."""
    _note(f"advantage.centered scale={scale}")
    return broadcast_to_tokens(scale * group_mean_baseline(rewards, group_ids), mask)


@register_tool("calc")
class CalcTool(Tool):
    """Adds the integers of an expression like `12 + 30` (no sandbox needed)."""

    words = {Shape.FENCES: "calc", Shape.TAGS: "calc"}  # ```calc fences, <calc> tags
    prompt = "You can add numbers: write them between {open} and {close}."

    async def run(self, code: str, ctx: ToolContext) -> ToolResult:
        _note("tool.calc")
        try:
            return ToolResult("ok", str(sum(int(t) for t in code.split("+"))))
        except ValueError:
            return ToolResult("error", f"cannot add {code!r}")
