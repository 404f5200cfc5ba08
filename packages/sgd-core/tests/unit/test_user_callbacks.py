"""Ray Train 2.x's ``UserCallback`` in ``RunConfig(callbacks=[...])`` (issue 53): which objects a
RunConfig takes, and the run controller calling them (``after_report`` per round with every
worker's metrics and the round's checkpoint, ``after_exception`` per failure with the ranks),
stepped over sgd_testing.FakeGroup. The same with real Ray: tests/test_user_callbacks.py."""

from pathlib import Path

import pytest

import sgd
from sgd.air.callback import TrainRunContext, UserCallbacks, user_callbacks_of, user_metrics, worker_exceptions
from sgd.errors import TrainingHangError, WorkerDiedError, WorkerError
from sgd.run.controller import RunState
from sgd_testing import FakeGroup, fake_trainer_run, rounds_of

S = RunState


class Recorder(sgd.UserCallback):
    """Every call, in order: (hook, arguments)."""

    def __init__(self, fail_in=None):
        self.calls = []
        self.fail_in = fail_in

    def after_report(self, run_context, metrics, checkpoint):
        self.calls.append(("after_report", run_context, metrics, checkpoint))
        if self.fail_in == "after_report":
            raise ValueError("the callback's own bug")

    def after_exception(self, run_context, worker_exceptions):
        self.calls.append(("after_exception", run_context, worker_exceptions))
        if self.fail_in == "after_exception":
            raise KeyError("the callback's own bug")


def _context():
    return TrainRunContext(run_config=sgd.RunConfig(name="r"), train_loop_config={"lr": 0.1},
                           scaling_config=sgd.ScalingConfig(num_workers=2), backend_config=sgd.BackendConfig())


def _run(group, tmp_path, *callbacks, **kwargs):
    """A fake run with the user callbacks, called as an AIR trainer calls them."""
    users = UserCallbacks(callbacks, _context())
    run = fake_trainer_run(group, tmp_path, callbacks=[users], **kwargs)
    users.checkpoint_for = run.checkpoint_for
    return run


def _worker_error(exc, rank):
    exc.__cause__ = WorkerError(f"worker rank {rank} raised {type(exc).__name__}: {exc}", rank, "...")
    return exc


# --- RunConfig(callbacks=...) ---------------------------------------------------------------------


def test_run_config_takes_user_callbacks_beside_training_callbacks():
    user, own = Recorder(), sgd.TrainingCallback()
    assert sgd.RunConfig(callbacks=[user, own]).callbacks == [user, own]


@pytest.mark.parametrize("bad, named", [([object()], "object"), ([Recorder, 3], "type, int"), (Recorder(), "Recorder")])
def test_run_config_refuses_anything_else_naming_what_it_takes(bad, named):
    with pytest.raises(TypeError) as info:
        sgd.RunConfig(callbacks=bad)
    message = str(info.value)
    assert named in message and "sgd.UserCallback" in message and "sgd.TrainingCallback" in message


def test_no_user_callback_adds_nothing_to_a_round():
    trainer = sgd.DataParallelTrainer(lambda: None, run_config=sgd.RunConfig(callbacks=[sgd.TrainingCallback()]))
    assert user_callbacks_of(trainer, trainer.run_config.callbacks) is None
    trainer = sgd.DataParallelTrainer(lambda: None, train_loop_config={"a": 1},
                                      scaling_config=sgd.ScalingConfig(num_workers=2),
                                      run_config=sgd.RunConfig(name="n", callbacks=[Recorder()]))
    users = user_callbacks_of(trainer, trainer.run_config.callbacks)
    context = users.context
    assert (context.run_config, context.train_loop_config, context.scaling_config, context.backend_config) == (
        trainer.run_config, {"a": 1}, trainer.scaling_config, trainer.backend_config)
    assert context.get_run_config() is trainer.run_config and len(context.run_id) == 32


def test_each_run_context_has_its_own_id_and_cannot_be_changed():
    first, second = _context(), _context()
    assert first.run_id != second.run_id
    with pytest.raises(AttributeError):
        first.run_id = "x"


# --- after_report ---------------------------------------------------------------------------------


def test_after_report_gets_every_workers_metrics_and_the_rounds_checkpoint(tmp_path):
    group = (FakeGroup(2).report({"loss": 1.0}, {"loss": 1.5})
             .report({"loss": 0.5}, {"loss": 0.7}, checkpoint={"epoch": 1})
             .report({"loss": 0.25}).finish())
    recorder = Recorder()
    rounds_of(_run(group, tmp_path, recorder))
    assert [c[0] for c in recorder.calls] == ["after_report"] * 3
    metrics = [c[2] for c in recorder.calls]
    # What each worker reported, by rank, without sgd's own fields.
    assert metrics == [[{"loss": 1.0}, {"loss": 1.5}], [{"loss": 0.5}, {"loss": 0.7}],
                       [{"loss": 0.25}, {"loss": 0.25}]]
    checkpoints = [c[3] for c in recorder.calls]
    assert checkpoints[0] is None and checkpoints[2] is None
    saved = checkpoints[1]
    assert isinstance(saved, sgd.Checkpoint)
    assert Path(saved.path).parent == tmp_path / "run_001" / "checkpoints"  # persisted before the call
    assert sgd.Checkpoint.from_directory(saved.path, trusted=True).to_dict()["epoch"] == 1
    assert all(c[1] is recorder.calls[0][1] for c in recorder.calls)  # one context for the run


def test_user_metrics_leave_out_only_what_sgd_stamps():
    stamped = {"loss": 1, "_training_iteration": 3, "_timestamp": 9, "_time_this_iter_s": 0.1, "_date": "d",
               "_pid": 1, "_hostname": "h", "_node_ip": "ip", "_time_total_s": 2, "_mine": 4}
    assert user_metrics(stamped) == {"loss": 1, "_mine": 4}


# --- after_exception ------------------------------------------------------------------------------


def test_after_exception_names_the_failed_rank_before_the_retry(tmp_path):
    # The restarted workers report round 1 again (dropped: already delivered), then round 2.
    group = FakeGroup(2).report({"loss": 1.0}).die(rank=1).report({"loss": 1.0}).report({"loss": 0.5}).finish()
    recorder = Recorder()
    run = _run(group, tmp_path, recorder, max_retries=1)
    rounds_of(run)
    assert [c[0] for c in recorder.calls] == ["after_report", "after_exception", "after_report"]
    failed = recorder.calls[1][2]
    assert list(failed) == [1] and isinstance(failed[1], WorkerDiedError)
    assert run.transitions[-1] is S.FINISHED and group.restarts == 1


def test_after_exception_gets_the_training_functions_own_exception_when_it_ends_the_run(tmp_path):
    error = _worker_error(ValueError("bad batch"), rank=1)
    group = FakeGroup(2).report({"loss": 1.0}).raise_(error)
    recorder = Recorder()
    run = _run(group, tmp_path, recorder)
    with pytest.raises(ValueError, match="bad batch"):
        rounds_of(run)
    assert recorder.calls[-1][0] == "after_exception" and recorder.calls[-1][2] == {1: error}


def test_after_exception_is_called_for_every_retried_failure(tmp_path):
    group = (FakeGroup(2).raise_(_worker_error(OSError("flaky read"), rank=0)).die(rank=1)
             .report({"loss": 0.5}).finish())
    recorder = Recorder()
    rounds_of(_run(group, tmp_path, recorder, max_retries=2, retry_worker_errors=True))
    excepted = [c[2] for c in recorder.calls if c[0] == "after_exception"]
    assert [list(e) for e in excepted] == [[0], [1]]
    assert isinstance(excepted[0][0], OSError)


def test_worker_exceptions_by_rank_and_none_for_the_drivers_own():
    death = WorkerDiedError("rank 2 died", 2)
    assert worker_exceptions(death) == {2: death}
    hang = TrainingHangError("no progress", [0, 3], ["", "", "", ""])
    assert worker_exceptions(hang) == {0: hang, 3: hang}
    raised = _worker_error(ValueError("x"), rank=0)
    assert worker_exceptions(raised) == {0: raised}

    class Grouped(Exception):
        worker_failures = {0: raised, 1: death}

    assert worker_exceptions(Grouped()) == {0: raised, 1: death}
    # The group could not be placed, the driver's own bug, a group with no ranks yet: no worker to name.
    assert worker_exceptions(sgd.ResourcesUnavailableError("no room")) == {}
    assert worker_exceptions(RuntimeError("driver")) == {}
    assert worker_exceptions(WorkerDiedError("died while starting", -1)) == {}


# --- a callback that raises -----------------------------------------------------------------------


@pytest.mark.parametrize("hook, script, original", [
    ("after_report", lambda g: g.report({"loss": 1.0}).report({"loss": 0.5}).finish(), ValueError),
    ("after_exception", lambda g: g.report({"loss": 1.0}).die(rank=0).report({"loss": 0.5}).finish(), KeyError),
])
def test_a_callback_that_raises_ends_the_run_at_once_never_retried(tmp_path, hook, script, original):
    """The run ends with the callback's exception as it is (fit() raises it as a ControllerError:
    tests/test_user_callbacks.py); the failure policy never sees it."""
    group = script(FakeGroup(2))
    recorder = Recorder(fail_in=hook)
    run = _run(group, tmp_path, recorder, max_retries=3, retry_worker_errors=True)
    with pytest.raises(original, match="the callback's own bug"):
        rounds_of(run)
    assert run.transitions[-1] is S.ERRORED and group.restarts == 0
    assert [c[0] for c in recorder.calls].count(hook) == 1


def test_a_trial_stopped_by_tune_inside_a_callback_leaves_the_run_interrupted_not_errored(tmp_path):
    """Ray Tune stops a driver-function trial by making its thread exit (SystemExit) inside
    ``tune.report``, which TuneReportCallback calls: the run ends at once, INTERRUPTED."""
    from sgd.runs import run_status

    class Stopped(sgd.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            raise SystemExit(0)

    group = FakeGroup(1).report({"loss": 1.0}).report({"loss": 0.5}).finish()
    run = _run(group, tmp_path, Stopped())
    with pytest.raises(SystemExit):
        rounds_of(run)
    assert run.transitions[-1] is S.ERRORED and run_status(tmp_path / "run_001") == "INTERRUPTED"
