"""AgentMath's stage expansion as tirl's verl agent loop runs it (`tirl.integrations.verl.stages`):
the rule on hand-computed tallies, and the board that workers share. Needs no verl."""

from __future__ import annotations

import asyncio

from tirl.integrations.verl.stages import StageBoard, shared_stages, stage_at

# truncated / sampled per policy version: 0.1 (not above 10%), 0.2 and 0.125 (above)
TALLIES = {2: (5, 40), 0: (1, 10), 1: (2, 10)}


def test_each_version_above_the_threshold_moves_the_stage_up_one():
    assert stage_at(TALLIES, 0.1, num_stages=3) == 2  # versions 1 and 2
    assert stage_at(TALLIES, 0.1, num_stages=3, before=2) == 1  # version 1 only
    assert stage_at(TALLIES, 0.1, num_stages=3, before=1) == 0  # 0.1 does not exceed 0.1
    assert stage_at(TALLIES, 0.15, num_stages=3) == 1  # only 0.2 exceeds 15%
    assert stage_at(TALLIES, 0.1, num_stages=2) == 1  # never past the last stage
    assert stage_at(TALLIES, 0.1, num_stages=3, start=1, before=2) == 2  # a resumed run
    assert stage_at({0: (0, 0)}, 0.0, num_stages=3) == 0  # nothing sampled, nothing decided


def test_a_trajectory_counts_only_the_versions_before_its_own():
    """A refill at step s (same version as the step's first batch) must not count the step's
    own partial tally; the next step's trajectories do."""
    board = StageBoard(threshold=0.1, num_stages=3)
    for k in range(10):
        board.report(version=0, truncated=k < 2, stage=0)  # 20% of version 0 truncated
    view = board.view()
    assert view.stage(0) == 0  # a refill under version 0
    assert view.stage(1) == 1  # the next step
    assert view.stage(None) == 1  # before the first reply: the highest it can be
    board.report(version=1, truncated=False, stage=1)
    assert board.view().stage(1) == 1 and board.view().stage(2) == 1


def test_the_stage_never_goes_below_one_in_use():
    """Under the asynchronous trainer a version's rate can fall as its slow (truncated)
    trajectories finish last; a stage handed out is kept."""
    board = StageBoard(threshold=0.1, num_stages=3)
    board.report(version=0, truncated=True, stage=0)
    board.report(version=1, truncated=False, stage=1)  # settled on 1/1 truncated
    for _ in range(20):
        board.report(version=0, truncated=False, stage=0)  # version 0 now at 1/21
    assert stage_at(board.tallies, 0.1, 3) == 0
    assert board.view().stage(2) == 1


def test_a_resumed_run_starts_at_its_start_stage():
    board = StageBoard(threshold=0.1, num_stages=3, start=2)
    assert board.view().stage(0) == 2
    assert StageBoard(threshold=0.1, num_stages=2, start=5).view().stage(0) == 1


def test_workers_of_one_process_share_the_board_without_ray():
    first = shared_stages("stages-test-local", 0.1, 3)
    assert shared_stages("stages-test-local", 0.1, 3) is first
    assert shared_stages("stages-test-other", 0.1, 3) is not first

    async def main():
        await first.report(0, True, 0)
        return await shared_stages("stages-test-local", 0.1, 3).view()

    assert asyncio.run(main()).stage(1) == 1
