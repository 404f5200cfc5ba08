"""Retrying a training function's exception (issue 53): the AIR/v2 trainers' runs
(``RunSpec.retry_worker_errors``, Ray 2.x's ``FailureConfig(max_failures)``) count it like a death
against one limit, from the latest checkpoint; Ray Train 1.x's ``Trainer`` keeps its rule (deaths
only). Policy decisions as functions, then the controller stepped over sgd_testing.FakeGroup."""

import logging

import pytest

import sgd
from sgd.errors import TrainingFailedError, WorkerDiedError, WorkerError
from sgd.run.controller import Restarting, RunState
from sgd.run.policies import Failure, FailurePolicy, Raise, Retry, describe_failure, worker_rank
from sgd_testing import FakeGroup, fake_trainer_run, rounds_of

S = RunState


def _worker_error(exc, rank=1):
    """``exc`` as the driver gets it from worker ``rank``: chained to the WorkerError naming it."""
    exc.__cause__ = WorkerError(f"worker rank {rank} (pid 7 on h) raised {type(exc).__name__}: {exc}\n\n"
                                "Remote traceback:\n...", rank, "...")
    return exc


def _losses(rounds):
    return [r[0]["loss"] for r in rounds]


# --- the policy ----------------------------------------------------------------------------------


def test_a_worker_error_is_retried_up_to_the_limit_then_raised_as_it_is():
    policy = FailurePolicy(max_retries=2, retry_worker_errors=True)
    assert policy.decide(Failure(_worker_error(ValueError("flaky read")), "training")) == Retry(1)
    assert policy.decide(Failure(_worker_error(ValueError("flaky read")), "training")) == Retry(2)
    last = _worker_error(ValueError("flaky read"), rank=0)
    decision = policy.decide(Failure(last, "training"))
    assert decision == Raise(last)  # its own type, its WorkerError as __cause__: Trainer.run's contract
    assert policy.failures == 3


def test_deaths_and_worker_errors_count_against_one_limit():
    policy = FailurePolicy(max_retries=2, retry_worker_errors=True)
    assert policy.decide(Failure(WorkerDiedError("worker rank 0 died", 0), "training")) == Retry(1)
    assert policy.decide(Failure(_worker_error(KeyError("k")), "training")) == Retry(2)
    decision = policy.decide(Failure(WorkerDiedError("worker rank 1 died", 1), "restarting"))
    assert isinstance(decision, Raise) and isinstance(decision.error, TrainingFailedError)
    assert "after 3 attempts (max_retries=2)" in str(decision.error)


def test_unlimited_retries_retry_worker_errors_forever():
    policy = FailurePolicy(max_retries=-1, retry_worker_errors=True)
    assert all(isinstance(policy.decide(Failure(_worker_error(OSError("timeout")), "training")), Retry)
               for _ in range(100))


def test_zero_retries_raise_the_worker_error_at_once():
    error = _worker_error(ValueError("bad"))
    assert FailurePolicy(max_retries=0, retry_worker_errors=True).decide(Failure(error, "training")) == Raise(error)


def test_without_the_switch_a_worker_error_is_raised_at_once_and_not_counted():
    policy = FailurePolicy(max_retries=5)
    error = _worker_error(ValueError("bad"))
    assert policy.decide(Failure(error, "training")) == Raise(error)
    assert policy.failures == 0


def test_an_error_of_the_driver_is_never_retried():
    """A callback's or the driver's own error has no worker's rank: Ray's ControllerError, not retried."""
    policy = FailurePolicy(max_retries=-1, retry_worker_errors=True)
    for error in (RuntimeError("callback broke"), sgd.ResourcesUnavailableError("no room")):
        assert policy.decide(Failure(error, "training")) == Raise(error)
    assert policy.failures == 0


def test_a_worker_error_that_did_not_unpickle_is_retried_too():
    unsent = WorkerError("worker rank 2 (pid 1 on h) raised Weird: x\n\nRemote traceback:\n...", 2, "...")
    assert worker_rank(unsent) == 2
    assert FailurePolicy(max_retries=1, retry_worker_errors=True).decide(Failure(unsent, "training")) == Retry(1)


def test_the_retry_is_logged_with_the_rank_type_and_message(caplog):
    policy = FailurePolicy(max_retries=3, retry_worker_errors=True)
    with caplog.at_level(logging.WARNING, logger="sgd"):
        policy.decide(Failure(_worker_error(ValueError("flaky read of shard 3"), rank=1), "training"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("worker rank 1 raised ValueError: flaky read of shard 3; restarting the workers from the "
                    "latest checkpoint (failure 1 of 3)")
    with caplog.at_level(logging.WARNING, logger="sgd"):
        policy.decide(Failure(_worker_error(ValueError("again")), "training"))
        FailurePolicy(max_retries=-1, retry_worker_errors=True).decide(Failure(_worker_error(KeyError("k")), "t"))
    assert "(failure 2 of 3)" in caplog.records[1].getMessage()
    assert caplog.records[2].getMessage().endswith("(failure 1 of unlimited)")


def test_giving_up_on_a_worker_error_is_logged_with_the_count(caplog):
    with caplog.at_level(logging.ERROR, logger="sgd"):
        FailurePolicy(max_retries=0, retry_worker_errors=True).decide(Failure(_worker_error(ValueError("b")), "t"))
    assert caplog.records[-1].getMessage() == ("worker rank 1 raised ValueError: b; giving up after 1 attempt "
                                               "(max_failures=0)")


def test_a_failure_names_a_class_outside_builtins_by_its_module():
    class Flaky(Exception):
        pass

    text = describe_failure(_worker_error(Flaky("x"), rank=3))
    assert text == f"worker rank 3 raised {__name__}.test_a_failure_names_a_class_outside_builtins_by_its_module" \
                   ".<locals>.Flaky: x"
    assert describe_failure(WorkerDiedError("worker rank 0 died: SIGKILL", 0)) == "worker rank 0 died: SIGKILL"


def test_a_new_scope_retries_deaths_only_unless_told():
    policy = FailurePolicy(max_retries=3, retry_worker_errors=True)
    policy.reset()  # the group's start: deaths only
    error = _worker_error(ValueError("hook"))
    assert policy.decide(Failure(error, "starting the workers")) == Raise(error)
    policy.reset(2, retry_worker_errors=True)
    assert policy.decide(Failure(_worker_error(ValueError("x")), "training")) == Retry(1)


# --- the controller --------------------------------------------------------------------------


def test_a_worker_error_restarts_the_run_from_the_latest_checkpoint(tmp_path):
    group = FakeGroup(2)
    group.report({"loss": 1.0}).save({"epoch": 1}).report({"loss": 0.9}).raise_(ValueError("flaky read"), rank=1)
    group.report({"loss": 0.9}).report({"loss": 0.8}).finish(["done", None])
    run = fake_trainer_run(group, tmp_path, max_retries=1, retry_worker_errors=True)
    assert _losses(rounds_of(run)) == [1.0, 0.9, 0.8]
    assert run.transitions == [S.STARTING, S.RUNNING, S.RESTARTING, S.RUNNING, S.FINISHED]
    restarting = next(s for s in run.history if isinstance(s, Restarting))
    assert isinstance(restarting.failure.error, ValueError) and restarting.attempt == 1
    restart = next(d for name, d in group.calls if name == "restart")
    assert restart["error"] is restarting.failure.error  # the backend's on_failure hears of it
    assert group.started_from(1) == {"epoch": 1} and group.requests[1].start_iteration == 1
    assert run.returns == ["done", None]


def test_worker_errors_past_the_limit_end_the_run_with_the_last_one(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).raise_(ValueError("first"), rank=0)
    group.raise_(ValueError("second"), rank=1)
    run = fake_trainer_run(group, tmp_path, max_retries=1, retry_worker_errors=True)
    assert _losses([run.next()]) == [1.0]
    with pytest.raises(ValueError, match="second") as info:
        run.next()
    assert isinstance(info.value.__cause__, WorkerError) and info.value.__cause__.world_rank == 1
    assert group.restarts == 1
    assert run.transitions[-2:] == [S.FAILING, S.ERRORED]
    assert group.calls[-1][0] == "end" and group.calls[-1][1]["ok"] is False


def test_without_the_switch_the_same_error_ends_the_run_at_once(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).raise_(ValueError("flaky read"), rank=1).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=3)
    run.next()
    with pytest.raises(ValueError, match="flaky read"):
        run.next()
    assert group.restarts == 0


def test_a_callback_error_is_not_retried_by_a_run_that_retries_worker_errors(tmp_path):
    class Bad(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            raise RuntimeError("callback broke")

    group = FakeGroup(2).report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=3, retry_worker_errors=True, callbacks=[Bad()])
    with pytest.raises(RuntimeError, match="callback broke"):
        run.next()
    assert group.restarts == 0 and run.state is S.ERRORED


def test_an_error_of_the_driver_in_the_group_is_not_retried(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).raise_(RuntimeError("workers are out of step"), rank=None)
    run = fake_trainer_run(group, tmp_path, max_retries=3, retry_worker_errors=True)
    run.next()
    with pytest.raises(RuntimeError, match="out of step"):
        run.next()
    assert group.restarts == 0


def test_the_groups_start_does_not_retry_a_hook_error_after_a_run_that_did(tmp_path):
    group = FakeGroup(1).raise_(ValueError("once"), rank=0).report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=2, retry_worker_errors=True)
    assert _losses(rounds_of(run)) == [1.0]
    controller = run._controller
    controller.shutdown()
    hook_error = _worker_error(ValueError("bad hook"), rank=0)
    group.outcome("start", hook_error)
    with pytest.raises(ValueError, match="bad hook"):
        controller.start()
    assert [name for name, _ in group.calls].count("start") == 2  # the first, and the one refused
