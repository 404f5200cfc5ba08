"""sgd.keep_workers: a trainer's clean shutdown parks its worker processes for the next trainer of
the same backend; a failed one does not; a parked process holds no resources, forgets its run,
and is replaced if it died while parked."""

import logging
import os

import pytest
import ray

import sgd
from sgd.backend import on_worker_run
from sgd.worker_group.keep import KEPT, end_kept_workers
from sgd_testing import wait_for


@pytest.fixture
def keeping(ray_cluster):
    before = KEPT.max_idle()
    end_kept_workers()
    sgd.keep_workers(4)
    yield ray_cluster
    end_kept_workers()
    KEPT.limit = before


def _pids(backend="base", num_workers=2, fn=None):
    trainer = sgd.Trainer(backend=backend, num_workers=num_workers)
    trainer.start()
    try:
        return trainer.run(fn or os.getpid)
    finally:
        trainer.shutdown()


def test_the_next_trainer_runs_in_the_processes_the_last_one_left(keeping):
    wait_for(lambda: ray.available_resources().get("CPU", 0) == keeping["CPU"], timeout=20)
    first = _pids()
    assert sgd.kept_workers() == 2
    # Parked processes reserve nothing, and shutdown returns once the cluster's view shows its
    # reservation free (a next elastic start counts free CPUs): no waiting here.
    assert ray.available_resources().get("CPU", 0) == keeping["CPU"]
    assert sorted(_pids()) == sorted(first)
    assert sgd.kept_workers() == 2


def test_a_run_that_failed_leaves_no_process_behind(keeping):
    def fails():
        raise ValueError("boom")

    trainer = sgd.Trainer(backend="base", num_workers=2)
    trainer.start()
    with pytest.raises(ValueError, match="boom"):
        trainer.run(fails)
    trainer.shutdown()
    assert sgd.kept_workers() == 0


def _fails_on_rank_0():
    if sgd.world_rank() == 0:
        raise ValueError("boom")
    return os.getpid()


def _rank_0_fails_rank_1_waits_forever():
    """Rank 0 raises; rank 1 never reaches a report, so it cannot be asked to stop."""
    import threading

    if sgd.world_rank() == 0:
        raise ValueError("boom")
    threading.Event().wait()


def _pids_around_a_failed_run(failing):
    """One trainer: the pids of a run, a run of ``failing`` (raises ValueError: boom), the pids of
    a run again."""
    trainer = sgd.Trainer(backend="base", num_workers=2)
    trainer.start()
    try:
        before = trainer.run(os.getpid)
        with pytest.raises(ValueError, match="boom"):
            trainer.run(failing)
        return before, trainer.run(os.getpid)
    finally:
        trainer.shutdown()


def test_workers_whose_runs_ended_after_a_failed_run_serve_the_next_run(keeping, monkeypatch, caplog):
    """An error in one rank stops the others at their next report: no process is ended, and the
    next run sets the backend up again in the same processes (without asking them again)."""
    from sgd.group import actors

    monkeypatch.setattr(actors, "FAILED_RUN_PATIENCE_S", 60.0)  # what happens, not how fast
    caplog.set_level(logging.DEBUG, logger="sgd")  # sgd's modules log to the "sgd" logger
    before, after = _pids_around_a_failed_run(_fails_on_rank_0)
    assert after == before, caplog.messages
    assert "restart: every run ended after the failure; keeping all 2 workers" in caplog.messages
    assert sgd.kept_workers() == 2


def test_a_group_started_anew_after_a_failed_run_is_kept_at_its_end(keeping):
    """A worker that does not end its run in time is killed with the whole group; the next run
    starts every worker anew, so that group is as clean as a first one and is kept."""
    failed, again = _pids_around_a_failed_run(_rank_0_fails_rank_1_waits_forever)
    assert not set(again) & set(failed)  # the failed group's processes ended with it
    assert sgd.kept_workers() == 2
    assert sorted(_pids()) == sorted(again)  # the next trainer runs in them


def test_a_process_that_died_while_parked_is_replaced(keeping):
    first = _pids()
    actor = KEPT._parked[next(iter(KEPT._parked))][0].actor
    ray.kill(actor, no_restart=True)
    second = _pids()
    assert len(set(second)) == 2
    assert len(set(first) & set(second)) == 1


def _killed_once_at_epoch_1(config):
    """Rank 1 of the first attempt waits at epoch 1 until it is killed; the restart goes through."""
    import threading
    from pathlib import Path

    mark = Path(config["dir"], "waited")
    for epoch in range(3):
        sgd.report(epoch=epoch, pid=os.getpid())
        if epoch == 1 and sgd.world_rank() == 1 and not mark.exists():
            mark.touch()
            threading.Event().wait()  # until KillWorker SIGKILLs this process (the round of epoch 1 arrived)
    return os.getpid()


def test_a_worker_replaced_after_a_death_is_a_kept_process_and_the_group_is_kept(keeping, tmp_path):
    """A restart after a worker death takes a kept process for the dead worker (no process start,
    no framework import); the group, survivor included, is kept at its end."""
    from sgd_testing import KillWorker

    parked = set(_pids(num_workers=4))
    assert sgd.kept_workers() == 4
    kill = KillWorker(at=1, rank=1)
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=1)
    trainer.start()
    try:
        after = trainer.run(_killed_once_at_epoch_1, config={"dir": str(tmp_path)}, callbacks=[kill])
    finally:
        trainer.shutdown()
    assert len(kill.killed) == 1 and kill.killed[0] not in after
    assert set(after) <= parked, (after, parked)  # the replacement too: a process a trainer left
    # Two taken at the start and one at the restart: one left, and the group's two parked again.
    assert sgd.kept_workers() == 3
    assert set(_pids()) <= set(after) | parked


def test_keep_workers_zero_ends_the_kept_processes(keeping):
    first = _pids()
    sgd.keep_workers(0)
    assert sgd.kept_workers() == 0
    sgd.keep_workers(4)
    assert not set(_pids()) & set(first)


def _slow_exit_handler(config):
    """An exit handler that takes a second and then leaves a file (as coverage.py writes its data
    at exit): its process's pid."""
    import atexit
    import time
    from pathlib import Path

    def leave_a_mark():
        time.sleep(1.0)
        Path(config["dir"], f"exited_{os.getpid()}").touch()

    atexit.register(leave_a_mark)
    return os.getpid()


def test_ending_the_kept_processes_waits_for_their_exit_handlers(keeping, tmp_path):
    # Ray answers the exit call at once, before the process ran its atexit handlers; a
    # ray.shutdown() right after would kill them halfway (a coverage data file corrupt or lost).
    pids = _pids(fn=lambda: _slow_exit_handler({"dir": str(tmp_path)}))
    assert sgd.kept_workers() == 2
    end_kept_workers(patience_s=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"exited_{pid}" for pid in pids)


class _Counted(sgd.Backend):
    """Registers a run context on each worker at start: a reused process must not run the
    previous group's as well."""

    def on_start(self, worker_group, backend_config):
        worker_group.execute(_register_counter)

    def reuses_processes(self, backend_config):
        return True


class _CountedConfig(sgd.BackendConfig):
    @property
    def backend_cls(self):
        return _Counted


# Counted in the process's environment: this module's globals are pickled by value with each
# function, so a list here would be a new one in every call.
_ENTERED = "SGD_TEST_RUN_CONTEXTS_ENTERED"


def _register_counter():
    import contextlib

    @contextlib.contextmanager
    def counter():
        os.environ[_ENTERED] = str(int(os.environ.get(_ENTERED, "0")) + 1)
        yield

    on_worker_run(counter)


def _entered_and_pid():
    return int(os.environ.get(_ENTERED, "0")), os.getpid()


def test_a_parked_process_forgets_the_hooks_its_backend_set(keeping):
    first = _pids(_CountedConfig(), fn=_entered_and_pid)
    second = _pids(_CountedConfig(), fn=_entered_and_pid)
    assert {pid for _, pid in second} == {pid for _, pid in first}
    assert [n for n, _ in first] == [1, 1]
    assert [n for n, _ in second] == [2, 2]  # one more context entered, not two


class _NotReusable(sgd.Backend):
    pass


class _NotReusableConfig(sgd.BackendConfig):
    @property
    def backend_cls(self):
        return _NotReusable


def test_a_backend_that_does_not_say_so_is_never_kept(keeping):
    first = _pids(_NotReusableConfig())
    assert sgd.kept_workers() == 0
    assert not set(_pids(_NotReusableConfig())) & set(first)


@pytest.mark.fresh_workers
def test_a_test_marked_fresh_workers_gets_new_processes(ray_cluster):
    first = _pids()
    assert sgd.kept_workers() == 0
    assert not set(_pids()) & set(first)


def test_a_group_that_replaced_a_worker_is_kept(keeping, tmp_path):
    marker = str(tmp_path / "died")

    def dies_once():
        if sgd.world_rank() == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return os.getpid()

    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=2)
    trainer.start()
    try:
        pids = trainer.run(dies_once)
    finally:
        trainer.shutdown()
    assert os.path.exists(marker) and len(set(pids)) == 2
    # The survivor and the dead worker's replacement forgot their run: both are kept.
    assert sgd.kept_workers() == 2
    assert sorted(_pids()) == sorted(pids)


_KILLED_AFTER_PARKING = r'''
import os, sys
import coverage

measurement = coverage.Coverage(data_file=sys.argv[1], config_file=False)
measurement.start()


def measured():  # lines a group's run executed in this process
    return sum(range(10))


measured()
from sgd._worker.actor import _save_measurement

_save_measurement()  # what parking a kept process does
os._exit(0)  # then killed (a later group failed): no atexit, nothing else saved
'''


def test_a_kept_process_saves_its_coverage_measurement_when_parked(tmp_path):
    """A kept process measures every group it served; a kill after it was parked (a later group
    failed) must not lose what it measured before (sgd-xgboost's coverage fell 5 points)."""
    import subprocess
    import sys

    import coverage

    data_file = tmp_path / "measured.coverage"
    script = tmp_path / "killed_after_parking.py"
    script.write_text(_KILLED_AFTER_PARKING)
    proc = subprocess.run([sys.executable, str(script), str(data_file)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    lines = data.lines(str(script))
    assert lines and 10 in lines  # measured()'s body: saved before the kill
