"""Ray 2.3's ``python/ray/train/tests/test_data_parallel_trainer.py``, ported (issue 37).

As Ray's Train 1.12 and Horovod's tests were: the imports renamed to sgd's, nothing else changed
except where a ``# sgd:`` comment says so. Tests that patch Ray's internals (its
``BackendExecutor``, ``WorkerGroup``, ``DataParallelTrainer._report``) are skipped with that
reason; tests that show a deliberate difference are strict ``xfail``s, each listed in
docs/migration-ray-train.md ("Ported test status").
"""

import pytest
import ray
from ray import tune
from ray.data.preprocessor import Preprocessor
from ray.tune.tune_config import TuneConfig
from ray.tune.tuner import Tuner

import sgd.session as session  # sgd: was ``from ray.air import session``
from sgd import (  # sgd: was ray.air.config
    Checkpoint,  # sgd: was ray.air.checkpoint
    CheckpointConfig,
    DataParallelTrainer,  # sgd: was ray.train.data_parallel_trainer
    DatasetConfig,  # sgd: was ray.air.config (for the one-line change of test_datasets)
    RunConfig,
    ScalingConfig,
)
from sgd.checkpoint.preprocessor import PREPROCESSOR_KEY  # sgd: was ray.train.constants

INTERNALS = "patches Ray Train's internals (BackendExecutor / WorkerGroup / DataParallelTrainer._report)"


@pytest.fixture
def ray_start_4_cpus(ray_cluster, results_dir):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown() per test;
    # runs written under a temporary SGD_RESULTS_DIR
    yield ray_cluster


scale_config = ScalingConfig(num_workers=2)


def test_fit_train(ray_start_4_cpus):
    def train_func():
        session.report({"loss": 1})

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func, scaling_config=scale_config
    )
    assert trainer.fit().metrics["loss"] == 1


RESERVED = ("sgd reserves no CPU for the trainer: the driver is the calling process "
            "(ScalingConfig.trainer_resources is accepted, unused)")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=RESERVED)
def test_scaling_config(ray_start_4_cpus):
    def train_func():
        assert ray.available_resources()["CPU"] == 1
        session.report({"loss": 1})

    assert ray.available_resources()["CPU"] == 4
    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func, scaling_config=ScalingConfig(num_workers=2)
    )
    trainer.fit()


def test_fit_train_config(ray_start_4_cpus):
    def train_func(config):
        session.report({"loss": config["x"]})

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scale_config,
        train_loop_config={"x": 100},
    )
    assert trainer.fit().metrics["loss"] == 100


def test_datasets(ray_start_4_cpus):
    num_train_data = 10
    num_val_data = 6

    train_dataset = ray.data.range(num_train_data)
    val_dataset = ray.data.range(num_val_data)

    def get_dataset():
        # Train dataset should be sharded.
        train_dataset = session.get_dataset_shard("train")
        assert train_dataset.count() == num_train_data / scale_config.num_workers
        # All other datasets should not be sharded.
        val_dataset = session.get_dataset_shard("val")
        assert val_dataset.count() == num_val_data

    trainer = DataParallelTrainer(
        train_loop_per_worker=get_dataset,
        scaling_config=scale_config,
        datasets={"train": train_dataset, "val": val_dataset},
        # sgd: Ray 2.60 (and sgd) split every dataset by default; AIR's rule needs an AIR dataset_config
        dataset_config={"train": DatasetConfig()},
    )
    trainer.fit()


def test_checkpoint(ray_start_4_cpus):
    def train_func():
        for i in range(3):
            session.report({"epoch": i}, checkpoint=Checkpoint.from_dict({"model": i}))

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func, scaling_config=scale_config
    )
    result = trainer.fit()
    assert result.checkpoint.to_dict()["model"] == 2


def test_preprocessor_in_checkpoint(ray_start_4_cpus):
    class DummyPreprocessor(Preprocessor):
        def __init__(self):
            super().__init__()
            self.is_same = True

    def train_func():
        for i in range(3):
            session.report({"epoch": i}, checkpoint=Checkpoint.from_dict({"model": i}))

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scale_config,
        preprocessor=DummyPreprocessor(),
    )
    result = trainer.fit()
    assert result.checkpoint.to_dict()["model"] == 2
    # sgd: the preprocessor is a file of the checkpoint, not a key of to_dict(); one of the test's
    # own class is pickled, so it loads with trusted=True (was: to_dict()[PREPROCESSOR_KEY].is_same)
    assert PREPROCESSOR_KEY in result.checkpoint.to_dict()
    assert result.checkpoint.get_preprocessor(trusted=True).is_same


def test_resume_from_checkpoint(ray_start_4_cpus, tmpdir):
    def train_func():
        checkpoint = session.get_checkpoint()
        if checkpoint:
            epoch = checkpoint.to_dict()["epoch"]
        else:
            epoch = 0
        for i in range(epoch, epoch + 2):
            session.report({"epoch": i}, checkpoint=Checkpoint.from_dict({"epoch": i}))

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func, scaling_config=scale_config
    )
    result = trainer.fit()
    assert result.checkpoint.to_dict()["epoch"] == 1

    # Move checkpoint to a different directory.
    checkpoint_dict = result.checkpoint.to_dict()
    checkpoint = Checkpoint.from_dict(checkpoint_dict)
    checkpoint_path = checkpoint.to_directory(tmpdir)
    resume_from = Checkpoint.from_directory(checkpoint_path)

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scale_config,
        resume_from_checkpoint=resume_from,
    )
    result = trainer.fit()
    assert result.checkpoint.to_dict()["epoch"] == 2


def test_invalid_train_loop(ray_start_4_cpus):
    def train_loop(config, extra_arg):
        pass

    with pytest.raises(ValueError):
        DataParallelTrainer(train_loop_per_worker=train_loop)


def test_bad_return_in_train_loop(ray_start_4_cpus):
    """Test to check if returns from train loop are discarded."""

    # Simulates what happens with eg. torch models
    class FailOnUnpickle:
        def __reduce__(self):
            raise RuntimeError("Failing")

    def train_loop(config):
        session.report({"loss": 1})
        return FailOnUnpickle()

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_loop, scaling_config=scale_config
    )

    # No exception should happen here
    trainer.fit()


def test_tune(ray_start_4_cpus, tmp_path):  # sgd: tmp_path for Tune's storage
    def train_func(config):
        session.report({"loss": config["x"]})

    trainer = DataParallelTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={"x": 100},
        scaling_config=scale_config,
    )

    tuner = Tuner(
        trainer,
        param_space={"train_loop_config": {"x": tune.choice([200, 300])}},
        tune_config=TuneConfig(num_samples=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path)),  # sgd: not ~/ray_results
    )
    result_grid = tuner.fit()
    assert result_grid[0].metrics["loss"] in [200, 300]

    # Make sure original Trainer is not affected.
    assert trainer._train_loop_config["x"] == 100


@pytest.mark.skip(reason=INTERNALS)
def test_fast_slow(ray_start_4_cpus):
    pass  # sgd: patches BackendExecutor.start_training and WorkerGroup.execute_single_async


@pytest.mark.skip(reason=INTERNALS)
def test_mismatch_report(ray_start_4_cpus):
    pass  # sgd: patches BackendExecutor; sgd's own test_training.py checks mismatched report counts


def test_checkpoint_config(ray_start_4_cpus):
    def train_func():
        session.report(
            dict(loss=float("nan")), checkpoint=Checkpoint.from_dict({"idx": 0})
        )  # nan, deleted
        session.report(
            dict(loss=3), checkpoint=Checkpoint.from_dict({"idx": 1})
        )  # best
        session.report(
            dict(loss=7), checkpoint=Checkpoint.from_dict({"idx": 2})
        )  # worst, deleted
        session.report(dict(loss=5), checkpoint=Checkpoint.from_dict({"idx": 3}))

    checkpoint_config = CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
    )

    trainer = DataParallelTrainer(
        train_func,
        scaling_config=scale_config,
        run_config=RunConfig(checkpoint_config=checkpoint_config),
    )
    results = trainer.fit()
    assert results.checkpoint.to_dict()["idx"] == 3
    assert len(results.best_checkpoints) == 2
    assert results.best_checkpoints[0][0].to_dict()["idx"] == 3
    assert results.best_checkpoints[1][0].to_dict()["idx"] == 1
    assert results.best_checkpoints[0][1]["loss"] == 5
    assert results.best_checkpoints[1][1]["loss"] == 3


@pytest.mark.skip(reason=INTERNALS)
def test_world_rank(ray_start_4_cpus):
    pass  # sgd: overrides DataParallelTrainer._report with tune.report(results=...)


@pytest.mark.skip(reason=INTERNALS + "; it also names TestBackend / TestConfig, which this version of "
                                    "Ray's file does not define")
def test_gpu_requests():
    pass
