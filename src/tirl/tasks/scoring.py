"""Scoring a trajectory against its task, the same way in training and in evaluation.

The scorer reads the model's prose only (`tirl.rewards.answer.prose_text`: the model's text
without interpreter output, architecture.md invariant 3, and without the inside of its own code
blocks: `print("\\boxed{42}")` is a program that prints a box, not an answer). What it said is
kept on the trajectory as typed fields, `traj.task_id` and `traj.score`, which the trainer, the
evaluation metrics (the task road and `tirl eval --benchmark` alike), the report and the viewer
read. This is the one scorer of trajectories: there is no other road.
"""

from __future__ import annotations

from tirl.protocol.segments import Trajectory
from tirl.rewards.answer import prose_text
from tirl.tasks.base import Score, Task


def score_trajectory(traj: Trajectory, task: Task) -> Score:
    """Score `traj` with `task`'s scorer and record it on `traj`: `task_id`, `score` (reward as
    a float in [0, 1], correct as a bool), and, for reports and the viewer, `meta["question"]`
    and `meta["gold"]` (the task's problem and reference answer)."""
    said = task.score(prose_text(traj))
    score = Score(float(said.reward), bool(said.correct), said.reason, said.predicted)
    traj.task_id = task.id
    traj.score = score
    traj.meta.update(question=task.problem, gold=task.answer)
    return score
