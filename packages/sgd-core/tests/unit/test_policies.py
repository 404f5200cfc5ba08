"""The run controller's policies return decisions (no Ray needed): what a failure leads to,
what size a group should have. The controller only carries them out (test_controller.py
shows the states a run goes through)."""

import pickle

import pytest

import sgd
from sgd._common.nodes import NodeInfo
from sgd.run.policies import (
    ClusterView,
    Failure,
    FailurePolicy,
    NoOp,
    Raise,
    Resize,
    Retry,
    ScalingPolicy,
    Wait,
)


def _death(rank=1):
    return sgd.WorkerDiedError(f"worker rank {rank} died", rank)


def test_deaths_are_retried_up_to_max_retries_then_raised_with_the_last_death_as_cause():
    policy = FailurePolicy(max_retries=2)
    assert policy.decide(Failure(_death(), "training")) == Retry(1)
    assert policy.decide(Failure(_death(), "restarting")) == Retry(2)
    last = _death(0)
    decision = policy.decide(Failure(last, "training"))
    assert isinstance(decision, Raise)
    assert isinstance(decision.error, sgd.TrainingFailedError)
    assert decision.error.__cause__ is last
    assert "after 3 attempts (max_retries=2)" in str(decision.error)
    assert "while training" in str(decision.error)


def test_unlimited_retries_never_raise_for_deaths():
    policy = FailurePolicy(max_retries=-1)
    assert all(isinstance(policy.decide(Failure(_death(), "training")), Retry) for _ in range(50))


def test_zero_retries_raise_at_the_first_death():
    decision = FailurePolicy(max_retries=0).decide(Failure(_death(), "starting the workers"))
    assert isinstance(decision, Raise) and "while starting the workers" in str(decision.error)


def test_a_user_error_is_raised_as_it_is_and_not_counted():
    policy = FailurePolicy(max_retries=1)
    error = ZeroDivisionError("user code")
    assert policy.decide(Failure(error, "training")) == Raise(error)
    assert policy.failures == 0
    assert policy.decide(Failure(_death(), "training")) == Retry(1)


def test_decisions_pickle():
    # a decision may cross a process boundary (a Tune trial's error, a remote controller)
    for decision in (Retry(2), Resize(3, "room"), Wait("no room"), NoOp()):
        assert pickle.loads(pickle.dumps(decision)) == decision


def _draining(node="n1"):
    return {node: NodeInfo(node_id=node, ip="127.0.0.3", alive=True, port=1, drain_deadline=float("inf"))}


def test_fixed_size_group_does_nothing_without_a_drain():
    policy = ScalingPolicy(2, 2)
    assert policy.decide(ClusterView(room=8), current=2) == NoOp()
    assert policy.size(8) == 2 and policy.size(0) == 2


def test_elastic_group_grows_to_the_room_but_not_past_max():
    policy = ScalingPolicy(2, 4)
    assert policy.decide(ClusterView(room=3), current=2) == Resize(3, "room for 3 workers (running 2, max 4)")
    assert policy.decide(ClusterView(room=10), current=2).num_workers == 4
    assert policy.decide(ClusterView(room=2), current=2) == NoOp()
    assert policy.decide(ClusterView(room=10), current=4) == NoOp()


def test_draining_host_is_left_when_the_rest_has_room_else_the_group_waits():
    policy = ScalingPolicy(2, 4)
    move = policy.decide(ClusterView(room=2, draining=_draining()), current=4)
    assert isinstance(move, Resize) and move.num_workers == 2
    assert "127.0.0.3" in move.reason and "checkpoint committed" in move.reason
    near = policy.decide(ClusterView(room=3, draining=_draining(), deadline_near=True), current=4)
    assert isinstance(near, Resize) and "deadline is near" in near.reason
    stay = policy.decide(ClusterView(room=1, draining=_draining()), current=4)
    assert isinstance(stay, Wait) and "room for 1 of the 2 workers needed" in stay.reason


def test_start_size_is_the_room_clamped_to_min_and_max():
    policy = ScalingPolicy(2, 4)
    assert [policy.size(n) for n in (0, 1, 2, 3, 4, 9)] == [2, 2, 2, 3, 4, 4]


@pytest.mark.parametrize("bounds", [(0, 2), (3, 2)])
def test_scaling_policy_refuses_impossible_bounds(bounds):
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        ScalingPolicy(*bounds)
