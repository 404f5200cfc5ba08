"""The run controller stepped over a scripted worker group (sgd_testing.FakeGroup), without
Ray: every state transition and every policy decision — a death in each phase, retries
running out, a user error, a resize, a drain, a lost host, a hang, a stop, Ctrl-C."""

import json
import logging

import pytest

import sgd
from sgd.errors import ResourcesUnavailableError, TrainingFailedError, TrainingHangError, WorkerDiedError
from sgd.run import controller as controller_module
from sgd.run.controller import Resizing, Restarting, RunController, RunState
from sgd_testing import FakeGroup, fake_trainer_run, rounds_of

S = RunState


def _losses(rounds):
    return [r[0]["loss"] for r in rounds]


def _lines(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def _names(group, *wanted):
    return [name for name, _ in group.calls if name in wanted]


# --- a run that goes well --------------------------------------------------------------------


@pytest.mark.parametrize("num_to_keep, durable", [(None, True), (2, True), (0, False)])
def test_the_workers_write_checkpoints_durably_unless_the_run_keeps_none(tmp_path, num_to_keep, durable):
    group = FakeGroup(1).finish([None])
    rounds_of(fake_trainer_run(group, tmp_path, num_to_keep=num_to_keep))
    target = group.requests[-1].checkpoint_target
    assert target.durable is durable and target.directory == str(tmp_path / "run_001" / "checkpoints")


def test_reports_are_delivered_written_and_the_returns_kept(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).report({"loss": 0.5}, {"loss": 0.6}).finish(["a", "b"])
    run = fake_trainer_run(group, tmp_path)
    rounds = rounds_of(run)
    assert _losses(rounds) == [1.0, 0.5]
    assert rounds[1][1]["loss"] == 0.6 and rounds[1][1]["_training_iteration"] == 2
    assert run.returns == ["a", "b"]
    assert run.transitions == [S.STARTING, S.RUNNING, S.FINISHED]
    assert [r[0]["loss"] for r in _lines(tmp_path / "run_001")] == [1.0, 0.5]
    assert group.calls[-1] == ("end", {"ok": True, "error": None})
    assert run.next() is None  # a finished run stays finished


def test_idle_polls_deliver_nothing_and_change_no_state(tmp_path):
    group = FakeGroup(1).idle(times=3).report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, hang_timeout_s=60)
    assert _losses(rounds_of(run)) == [1.0]
    assert run.transitions == [S.STARTING, S.RUNNING, S.FINISHED]


# --- failures at each phase ------------------------------------------------------------------


def test_a_death_mid_run_restarts_from_the_latest_checkpoint_and_replays_nothing(tmp_path):
    group = FakeGroup(2)
    group.report({"loss": 1.0}).save({"epoch": 1}).report({"loss": 0.9}).die(rank=1)
    # After the restart the workers resume from the checkpoint (iteration 1): report 2 is
    # redone (a replay the callbacks already have), then new reports follow.
    group.report({"loss": 0.9}).report({"loss": 0.8}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert _losses(rounds_of(run)) == [1.0, 0.9, 0.8]
    assert run.transitions == [S.STARTING, S.RUNNING, S.RESTARTING, S.RUNNING, S.FINISHED]
    restarting = next(s for s in run.history if isinstance(s, Restarting))
    assert isinstance(restarting.failure.error, WorkerDiedError) and restarting.attempt == 1
    assert restarting.failure.phase == "training"
    # The second start got the checkpoint and counts on from the report it goes with.
    assert group.started_from(1) == {"epoch": 1} and group.requests[1].start_iteration == 1
    assert [line[0]["_training_iteration"] for line in _lines(tmp_path / "run_001")] == [1, 2, 3]


def test_a_restart_sends_the_checkpoint_undecoded_for_the_workers_to_decode(tmp_path, monkeypatch):
    """The driver reads and verifies the checkpoint it restarts from but does not decode it: the
    workers have the framework its codec needs (a cold import of torch on the driver made a
    restart after a lost host 1.2 s slower)."""
    from sgd.checkpoint.codecs import get_codec
    from sgd.checkpoint.encoded import EncodedState

    codec_cls = type(get_codec("pickle"))
    load, loads = codec_cls.load, []
    monkeypatch.setattr(codec_cls, "load", lambda self, f, trusted, where: loads.append(where) or load(
        self, f, trusted, where))
    group = FakeGroup(2)
    group.report({"loss": 1.0}).save({"epoch": 1}).report({"loss": 0.9}).die(rank=1)
    group.report({"loss": 0.9}).finish()
    assert _losses(rounds_of(fake_trainer_run(group, tmp_path, max_retries=1))) == [1.0, 0.9]
    assert isinstance(group.requests[1].checkpoint, EncodedState) and loads == []
    assert group.started_from(1) == {"epoch": 1}


def test_retries_running_out_end_in_training_failed_with_the_last_death_as_cause(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).die(rank=0).die(rank=1, message="again")
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert _losses([run.next()]) == [1.0]
    with pytest.raises(TrainingFailedError, match=r"after 2 attempts \(max_retries=1\).*training") as info:
        run.next()
    assert isinstance(info.value.__cause__, WorkerDiedError) and "again" in str(info.value.__cause__)
    assert run.transitions[-2:] == [S.FAILING, S.ERRORED]
    assert group.calls[-1][0] == "end" and group.calls[-1][1]["ok"] is False
    from sgd.runs import STATUS_FILE

    assert json.loads((tmp_path / "run_001" / STATUS_FILE).read_text())["status"] == "ERRORED"


def test_a_user_error_is_raised_as_it_is_and_never_retried(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).raise_(KeyError("missing")).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=5)
    run.next()
    with pytest.raises(KeyError, match="missing"):
        run.next()
    assert group.restarts == 0
    assert run.state is S.ERRORED


def test_a_death_while_the_run_starts_is_retried_then_the_run_goes_on(tmp_path):
    group = FakeGroup(2).outcome("begin", WorkerDiedError("worker rank 0 died while starting", 0))
    group.report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert _losses(rounds_of(run)) == [1.0]
    assert run.transitions == [S.STARTING, S.RESTARTING, S.RUNNING, S.FINISHED]
    assert next(s for s in run.history if isinstance(s, Restarting)).failure.phase == "starting the run"


def test_deaths_while_restarting_count_against_the_same_limit(tmp_path):
    died = WorkerDiedError("worker rank 1 died while setting the worker group up", 1)
    group = FakeGroup(2).die().outcome("restart", died, died)
    run = fake_trainer_run(group, tmp_path, max_retries=2)
    with pytest.raises(TrainingFailedError, match=r"after 3 attempts.*while restarting") as info:
        rounds_of(run)
    assert info.value.__cause__ is died
    assert group.restarts == 2


def test_a_placement_that_times_out_while_restarting_says_where_the_results_are(tmp_path):
    group = FakeGroup(2).die().outcome("restart", ResourcesUnavailableError("the cluster has no room for 2 workers."))
    run = fake_trainer_run(group, tmp_path, max_retries=3)
    with pytest.raises(ResourcesUnavailableError, match=r"no room.*kept in .*run_001.*Trainer.restore") as info:
        rounds_of(run)
    assert isinstance(info.value.__cause__, ResourcesUnavailableError)


def test_the_group_start_retries_deaths_and_raises_user_errors_at_once(tmp_path):
    died = WorkerDiedError("worker rank 0 died while setting the worker group up", 0)
    group = FakeGroup(2).outcome("start", died)
    controller = RunController(group, max_retries=1)
    controller.start()
    assert _names(group, "start") == ["start", "start"] and controller.attempt == 1

    group = FakeGroup(2).outcome("start", died, died)
    with pytest.raises(TrainingFailedError, match=r"after 2 attempts.*starting the workers") as info:
        RunController(group, max_retries=1).start()
    assert info.value.__cause__ is died

    group = FakeGroup(2).outcome("start", ValueError("bad hook"))
    with pytest.raises(ValueError, match="bad hook"):
        RunController(group, max_retries=3).start()
    assert _names(group, "start") == ["start"]


def test_each_run_counts_its_failures_afresh_with_the_limit_it_begins_with(tmp_path):
    group = FakeGroup(1).die().report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    rounds_of(run)
    controller = run._controller
    # A second run on the same group: one death is within its own limit again.
    group.die().report({"loss": 2.0}).finish()
    second = fake_trainer_run(group, tmp_path, max_retries=1, controller=controller)
    assert _losses(rounds_of(second)) == [2.0]
    # A third run whose limit is 0: the same death now ends it.
    group.die().finish()
    third = fake_trainer_run(group, tmp_path, max_retries=0, controller=controller)
    with pytest.raises(TrainingFailedError, match=r"max_retries=0"):
        rounds_of(third)


def test_a_run_that_ended_badly_has_its_group_replaced_before_the_next_run(tmp_path):
    group = FakeGroup(1).raise_(ValueError("boom"))
    run = fake_trainer_run(group, tmp_path)
    with pytest.raises(ValueError):
        rounds_of(run)
    assert group.needs_restart
    group.report({"loss": 1.0}).finish()
    second = fake_trainer_run(group, tmp_path, controller=run._controller)
    assert _losses(rounds_of(second)) == [1.0]
    restart = [d for name, d in group.calls if name == "restart"]
    assert restart == [{"error": None, "size": None, "move": False}]
    assert _names(group, "restart", "begin")[-2:] == ["restart", "begin"]


# --- hosts: lost, draining, room to grow -----------------------------------------------------


def test_a_host_declared_dead_restarts_the_group_without_waiting_for_a_worker_call(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).call(lambda g: g.lose_host(rank=1)).idle()
    # No checkpoint: the new group starts over; its first report is a replay (not delivered again).
    group.call(lambda g: setattr(g, "health_now", sgd.group.status.HEALTHY))
    group.report({"loss": 1.0}).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    restart = next(d for name, d in group.calls if name == "restart")
    assert "declared dead" in str(restart["error"])


def test_a_draining_host_is_announced_once_and_left_at_the_next_checkpoint_without_counting(tmp_path):
    group = FakeGroup(2)
    group.report({"loss": 1.0}).call(lambda g: g.drain("node-b")).idle(times=2)
    group.save({"epoch": 1}).call(lambda g: setattr(g, "health_now", sgd.group.status.HEALTHY))
    group.report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=0)  # a resize is not a failure
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    assert _names(group, "announce_drain") == ["announce_drain"]
    resize = next(d for name, d in group.calls if name == "restart")
    assert resize == {"error": None, "size": 2, "move": True}
    assert S.RESIZING in run.transitions and S.RESTARTING not in run.transitions
    assert isinstance(next(s for s in run.history if isinstance(s, Resizing)).resize, sgd.run.policies.Resize)
    assert group.started_from(-1) == {"epoch": 1}


def test_a_drain_deadline_near_without_a_checkpoint_moves_the_group_anyway(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).call(lambda g: g.drain("node-b", deadline_in_s=1.0)).idle()
    group.call(lambda g: setattr(g, "health_now", sgd.group.status.HEALTHY)).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path)
    rounds_of(run)
    assert next(d for name, d in group.calls if name == "restart")["move"] is True


def test_a_drain_with_no_room_elsewhere_waits_and_says_so_once(tmp_path, caplog):
    group = FakeGroup(2).report({"loss": 1.0}).call(lambda g: g.drain("node-b"))
    group.call(lambda g: setattr(g, "room_now", 1)).idle().save({"e": 1}).save({"e": 2}).report({"loss": 0.5}).finish()
    with caplog.at_level(logging.WARNING, logger="sgd"):
        run = fake_trainer_run(group, tmp_path)
        rounds_of(run)
    assert group.restarts == 0
    assert sum("staying on it until it goes" in r.getMessage() for r in caplog.records) == 1


def test_an_elastic_group_grows_after_a_checkpoint_when_room_appears(tmp_path, monkeypatch):
    monkeypatch.setattr(controller_module, "GROW_CHECK_INTERVAL_S", 0.0)
    group = FakeGroup(1, min_workers=1, max_workers=3)
    group.report({"loss": 1.0}).call(lambda g: setattr(g, "room_now", 3)).save({"e": 1}).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path)
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    assert next(d for name, d in group.calls if name == "restart") == {"error": None, "size": 3, "move": True}
    assert group.num_workers == 3


# --- hangs, stops, Ctrl-C, callbacks -----------------------------------------------------------


def test_a_hang_is_retried_like_a_death_and_names_the_stragglers(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).idle(since_s=11).report({"loss": 1.0}).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1, hang_timeout_s=10)
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    error = next(d for name, d in group.calls if name == "restart")["error"]
    assert isinstance(error, TrainingHangError) and "10 s" in str(error)
    assert len(error.stacks) == 2


def test_a_hang_past_the_retries_fails_the_run_with_the_hang_as_cause(tmp_path):
    group = FakeGroup(2).idle(since_s=5)
    run = fake_trainer_run(group, tmp_path, max_retries=0, hang_timeout_s=1)
    with pytest.raises(TrainingFailedError) as info:
        rounds_of(run)
    assert isinstance(info.value.__cause__, TrainingHangError)


def test_no_hang_is_declared_before_the_timeout(tmp_path):
    group = FakeGroup(2).idle(times=5, since_s=9).report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, hang_timeout_s=10)
    assert _losses(rounds_of(run)) == [1.0]


def test_stop_ends_the_run_as_stopped_and_keeps_the_group(tmp_path):
    finished = []

    class Cb(sgd.TrainingCallback):
        def finish_training(self, error=False, **info):
            finished.append(error)

    group = FakeGroup(2).report({"loss": 1.0}).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, callbacks=[Cb()])
    run.next()
    run.stop(patience_s=2.0)
    assert run.state is S.STOPPED and run.next() is None
    assert ("stop", {"patience_s": 2.0}) in group.calls and not group.needs_restart
    assert finished == [False]


def test_ctrl_c_while_polling_ends_the_run_as_interrupted_and_propagates(tmp_path):
    def interrupt(group):
        raise KeyboardInterrupt

    group = FakeGroup(2).report({"loss": 1.0}).call(interrupt)
    run = fake_trainer_run(group, tmp_path)
    run.next()
    with pytest.raises(KeyboardInterrupt):
        run.next()
    assert run.state is S.ERRORED
    assert group.calls[-1][0] == "end" and group.calls[-1][1]["ok"] is False
    from sgd.runs import STATUS_FILE

    assert json.loads((tmp_path / "run_001" / STATUS_FILE).read_text())["status"] == "INTERRUPTED"


def test_a_callback_that_raises_fails_the_run_with_its_error(tmp_path):
    class Bad(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            raise RuntimeError("callback broke")

    group = FakeGroup(2).report({"loss": 1.0}).finish()
    run = fake_trainer_run(group, tmp_path, callbacks=[Bad()])
    with pytest.raises(RuntimeError, match="callback broke"):
        run.next()
    assert run.state is S.ERRORED


def test_a_checkpoint_reported_with_its_metrics_is_kept_under_that_report(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}, checkpoint={"w": 1}).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path)
    rounds_of(run)
    assert run.checkpoint_for(1) is not None and run.checkpoint_for(2) is None
    assert run._manager.latest() == {"w": 1}  # read back from the folder the worker wrote


def test_the_fake_group_says_when_its_script_ran_out(tmp_path):
    run = fake_trainer_run(FakeGroup(1).report({"loss": 1.0}), tmp_path)
    run.next()
    with pytest.raises(AssertionError, match="script ran out"):
        run.next()


def test_the_fake_group_says_when_a_checkpoint_has_no_folder_to_go_to():
    """Stepped by hand rather than by the run controller: no request gave the run a checkpoint
    folder, so a scripted checkpoint is a mistake in the test, named as such."""
    from sgd.group.protocol import RunRequest

    group = FakeGroup(1).save({"w": 1})
    assert group.start() is None and group.worker_group is group
    assert group.begin(RunRequest(train_func=lambda: None)) is None
    with pytest.raises(AssertionError, match="the fake group's run has no checkpoint folder .* checkpoint_target"):
        group.poll(1.0)
    assert group.grow(2) is None
    group.shutdown()
    assert group.worker_group is None
    assert [name for name, _ in group.calls] == ["start", "begin", "poll", "grow", "shutdown"]
