"""The rollout-cluster simulation: determinism, conservation of work, capacity limits, and
hand-computed step times."""

import pytest

from tirl.studies.simulate import (
    CostModel,
    Schedule,
    SimTrajectory,
    WorkloadSpec,
    simulate,
    standard_schedules,
)

SMALL = WorkloadSpec(
    prompts_per_step=4,
    samples_per_prompt=4,
    response_median=2_000,
    response_max=8_000,
    tokens_per_call=400,
    max_calls=16,
)
TIGHT = CostModel(max_batch=6, kv_capacity_tokens=30_000)
SMALL_SEGMENTS = {"seg_tokens": 1_500, "seg_calls": 3, "rebalance_threshold": 4}


def _all():
    return standard_schedules(**SMALL_SEGMENTS)


@pytest.mark.parametrize("schedule", _all(), ids=lambda s: s.name)
def test_same_seed_same_result_and_other_seed_differs(schedule):
    a = simulate(schedule, SMALL, TIGHT, replicas=2, seed=3, n_steps=3)
    b = simulate(schedule, SMALL, TIGHT, replicas=2, seed=3, n_steps=3)
    c = simulate(schedule, SMALL, TIGHT, replicas=2, seed=4, n_steps=3)
    assert [s.time_s for s in a.steps] == [s.time_s for s in b.steps]
    assert a.ledger == b.ledger
    assert [s.time_s for s in a.steps] != [s.time_s for s in c.steps]


@pytest.mark.parametrize("schedule", _all(), ids=lambda s: s.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_token_and_tool_call_done_exactly_once_within_limits(schedule, seed):
    res = simulate(schedule, SMALL, TIGHT, replicas=2, seed=seed, n_steps=4, drain=True)
    assert res.ledger == {tid: list(v) for tid, v in res.expected.items()}
    assert len(res.ledger) == 4 * 16
    assert res.max_batch_seen <= TIGHT.max_batch
    assert res.max_kv_seen <= TIGHT.kv_capacity_tokens
    for s in res.steps:
        assert 0.0 <= s.idle_share <= 1.0
    assert sum(s.tokens for s in res.steps) == sum(t for t, _ in res.expected.values())
    if schedule.partial:
        assert len(res.steps) > 4  # long trajectories were carried and drained afterwards


def test_partial_rollouts_carry_long_trajectories_to_later_steps():
    partial = Schedule("p", partial=True, seg_tokens=1_500, seg_calls=3)
    res = simulate(partial, SMALL, TIGHT, replicas=2, seed=0, n_steps=1, drain=True)
    longest = max(t for t, _ in res.expected.values())
    assert len(res.steps) >= -(-longest // 1_500)


# Hand-checked case: one replica; a = 1 s, b = 0.5 s per sequence, prefill 0.01 s per token.
# A: prompt 10, decodes 3 tokens, no tool.  B: prompt 10, decodes 2, calls a 10 s tool that
# returns 5 tokens, decodes 4.
HAND_COST = CostModel(1.0, 0.5, 0.01, max_batch=4, kv_capacity_tokens=1_000)
HAND = [
    [
        SimTrajectory(0, 10, (3,), (), ()),
        SimTrajectory(1, 10, (2, 4), (5,), (10.0,)),
    ]
]


def test_hand_computed_sync_step():
    res = simulate(Schedule("sync", mode="sync"), cost=HAND_COST, replicas=1, trajectories=HAND)
    # prefill 20 tok (0.2) + 2 steps at batch 2 (2 x 2.0) + 1 step at batch 1 (1.5)
    # + tool wait 10 + prefill 5 tok (0.05) + 4 steps at batch 1 (6.0) = 21.75
    step = res.steps[0]
    assert step.time_s == pytest.approx(21.75)
    assert step.busy_s == pytest.approx(11.75)
    assert step.idle_share == pytest.approx(10.0 / 21.75)


def test_hand_computed_async_step():
    res = simulate(Schedule("async"), cost=HAND_COST, replicas=1, trajectories=HAND)
    # A admitted at 0 (prefill 0.1); B joins at 0.1 (prefill 0.1); both decode from 0.2:
    # 2 steps at batch 2 -> 4.2, B leaves for its tool (back at 14.2), A's last step -> 5.7;
    # B resumes at 14.2 on its parked cache: prefill 5 tok (0.05) + 4 x 1.5 -> 20.25.
    step = res.steps[0]
    assert step.time_s == pytest.approx(20.25)
    assert step.busy_s == pytest.approx(11.75)
    assert res.ledger == {0: [3, 0], 1: [6, 1]}


def test_hand_computed_partial_rollout_reprefills_carried_context():
    one = [[SimTrajectory(0, 10, (5,), (), ())]]
    partial = Schedule("p", partial=True, seg_tokens=3)
    res = simulate(partial, cost=HAND_COST, replicas=1, trajectories=one, n_steps=1, drain=True)
    # step 1: prefill 10 (0.1) + 3 x 1.5; step 2: re-prefill 13 (0.13) + 2 x 1.5
    assert [s.time_s for s in res.steps] == pytest.approx([4.6, 3.13])
    assert res.ledger == {0: [5, 0]}


def test_router_moves_a_trajectory_off_an_overloaded_replica():
    router = Schedule("r", partial=True, router="prefix_aware", rebalance_threshold=0)
    res = simulate(router, SMALL, TIGHT, replicas=2, seed=0, n_steps=2, drain=True)
    assert res.migrations > 0
    assert res.ledger == {tid: list(v) for tid, v in res.expected.items()}


@pytest.mark.parametrize("seed", range(4))
def test_async_never_slower_than_sync_on_the_same_workload(seed):
    sync, asyn = standard_schedules()[:2]
    a = simulate(sync, SMALL, TIGHT, replicas=2, seed=seed, n_steps=2)
    b = simulate(asyn, SMALL, TIGHT, replicas=2, seed=seed, n_steps=2)
    for s_sync, s_async in zip(a.steps, b.steps):
        assert s_async.time_s <= s_sync.time_s


def test_drain_steps_are_not_measured():
    partial = Schedule("p", partial=True, seg_tokens=1_500, seg_calls=3)
    res = simulate(partial, SMALL, TIGHT, replicas=2, seed=0, n_steps=2, drain=True)
    assert len(res.steps) > 2
    assert res.measured == res.steps[:2]


def test_non_sticky_round_robin_reprefills_every_turn():
    sticky = Schedule("s", partial=True, seg_tokens=1_500, seg_calls=3)
    loose = Schedule(
        "l", partial=True, seg_tokens=1_500, seg_calls=3, router="round_robin_per_turn"
    )
    a = simulate(sticky, SMALL, TIGHT, replicas=2, seed=0, n_steps=3, drain=True)
    b = simulate(loose, SMALL, TIGHT, replicas=2, seed=0, n_steps=3, drain=True)
    assert b.ledger == {tid: list(v) for tid, v in b.expected.items()}
    assert sum(s.busy_s for s in b.steps) > sum(s.busy_s for s in a.steps)
