"""An AIR/v2 trainer's failed ``fit()`` (issue 53), on real Ray: ``FailureConfig(max_failures)``
retries a training function's exception from the latest checkpoint, as Ray 2.x does; past it
``fit()`` raises ``WorkerGroupError`` (``worker_failures`` by rank) or ``ControllerError``, each
carrying the run's ``Result`` as ``.result`` and pickling with it (also through Ray);
``Result.return_value`` is rank 0's return value."""

import json
import os
import pickle
import threading
from pathlib import Path

import pytest
import ray

import sgd
from sgd import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig


class FlakyRead(OSError):
    """A transient error a training function may raise (a flaky read, a timeout)."""


def fails_once_after_a_checkpoint(config):
    """Reports and checkpoints two epochs, then raises on rank 1 on its first attempt only
    (a marker file remembers it); resumes from the latest checkpoint."""
    checkpoint = sgd.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["epoch"] + 1
    for epoch in range(start, 4):
        if epoch == 2 and sgd.world_rank() == 1 and not Path(config["marker"]).exists():
            Path(config["marker"]).write_text("failed once")
            raise FlakyRead(f"flaky read of shard {epoch}")
        ckpt_dir = Path(config["scratch"]) / f"rank{sgd.world_rank()}_epoch{epoch}"
        ckpt_dir.mkdir(parents=True)
        (ckpt_dir / "state.json").write_text(json.dumps({"epoch": epoch}))
        sgd.report({"epoch": epoch, "start": start},
                   checkpoint=sgd.Checkpoint.from_directory(str(ckpt_dir)) if sgd.world_rank() == 0 else None)
    return {"started_at": start}


def _trainer(tmp_path, max_failures, name):
    config = {"marker": str(tmp_path / f"{name}.marker"), "scratch": str(tmp_path / f"{name}_scratch")}
    return DataParallelTrainer(
        fails_once_after_a_checkpoint, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"),
                             failure_config=FailureConfig(max_failures=max_failures)))


def test_max_failures_retries_an_exception_and_resumes_from_the_checkpoint(ray_cluster, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="sgd"):
        result = _trainer(tmp_path, 1, "retried").fit()
    assert (tmp_path / "retried.marker").exists()  # it did fail once
    assert result.error is None
    assert result.metrics["epoch"] == 3 and result.metrics["start"] == 2  # resumed after epoch 1's checkpoint
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]
    assert result.return_value == {"started_at": 2}
    retries = [r.getMessage() for r in caplog.records if "restarting the workers" in r.getMessage()]
    assert len(retries) == 1, retries
    assert retries[0].startswith(f"worker rank 1 raised {__name__}.FlakyRead: flaky read of shard 2")
    assert retries[0].endswith("(failure 1 of 1)")


def test_without_retries_fit_raises_a_worker_group_error_carrying_the_result(ray_cluster, tmp_path):
    with pytest.raises(sgd.WorkerGroupError) as info:
        _trainer(tmp_path, 0, "failed").fit()
    error = info.value
    assert isinstance(error, sgd.TrainingFailedError) and isinstance(error, RuntimeError)
    # As Ray AIR 2.x's error was, it is also one of the worker's exception's class (and OSError).
    assert isinstance(error, FlakyRead) and isinstance(error, OSError)
    assert str(error).startswith("Training failed due to worker errors:\nworker rank 1 raised")
    assert list(error.worker_failures) == [1]
    failure = error.worker_failures[1]
    assert type(failure) is FlakyRead and str(failure) == "flaky read of shard 2"
    assert isinstance(failure.__cause__, sgd.WorkerError) and "Remote traceback" in str(failure.__cause__)
    assert error.__cause__ is failure
    result = error.result
    assert isinstance(result, sgd.Result) and result.error is error and result.return_value is None
    assert result.metrics["epoch"] == 1 and list(result.metrics_dataframe["epoch"]) == [0, 1]
    with result.checkpoint.as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text()) == {"epoch": 1}
    assert json.loads(Path(result.path, "status.json").read_text())["status"] == "ERRORED"

    again = pickle.loads(pickle.dumps(error))
    assert type(again).__name__ == "WorkerGroupError(FlakyRead)" and isinstance(again, sgd.WorkerGroupError)
    assert str(again) == str(error)
    assert isinstance(again.worker_failures[1], FlakyRead)
    assert isinstance(again.worker_failures[1].__cause__, sgd.WorkerError)
    assert again.result.path == result.path and again.result.error is again
    assert again.result.metrics["epoch"] == 1

    @ray.remote(num_cpus=0)
    def passes_through(exc):
        return type(exc).__name__, list(exc.worker_failures), exc.result.path, exc.result.metrics["epoch"], exc

    name, ranks, path, epoch, back = ray.get(passes_through.remote(error))
    assert (name, ranks, path, epoch) == ("WorkerGroupError(FlakyRead)", [1], result.path, 1)
    assert isinstance(back, sgd.WorkerGroupError) and back.result.error is back


def test_a_death_past_max_failures_is_a_worker_group_error(ray_cluster, tmp_path):
    from sgd_testing import KillWorker

    def loop():
        for epoch in range(3):
            sgd.report({"epoch": epoch, "pid": os.getpid()})
            if epoch == 1 and sgd.world_rank() == 1:
                threading.Event().wait()  # until KillWorker, at epoch 1's round, kills this process

    with pytest.raises(sgd.WorkerGroupError) as info:
        DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(storage_path=str(tmp_path), callbacks=[KillWorker(at=1)])).fit()
    (rank, death), = info.value.worker_failures.items()
    assert isinstance(death, sgd.WorkerDiedError) and rank == death.world_rank == 1
    assert "max_retries=0" in str(info.value) and isinstance(info.value.__cause__, sgd.TrainingFailedError)
    assert info.value.result.metrics["epoch"] == 1


def test_a_callback_error_is_a_controller_error_never_retried(ray_cluster, tmp_path):
    class Broken(sgd.TrainingCallback):
        calls = 0

        def handle_result(self, results, **info):
            Broken.calls += 1
            raise KeyError("bug")

    def loop():
        for i in range(3):
            sgd.report({"i": i})

    with pytest.raises(sgd.ControllerError) as info:
        DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=1),
                            run_config=RunConfig(storage_path=str(tmp_path), callbacks=[Broken()],
                                                 failure_config=FailureConfig(max_failures=3))).fit()
    error = info.value
    assert Broken.calls == 1
    assert isinstance(error, KeyError) and isinstance(error, sgd.TrainingFailedError)
    assert type(error.controller_failure) is KeyError and error.__cause__ is error.controller_failure
    assert str(error) == "Training failed due to controller error:\n'bug'"
    assert error.result.path is not None and pickle.loads(pickle.dumps(error)).result.path == error.result.path


def test_return_value_is_rank_zeros_and_a_value_that_does_not_pickle_is_dropped(ray_cluster, tmp_path):
    def returns_rank():
        sgd.report({"x": 1})
        return {"rank": sgd.world_rank(), "size": sgd.world_size()}

    result = DataParallelTrainer(returns_rank, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.return_value == {"rank": 0, "size": 2}

    def returns_a_lock():
        sgd.report({"x": 1})
        return threading.Lock()

    result = DataParallelTrainer(returns_a_lock, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None and result.return_value is None and result.metrics["x"] == 1


def test_trainer_run_keeps_raising_the_workers_own_exception_and_never_retries_it(ray_cluster, tmp_path):
    """Ray Train 1.x's contract stays: sgd.Trainer(max_retries=) retries deaths only."""
    def loop(config):
        Path(config["marker"]).open("a").write("x")
        raise FlakyRead("flaky")

    marker = tmp_path / "attempts"
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1, max_retries=3, logdir=tmp_path / "t")
    trainer.start()
    try:
        with pytest.raises(FlakyRead, match="flaky") as info:
            trainer.run(loop, config={"marker": str(marker)})
    finally:
        trainer.shutdown()
    assert type(info.value) is FlakyRead and isinstance(info.value.__cause__, sgd.WorkerError)
    assert marker.read_text() == "x"  # one attempt
