"""The curriculum's verl side without verl (`tirl.integrations.verl.curriculum`): the feed hands
out positions by the curriculum's draws and observes only whole groups, in position order; its
state resumes the same draws even with reports still on the board; the settings come from the
data-config section `tirl verl config` writes, and what cannot work is a one-line error.
tests/verl/test_verl_curriculum_loads.py runs the dataset under verl's own dataloader."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tirl.config import ConfigError
from tirl.integrations.verl.curriculum import (
    BOARD_KEY,
    POSITION_KEY,
    CurriculumFeed,
    ReportBoard,
    board_handle,
    check_data_config,
    curriculum_settings,
    finished_groups,
    metrics_settings,
    report_sample,
)
from tirl.protocol.score import Score
from tirl.run.config import CurriculumConfig
from tirl.tasks.base import Task
from tirl.train.curriculum import Curriculum

LEVELS = {"easy": 1.0, "mid": 0.5, "hard": 0.0}  # each bucket's pass rate, known
GROUP = 2


def leveled_task(position: int) -> Task:
    level = list(LEVELS)[position % 3]
    return Task(f"t/{position}", "train", "?", "0", lambda _: Score(0.0), "t", {"level": level})


def make_feed(board: ReportBoard) -> CurriculumFeed:
    cfg = CurriculumConfig(
        enabled=True, key=["level"], band=[0.2, 0.8], min_groups=1, order_by=None, explore=0.1
    )
    return CurriculumFeed(Curriculum(leveled_task, cfg, seed=3), GROUP, board.take)


def run_steps(feed: CurriculumFeed, board: ReportBoard, steps: int, batch: int = 4) -> list:
    """Steps of verl's synchronous trainer: draw a batch, then every sample of it reports."""
    drawn = []
    for _ in range(steps):
        rows = [feed.draw() for _ in range(batch)]
        for position, stream_position in rows:
            rate = LEVELS[leveled_task(stream_position).meta["level"]]
            for k in range(GROUP):
                board.report(position, k < rate * GROUP)
        drawn += [leveled_task(p).meta["level"] for _, p in rows]
    return drawn


def test_only_whole_groups_are_observed_in_position_order():
    pending = {3: [True], 1: [True, False], 0: [False, False], 2: [True, True, True]}
    assert finished_groups(pending, 2) == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert pending == {3: [True]}


def test_the_draws_concentrate_on_the_bucket_whose_pass_rate_is_in_band():
    board = ReportBoard()
    drawn = run_steps(make_feed(board), board, steps=30)
    late = Counter(drawn[40:])
    assert late["mid"] / sum(late.values()) > 0.8  # 0.9 of draws go to the only in-band bucket


def test_a_resumed_feed_draws_the_same_stream():
    board = ReportBoard()
    whole = run_steps(make_feed(board), board, steps=12)

    board = ReportBoard()
    first = make_feed(board)
    drawn = run_steps(first, board, steps=5)
    state = first.state_dict()  # the last step's reports are still on the board: taken now
    assert board.take() == [] and state["next_position"] == 20
    fresh = ReportBoard()  # a restarted run has a new board
    resumed = make_feed(fresh)
    resumed.load_state_dict(state)
    assert drawn + run_steps(resumed, fresh, steps=7) == whole


def test_each_finished_step_records_its_curriculum_metrics():
    board, records = ReportBoard(), []
    cfg = CurriculumConfig(
        enabled=True, key=["level"], band=[0.2, 0.8], min_groups=1, order_by=None, explore=0.1
    )
    curriculum = Curriculum(leveled_task, cfg, seed=3)
    feed = CurriculumFeed(curriculum, GROUP, board.take, batch_size=4, record=records.append)
    drawn = run_steps(feed, board, steps=6)
    # step s is recorded when step s + 1 draws: 5 of the 6 steps, in order
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    for step, record in enumerate(records):
        shares = {lv: record[f"curriculum/{lv}/share"] for lv in LEVELS}
        counted = Counter(drawn[4 * step : 4 * step + 4])
        assert shares == {lv: counted[lv] / 4 for lv in shares}  # that step's draws
        assert sum(shares.values()) == pytest.approx(1.0)
    assert records[-1]["curriculum/mid/pass_rate"] == pytest.approx(0.5)
    assert records[-1]["curriculum/buckets_in_band"] == 1


def test_the_metrics_file_needs_the_rows_of_a_step():
    assert metrics_settings({"tirl_curriculum": SECTION}) == (None, None)  # an older section
    with_file = {**SECTION, "metrics_file": "m.jsonl"}
    assert metrics_settings({"tirl_curriculum": {**with_file, "batch_size": 8}}) == (8, "m.jsonl")
    assert curriculum_settings({"tirl_curriculum": {**with_file, "batch_size": 8}})[1:] == (4, "r")
    for bad in (None, 0, "8", True):
        with pytest.raises(ConfigError) as err:
            metrics_settings({"tirl_curriculum": {**with_file, "batch_size": bad}})
        assert err.value.key == "data.tirl_curriculum.batch_size" and "\n" not in str(err.value)


def test_a_training_sample_reports_to_its_rows_board_and_validation_rows_do_not():
    board = board_handle("tirl-curriculum:report-test")  # no Ray here: this process's own
    asyncio.run(report_sample({POSITION_KEY: 7, BOARD_KEY: "tirl-curriculum:report-test"}, True))
    asyncio.run(report_sample({"index": 3}, False))
    assert board.take() == [(7, True)]


SECTION = {
    "key": ["level"], "band": [0.2, 0.8], "window": 4, "min_groups": 1, "explore": 0.1,
    "order_by": None, "widen_share": 0.5, "lookahead": 8, "group_size": 4, "run": "r",
}  # fmt: skip


def test_the_settings_come_from_the_data_section():
    cfg, group_size, run = curriculum_settings({"tirl_curriculum": SECTION})
    assert cfg.key == ["level"] and cfg.window == 4 and cfg.order_by is None
    assert (group_size, run) == (4, "r")


@pytest.mark.parametrize(
    "data,key",
    [
        ({}, "data.tirl_curriculum"),
        ({"tirl_curriculum": {**SECTION, "band": [0.9, 0.1]}}, "data.tirl_curriculum.band"),
        ({"tirl_curriculum": {**SECTION, "run": None}}, "data.tirl_curriculum.run"),
    ],
)
def test_bad_settings_are_one_line_errors_naming_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        curriculum_settings(data)
    assert err.value.key == key and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "data,key",
    [
        ({"dataloader_num_workers": 8, "train_files": "a", "val_files": "b"},
         "data.dataloader_num_workers"),
        ({"dataloader_num_workers": 0, "train_files": ["a"], "val_files": "a"}, "data.val_files"),
    ],
)  # fmt: skip
def test_a_data_config_the_curriculum_cannot_run_under_is_refused(data, key):
    with pytest.raises(ConfigError) as err:
        check_data_config(data)
    assert err.value.key == key and "\n" not in str(err.value)
