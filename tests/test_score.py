"""One scorer, one typed score: `score_trajectory` puts the task id and the `Score` on the
trajectory as fields; `tirl eval --benchmark` scores with it too (its records say what it says);
trajectories and samples files written when the score was meta keys still load and resume."""

from __future__ import annotations

import asyncio
import json

import pytest

from tirl.eval.benchmark_eval import (
    benchmark_tasks,
    read_done,
    run_benchmark,
    sample_record,
    samples_path,
)
from tirl.eval.viewer import load_trajectories, verdict
from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.tasks import Score as TasksScore
from tirl.tasks.base import Task
from tirl.tasks.scoring import score_trajectory
from tirl.tasks.sources.dataset import score_math

BOX_IN_PROSE = "6 * 7 = 42, so the answer is \\boxed{42}."
BOX_IN_CODE = '```python\nprint("\\\\boxed{42}")\n```\n'


def _math_task(answer: str = "42") -> Task:
    meta = {"scoring": "math", "category": "products", "item_id": "q1"}
    scorer = lambda text: score_math(answer, text)  # noqa: E731
    return Task("benchmark/toy/q1", "test", "What is 6 * 7?", answer, scorer, "benchmark", meta)


def _traj(*parts: tuple[SegmentKind, str]) -> Trajectory:
    segments = [Segment(SegmentKind.PROMPT, [1], "What is 6 * 7?\n")]
    segments += [Segment(kind, [2 + i], text) for i, (kind, text) in enumerate(parts)]
    return Trajectory(segments)


def _printed_box() -> Trajectory:
    """The model's code prints a box and the interpreter shows it; the model's prose has none."""
    traj = _traj(
        (SegmentKind.MODEL, BOX_IN_CODE),
        (SegmentKind.TOOL, "```output\n\\boxed{42}\n```\n"),
        (SegmentKind.MODEL, "Done."),
    )
    traj.tool_calls = [ToolCall('print("\\\\boxed{42}")', "ok", "\\boxed{42}\n")]
    return traj


def test_score_is_one_type_reachable_from_protocol_and_tasks():
    assert TasksScore is Score


def test_score_trajectory_sets_the_typed_task_id_and_score():
    traj = _traj((SegmentKind.MODEL, BOX_IN_PROSE))
    returned = score_trajectory(traj, _math_task())
    assert traj.task_id == "benchmark/toy/q1"
    assert traj.score == returned == Score(1.0, True, traj.score.reason, "42")
    assert type(traj.score.reward) is float and traj.correct
    assert not {"correct", "predicted", "task_reward", "reason", "task_id"} & set(traj.meta)
    assert (traj.meta["question"], traj.meta["gold"]) == ("What is 6 * 7?", "42")
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert (again.task_id, again.score, again.meta) == (traj.task_id, traj.score, traj.meta)


def test_an_unscored_trajectory_writes_no_score_and_is_not_correct():
    traj = _traj((SegmentKind.MODEL, BOX_IN_PROSE))
    assert traj.score is None and not traj.correct
    assert {"task_id", "score"}.isdisjoint(traj.to_dict())
    assert verdict(traj) == "unscored"


def test_a_trajectory_written_with_its_score_in_meta_still_loads():
    old = _traj((SegmentKind.MODEL, BOX_IN_PROSE)).to_dict()
    old["meta"] = {"task_id": "arithmetic/test/3", "question": "q", "gold": "42"} | {
        "predicted": "42",
        "correct": True,
        "reason": "equal",
        "task_reward": 1.0,
        "seed": 7,
    }
    traj = Trajectory.from_dict(old)
    assert traj.task_id == "arithmetic/test/3"
    assert traj.score == Score(1.0, True, "equal", "42")
    assert traj.meta == {"question": "q", "gold": "42", "seed": 7}
    failed = {**old, "meta": {"task_id": "arithmetic/test/4", "status": "failed"}}
    assert Trajectory.from_dict(failed).task_id == "arithmetic/test/4"
    assert Trajectory.from_dict(failed).score is None


@pytest.mark.parametrize(
    "make, scores",
    [
        (lambda: _traj((SegmentKind.MODEL, BOX_IN_PROSE)), True),
        (_printed_box, False),  # a box printed by the interpreter never scores
        (lambda: _traj((SegmentKind.MODEL, BOX_IN_CODE + "So.")), False),  # nor one in code
    ],
    ids=["prose", "printed-by-the-interpreter", "inside-the-model's-code"],
)
def test_a_benchmark_record_says_what_score_trajectory_says(make, scores):
    on_task_road = make()
    score = score_trajectory(on_task_road, _math_task())
    rec = sample_record("toy", _math_task(), 0, make())
    assert (rec["predicted"], rec["correct"], rec["reason"]) == (
        score.predicted,
        score.correct,
        score.reason,
    )
    assert rec["correct"] is scores and rec["item_id"] == "q1" and "reward" not in rec
    assert Trajectory.from_dict(rec["trajectory"]).score == score


def test_a_races_answer_inside_the_models_code_does_not_score_on_either_road():
    ((tasks, source),) = benchmark_tasks(["races"], limit=1).values()
    task = tasks[0]
    assert source == "races" and task.meta["item_id"] == "races-s0-0"
    printed = f'```python\nprint("""{task.answer}""")\n```\n'
    for text, correct in ((task.answer, True), (printed, False)):
        rec = sample_record("races", task, 0, _traj((SegmentKind.MODEL, text)))
        score = score_trajectory(_traj((SegmentKind.MODEL, text)), task)
        assert (rec["correct"], rec["reward"], rec["reason"]) == (
            score.correct,
            score.reward,
            score.reason,
        )
        assert rec["correct"] is correct and rec["category"] == task.meta["operator"]


class _NoRollout:
    async def run_many(self, *args, **kwargs):
        raise AssertionError("a resumed run generated a sample it already had")


def test_an_old_samples_file_still_resumes_and_loads(tmp_path):
    """A record written before typed scores (the verdict beside the trajectory, no score in
    it) is a finished sample: nothing is generated again, and the viewer reads its verdict."""
    traj = _traj((SegmentKind.MODEL, BOX_IN_PROSE)).to_dict()
    old = {"benchmark": "toy", "item_id": "q1", "sample": 0, "category": "products"}
    old |= {"gold": "42", "status": "ok", "predicted": "42", "correct": True, "reason": "equal"}
    old |= {"stats": {}, "finish_reason": "stop", "trajectory": traj}
    path = samples_path(tmp_path, "toy")
    path.write_text(json.dumps(old) + "\n")
    assert list(read_done(path)) == [("q1", 0)]
    settings = None  # never used: nothing is left to generate
    records = asyncio.run(
        run_benchmark(_NoRollout(), "toy", [_math_task()], settings, 1, tmp_path, progress=False)
    )
    assert records == [old] and path.read_text() == json.dumps(old) + "\n"
    (loaded,) = load_trajectories(path)
    assert loaded.score == Score(1.0, True, "equal", "42") and verdict(loaded) == "correct"
