"""Scoring a trajectory against its task, the same way in training and in evaluation.

The scorer reads the model's prose only (`tirl.rewards.answer.prose_text`: the model's text
without interpreter output, architecture.md invariant 3, and without the inside of its own code
blocks: `print("\\boxed{42}")` is a program that prints a box, not an answer). What it said is
kept in the trajectory's meta, under the keys the trainer, the evaluation metrics, the report
and the viewer read.
"""

from __future__ import annotations

from tirl.protocol.segments import Trajectory
from tirl.rewards.answer import prose_text
from tirl.tasks.base import Score, Task


def score_trajectory(traj: Trajectory, task: Task) -> Score:
    """Score `traj` with `task`'s scorer and record it in `traj.meta`: task_id, question,
    gold, predicted, correct, reason and task_reward (the scorer's reward in [0, 1])."""
    score = task.score(prose_text(traj))
    traj.meta.update(
        task_id=task.id,
        question=task.problem,
        gold=task.answer,
        predicted=score.predicted,
        correct=bool(score.correct),
        reason=score.reason,
        task_reward=float(score.reward),
    )
    return score
