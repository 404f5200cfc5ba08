"""Ray 2.60's ``python/ray/train/v2/tests/test_data_parallel_trainer.py``, ``test_collective.py`` and
``test_local_mode.py``'s ``test_data_parallel_trainer_local_mode`` on sgd (issue 53).

Ray's wheel does not ship its v2 tests, and Ray's repository text stays out of this one: each test
below is written anew from the Ray test of the same name — the same scenario, the same public calls
and the same assertions — with the modules renamed by issue 53's map (``ray.train`` → ``sgd``,
``ray.train.collective`` → ``sgd.collective``). Where the test differs from Ray's beyond that, a
``# sgd:`` comment says why. Left out (Ray internals): ``test_setup_working_directory`` (reads the
private ``RAY_CHDIR_TO_TRIAL_DIR`` / ``_get_ray_train_session_dir``), ``test_sigint_abort`` (patches
``TrainController.abort``). Status of each: docs "Ported test status", /work/notes/H.md.
"""

import contextlib
import json
import tempfile
from pathlib import Path

import pytest
import ray

import sgd
import sgd.collective  # sgd: was ray.train.collective
from sgd import (
    BackendConfig,
    Checkpoint,
    DataParallelTrainer,  # sgd: was ray.train.v2.api.data_parallel_trainer (Ray's private path)
    RunConfig,
    ScalingConfig,
)
from sgd.backend import Backend  # sgd: was ray.train.backend


@pytest.fixture(autouse=True)
def ray_start_4_cpus(ray_cluster):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown() per module;
    # runs written under the per-test SGD_RESULTS_DIR (sgd_testing's results_dir)
    yield ray_cluster


@contextlib.contextmanager
def create_dict_checkpoint(data):  # sgd: was ray.train.tests.util (not public); written anew
    with tempfile.TemporaryDirectory() as path:
        Path(path, "data.json").write_text(json.dumps(data))
        yield Checkpoint.from_directory(path)


def test_backend_setup(tmp_path):
    class ValidationBackend(Backend):
        def on_start(self, worker_group, backend_config):
            tmp_path.joinpath("on_start").touch()

        def on_training_start(self, worker_group, backend_config):
            tmp_path.joinpath("on_training_start").touch()

        def on_shutdown(self, worker_group, backend_config):
            tmp_path.joinpath("on_shutdown").touch()

    class ValidationBackendConfig(BackendConfig):
        @property
        def backend_cls(self):
            return ValidationBackend

    trainer = DataParallelTrainer(
        lambda: None, backend_config=ValidationBackendConfig(), scaling_config=ScalingConfig(num_workers=2)
    )
    trainer.fit()
    for hook in ("on_start", "on_training_start", "on_shutdown"):
        assert tmp_path.joinpath(hook).exists(), hook


def test_result_output(tmp_path):
    import pyarrow.fs

    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="test", storage_path=str(tmp_path)),
    )
    result = trainer.fit()
    assert isinstance(result, sgd.Result)
    assert result.path == str(tmp_path / "test")
    assert isinstance(result.filesystem, pyarrow.fs.FileSystem)


def test_no_optional_arguments():
    DataParallelTrainer(lambda: "not used").fit()


def test_train_loop_config():
    def train_fn(config):
        with create_dict_checkpoint({}) as checkpoint:
            sgd.report(metrics=config, checkpoint=checkpoint)

    config = {"x": 1}
    trainer = DataParallelTrainer(train_fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2))
    assert trainer.fit().metrics == config


def test_report_checkpoint_rank0(tmp_path):
    def train_fn():
        rank = sgd.get_context().get_world_rank()
        if rank == 0:
            with create_dict_checkpoint({}) as checkpoint:
                sgd.report(metrics={"rank": rank}, checkpoint=checkpoint)
        else:
            sgd.report(metrics={"rank": rank}, checkpoint=None)

    trainer = DataParallelTrainer(
        train_fn, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=str(tmp_path))
    )
    result = trainer.fit()
    assert result.metrics == {"rank": 0}
    assert result.checkpoint


def test_report_checkpoint_multirank(tmp_path):
    ranks_to_report = [1, 2]  # sgd: 3 workers, ranks 1 and 2 (Ray: 4 workers, ranks 1 and 3): a shorter suite

    def train_fn():
        rank = sgd.get_context().get_world_rank()
        if rank in ranks_to_report:
            with tempfile.TemporaryDirectory() as path:
                Path(path, str(rank)).touch()
                sgd.report(metrics={"rank": rank}, checkpoint=Checkpoint.from_directory(path))
        else:
            sgd.report(metrics={"rank": rank}, checkpoint=None)

    trainer = DataParallelTrainer(
        train_fn, scaling_config=ScalingConfig(num_workers=3), run_config=RunConfig(storage_path=str(tmp_path))
    )
    result = trainer.fit()
    assert result.checkpoint
    result.checkpoint.to_directory(tmp_path / "validate")
    for rank in ranks_to_report:
        assert tmp_path.joinpath("validate", str(rank)).exists()


def test_report_get_all_reported_checkpoints():
    def train_fn():
        if sgd.get_context().get_world_rank() == 0:
            sgd.report(metrics={}, checkpoint=None)
            with create_dict_checkpoint({}) as checkpoint:
                sgd.report(metrics={}, checkpoint=checkpoint)
            assert len(sgd.get_all_reported_checkpoints()) == 1
            with create_dict_checkpoint({}) as checkpoint:
                sgd.report(metrics={}, checkpoint=checkpoint)
        else:
            for _ in range(3):
                sgd.report(metrics={}, checkpoint=None)
            assert len(sgd.get_all_reported_checkpoints()) == 2

    DataParallelTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2)).fit()


def test_error(tmp_path):
    def _error_func_rank_0():
        if sgd.get_context().get_world_rank() == 0:
            raise ValueError("error")

    trainer = DataParallelTrainer(
        _error_func_rank_0,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="test", storage_path=str(tmp_path)),
    )
    with pytest.raises(sgd.TrainingFailedError) as exc_info:
        trainer.fit()
    # sgd: Ray's test asserts these inside the `with` block, after fit() (never reached); here they run
    assert isinstance(exc_info.value, sgd.WorkerGroupError)
    assert isinstance(exc_info.value.worker_failures[0], ValueError)


def test_user_callback(tmp_path):
    num_workers = 2
    seen = {}  # sgd: records the hooks' calls; Ray's callback asserted inside them and only checked the error type

    class MyUserCallback(sgd.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            assert len(metrics) == num_workers
            assert not checkpoint
            seen["after_report"] = metrics

        def after_exception(self, run_context, worker_exceptions):
            assert len(worker_exceptions) == 1
            assert worker_exceptions.get(0) is not None
            seen["after_exception"] = worker_exceptions

    def _train_fn(config):
        sgd.report(metrics={"rank": sgd.get_context().get_world_rank()})
        if sgd.get_context().get_world_rank() == 0:
            raise ValueError("error")

    trainer = DataParallelTrainer(
        _train_fn,
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(storage_path=str(tmp_path), callbacks=[MyUserCallback()]),
    )
    # The error should NOT be an assertion error from the user callback.
    with pytest.raises(sgd.WorkerGroupError):
        trainer.fit()
    assert [m["rank"] for m in seen["after_report"]] == [0, 1]
    assert isinstance(seen["after_exception"][0], ValueError)


def test_data_parallel_trainer_local_mode():  # test_local_mode.py's
    def train_fn():
        with create_dict_checkpoint({}) as checkpoint:
            sgd.report(metrics={"test": 1}, checkpoint=checkpoint)

    result = DataParallelTrainer(train_fn, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert result.metrics == {"test": 1}
    assert result.checkpoint


# --- test_collective.py ---------------------------------------------------------------------------


def test_barrier():
    @ray.remote
    class Counter:
        def __init__(self):
            self.num_reached_barrier = 0

        def increment(self):
            self.num_reached_barrier += 1

        def get_num_reached_barrier(self):
            return self.num_reached_barrier

    counter = Counter.remote()

    def train_fn():
        ray.get(counter.increment.remote())  # sgd: waits for the increment (Ray's test did not: a race)
        sgd.collective.barrier()
        assert ray.get(counter.get_num_reached_barrier.remote()) == 2

    DataParallelTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2)).fit()


def test_broadcast_from_rank_zero():
    def train_fn():
        rank = sgd.get_context().get_world_rank()
        assert sgd.collective.broadcast_from_rank_zero({"key": rank}) == {"key": 0}

    DataParallelTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2)).fit()


@pytest.mark.skip(reason="patches Ray's private collectives._MAX_BROADCAST_SIZE_BYTES; sgd's broadcast has no "
                         "small size limit by design (issue 53), so there is no limit to lower")
def test_broadcast_from_rank_zero_data_too_big():
    pass

