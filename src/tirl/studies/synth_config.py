"""The config of `tirl study synth` and its problems (`tirl.studies.synth_study`): light to
import, so that a bad key or problem source is one line before torch is loaded.

Problems: reasoning-gym items through tirl's `reasoning_gym` task source, its question as the
problem (the line asking for an `<answer>` tag dropped: here answers are `\\boxed{}`) and its
answer as the reference; train items from the train split, held-out items from the test split
(a question goes to one split by its hash, so the two never share one). A train item whose
dataset carries a worked solution (reasoning-gym's `answer_cot`, e.g. gsm_symbolic's) keeps it
as `worked`: AgentMath rewrites existing chain-of-thought data (papers/002, §3.1, stage one),
which `study.cot: dataset` uses instead of the teacher's own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tirl.config import setting
from tirl.files import write_text
from tirl.run.config import RunConfig
from tirl.synth.config import LimitsConfig, StagesConfig
from tirl.synth.prompts import CODEIFY_EXAMPLES
from tirl.tasks import make_source
from tirl.tasks.sources.reasoning_gym import ANSWER_REQUEST

# `--quick`: the same study, shrunk. Measured on SmolLM2 with threads 1 on 2 shared cores: the
# teacher's chain of thought 91 s and code-ify 302 s for 32 problems, a LoRA SFT step of 8 rows
# about 33 s, 40 greedy held-out items 1-3 min, an RL step of 4 x 8 rollouts about 2-3 min;
# so two RL prompts a step and 6 SFT steps, to stay near 20 minutes when all three arms train.
QUICK = (
    "study.problems=32",
    "study.heldout_items=30",
    "teacher.cot_max_tokens=192",
    "teacher.max_tokens=384",
    "run.sft.steps=6",
    "run.rl.steps=2",
    "run.rl.prompts_per_step=2",
    "run.rl.warmup_steps=1",
)


def _sources_problem(sources: list[dict[str, Any]]) -> str | None:
    if not sources:
        return "must list at least one reasoning-gym dataset"
    for i, entry in enumerate(sources):
        if not isinstance(entry, dict) or "dataset" not in entry:
            return f"[{i}] must be {{dataset: NAME, config: {{...}}}}"
        unknown = set(entry) - {"dataset", "config", "stream_size"}
        if unknown:
            return (
                f"[{i}] has unknown key {sorted(unknown)[0]!r} (keys: dataset, config, stream_size)"
            )
    return None


@dataclass
class StudySettings:
    """What is synthesized, held out and compared."""

    sources: list[dict[str, Any]] = setting(
        factory=lambda: [
            {"dataset": "gsm_symbolic"},
            {
                "dataset": "basic_arithmetic",
                "config": {
                    "max_terms": 3,
                    "max_digits": 3,
                    "operators": ["+", "-", "*"],
                    "allow_parentheses": False,
                    "allow_negation": False,
                },
            },
        ],  # fmt: skip
        doc="reasoning-gym datasets the problems come from, in turn: [{dataset: NAME, config:"
        " {...its keys}}]",
        check=_sources_problem,
    )
    problems: int = setting(300, ">= 1", "train problems the teacher synthesizes from")
    heldout_items: int = setting(100, ">= 1", "held-out problems every arm is evaluated on")
    scripted_source: dict[str, Any] = setting(
        factory=lambda: {"source": "arithmetic", "kinds": ["product", "mod", "chain"], "digits": 3},
        doc="the task source whose teacher-free demonstrations the scripted arm is trained on",
    )
    scripted_examples: int = setting(
        0, ">= 0", "the scripted arm's demonstrations; 0: as many as the synth arm's"
    )
    cot: Literal["dataset", "teacher"] = setting(
        "dataset",
        doc="each train problem's chain of thought: `dataset` takes its dataset's worked solution"
        " (as AgentMath rewrites existing CoT data) and asks the teacher only where there is"
        " none; `teacher` has the teacher write every one",
    )
    task_seed: int = setting(0, ">= 0", "seeds the problem streams")
    quick: list[str] = setting(
        factory=lambda: list(QUICK),
        doc="the overrides `--quick` applies before the command's own: the same study, shrunk"
        " (fewer problems, items and steps); each `key=value` as on the command line",
    )


@dataclass
class TeacherSettings:
    """The teacher: `tirl serve` of a model on a free loopback port, for synthesis only."""

    model: str = setting("smollm2-135m-instruct", doc="model name or saved folder to serve")
    threads: int = setting(0, ">= 0", "the server's torch threads; 0 follows tirl.cpu")
    max_batch: int = setting(32, ">= 1", "sequences the server decodes together")
    concurrency: int = setting(32, "[1, 10000]", "requests in flight")
    cot_max_tokens: int = setting(256, ">= 1", "tokens of the teacher's own chain of thought")
    max_tokens: int = setting(512, ">= 1", "tokens of each code-ify, correction or judge reply")
    codeify_examples: int = setting(
        0,
        f"[0, {len(CODEIFY_EXAMPLES)}]",
        "worked examples of the rewrite shown before each problem (tirl synth's"
        " codeify_examples; 0: AgentMath's prompt, none)",
    )
    temperature: float = setting(0.0, "[0, 100]", "sampling temperature (0: greedy)")
    timeout_s: float = setting(1800.0, "(0, 86400]", "per request, in seconds")
    start_timeout_s: float = setting(600.0, "(0, 86400]", "seconds the server may take to start")


@dataclass
class SynthStudyConfig:
    study: StudySettings = setting(factory=StudySettings, doc="the comparison")
    teacher: TeacherSettings = setting(factory=TeacherSettings, doc="the served teacher")
    stages: StagesConfig = setting(
        factory=lambda: StagesConfig(decontaminate=False),
        doc="which synthesis stages run (held-out items are another split already)",
    )
    limits: LimitsConfig = setting(factory=LimitsConfig, doc="code limits per block")
    run: RunConfig = setting(factory=RunConfig, doc="model, SFT, RL and evaluation of every arm")


# ------------------------------------------------------------------------------ problems


def problem_sources(cfg: SynthStudyConfig) -> list:
    """The reasoning-gym task sources (ConfigError naming study.sources[i] for a bad one)."""
    made = []
    for i, entry in enumerate(cfg.study.sources):
        full = {"source": "reasoning_gym", "seed": cfg.study.task_seed, **entry}
        made.append(make_source(full, f"study.sources[{i}]", seed=cfg.study.task_seed))
    return made


# GSM8K's last line, "#### 28080", which its derivatives (gsm_symbolic) keep
_FINAL_LINE = re.compile(r"\n?####\s*(.+?)\s*$")


def worked_solution(cot: str, answer: str) -> str:
    """A dataset's chain of thought ending as the teacher's would: its GSM8K-style final line
    (`#### N`) becomes "The answer is \\boxed{N}."; one with neither gets the reference boxed."""
    text = cot.strip()
    final = _FINAL_LINE.search(text)
    if final:
        return f"{text[: final.start()].rstrip()}\nThe answer is \\boxed{{{final.group(1)}}}."
    if "\\boxed{" in text:
        return text
    return f"{text}\nThe answer is \\boxed{{{answer}}}."


def _row(task, source_name: str) -> dict:
    question = task.problem.removesuffix(ANSWER_REQUEST).rstrip()
    answer = task.answer.removeprefix("<answer>").removesuffix("</answer>").strip()
    row = {"id": task.id, "problem": question, "answer": answer, "source": source_name}
    cot = task.meta.get("entry", {}).get("metadata", {}).get("answer_cot")
    # only train items are synthesized from; held-out items carry no solution
    if task.split == "train" and isinstance(cot, str) and cot.strip():
        row["worked"] = worked_solution(cot, answer)
    return row


def problem_rows(sources: list, n: int, split: str) -> list[dict]:
    """`n` items of `split`, the sources in turn (item k of source j is row k * len + j)."""
    rows = []
    for i in range(n):
        src = sources[i % len(sources)]
        rows.append(_row(src.item(split, i // len(sources)), src.dataset))
    return rows


def write_problems(cfg: SynthStudyConfig, out: Path) -> dict[str, Path]:
    sources = problem_sources(cfg)
    paths = {
        "train": out / "problems" / "train.jsonl",
        "heldout": out / "problems" / "heldout.jsonl",
    }
    for name, n, split in (("train", cfg.study.problems, "train"),
                           ("heldout", cfg.study.heldout_items, "test")):  # fmt: skip
        rows = problem_rows(sources, n, split)
        write_text(paths[name], "".join(json.dumps(r) + "\n" for r in rows))
    return paths
