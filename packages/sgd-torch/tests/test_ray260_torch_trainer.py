"""Ray 2.60's ``python/ray/train/v2/tests/test_torch_trainer.py``, ``test_result.py`` and the torch
parts of ``test_local_mode.py`` on sgd (issue 53).

Ray's wheel does not ship its v2 tests, and Ray's repository text stays out of this one: each test
is written anew from Ray's test of the same name (the same scenario, public calls and assertions),
with the modules renamed by issue 53's map (``ray.train`` → ``sgd``, ``ray.train.torch`` →
``sgd_torch``); a ``# sgd:`` comment marks every other difference. Ray's tests import ``train_func``
from the example Ray ships (``ray/train/examples/pytorch/torch_linear_example.py``); so do these,
through :mod:`sgd_testing.ray_examples` (the installed example, its imports renamed).

Left out: ``test_result.py``'s ``remote`` storage cases (a mock S3 server) and its
``pass_storage_filesystem`` case (Ray's private ``StorageContext``); ``test_local_mode.py``'s JAX
(``JaxTrainer`` is not in issue 53), Hugging Face (downloads a model; ``datasets`` is not installed)
and TensorFlow / XGBoost / LightGBM cases (in those packages' ``test_ray260_*`` files).
"""

import contextlib
import json
import tempfile
from pathlib import Path

import pytest

import sgd
from sgd import Checkpoint, CheckpointConfig, Result, RunConfig, ScalingConfig
from sgd_testing import ray_examples
from sgd_torch import TorchTrainer

# sgd: was `from ray.train.examples.pytorch.torch_linear_example import train_func`: the same
# installed example, its imports renamed
linear_train_func = ray_examples.load("pytorch/torch_linear_example.py").train_func


@pytest.fixture
def ray_start_4_cpus(ray_cluster):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown(); runs written
    # under the per-test SGD_RESULTS_DIR. (Ray's autouse HEALTH_CHECK_INTERVAL_S_ENV_VAR fixture sets
    # a private knob of Ray's controller: dropped.)
    yield ray_cluster


ray_start_6_cpus = ray_start_4_cpus  # sgd: the session's cluster has 4 CPUs; these tests use at most 2


@contextlib.contextmanager
def create_dict_checkpoint(data):  # sgd: was ray.train.tests.util (not public); written anew
    with tempfile.TemporaryDirectory() as path:
        Path(path, "data.json").write_text(json.dumps(data))
        yield Checkpoint.from_directory(path)


def load_dict_checkpoint(checkpoint):  # sgd: was ray.train.tests.util (not public); written anew
    with checkpoint.as_directory() as path:
        return json.loads(Path(path, "data.json").read_text())


# --- test_torch_trainer.py -------------------------------------------------------------------------


def test_minimal(ray_start_4_cpus):
    def train_func():
        pass

    TorchTrainer(train_func).fit()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_torch_linear(ray_start_4_cpus, num_workers):
    epochs = 3

    def train_func(config):
        result = linear_train_func(config)
        assert len(result) == epochs
        assert result[-1]["loss"] < result[0]["loss"]

    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs}
    trainer = TorchTrainer(train_loop_per_worker=train_func, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=num_workers))
    trainer.fit()


# --- test_local_mode.py (torch) --------------------------------------------------------------------


def test_torch_trainer_local_mode(ray_start_6_cpus):
    epochs = 3

    def train_func(config):
        result = linear_train_func(config)
        assert len(result) == epochs
        assert result[-1]["loss"] < result[0]["loss"]

    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs}
    trainer = TorchTrainer(
        train_loop_per_worker=train_func, train_loop_config=config, scaling_config=ScalingConfig(num_workers=0)
    )
    result = trainer.fit()
    assert result.error is None
    assert result.metrics is not None
    assert result.metrics["loss"] is not None
    assert result.checkpoint


# --- test_result.py --------------------------------------------------------------------------------


def build_dummy_trainer(exp_name, storage_path, num_iterations, num_checkpoints, train_loop_config):
    def worker_loop(_config):
        for i in range(num_iterations):
            sgd.report({"metric_a": -100, "metric_b": -100})  # reports between the checkpoints
            if sgd.get_context().get_world_rank() == 0:
                with create_dict_checkpoint({"iter": i}) as checkpoint:
                    sgd.report(metrics={"metric_a": i, "metric_b": -i}, checkpoint=checkpoint)
            else:
                sgd.report(metrics={"metric_a": i, "metric_b": -i})
        raise RuntimeError()

    return TorchTrainer(
        train_loop_per_worker=worker_loop,
        train_loop_config=train_loop_config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=exp_name,
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=num_checkpoints, checkpoint_score_attribute="metric_a", checkpoint_score_order="max"
            ),
        ),
    )


def test_result_repr():
    res = Result(metrics={"iter": 0, "metric": 1.0}, checkpoint=Checkpoint("/bucket/path/ckpt0"), error=None,
                 path="/bucket/path")
    assert isinstance(repr(res), str)
    assert "Checkpoint(filesystem=local, path=/bucket/path/ckpt0)" in repr(res)
    assert "metrics={'iter': 0, 'metric': 1.0}" in repr(res)


def test_get_best_checkpoint():
    res = Result(
        metrics={},
        checkpoint=None,
        error=None,
        path="/bucket/path",
        best_checkpoints=[(Checkpoint(f"/bucket/path/ckpt{i}"), {"iter": i, "metric": i + 1.0}) for i in range(4)],
    )
    assert res.get_best_checkpoint(metric="metric", mode="max").path == "/bucket/path/ckpt3"
    assert res.get_best_checkpoint(metric="metric", mode="min").path == "/bucket/path/ckpt0"


def test_result_restore(ray_start_4_cpus, tmp_path):
    # sgd: Ray's test is parametrized over storage (local, remote: a mock S3 server), path type, a
    # passed storage_filesystem (Ray's private StorageContext) and a trailing slash, and trains once
    # per case; here one run on local storage, read back with each local path type and slash
    num_iterations, num_checkpoints = 5, 3
    storage_path, exp_name = str(tmp_path), "test_result_restore_v2"
    trainer = build_dummy_trainer(exp_name, storage_path, num_iterations, num_checkpoints,
                                  train_loop_config={"a": 1, "b": 2})
    with pytest.raises(sgd.WorkerGroupError):
        trainer.fit()

    for path_type in ("str", "PathLike"):
        for trailing_slash in (False, True):
            trial_dir = str(Path(storage_path, exp_name)) + ("/" if trailing_slash else "")
            result = Result.from_path(Path(trial_dir) if path_type == "PathLike" else trial_dir,
                                      storage_filesystem=None)
            assert result.checkpoint
            assert len(result.best_checkpoints) == num_checkpoints
            # The 3 best by metric_a: iterations 4, 3 and 2 (metric_b: -4, -3, -2).
            best_a = result.get_best_checkpoint(metric="metric_a", mode="max")
            assert load_dict_checkpoint(best_a)["iter"] == num_iterations - 1
            best_b = result.get_best_checkpoint(metric="metric_b", mode="max")
            assert load_dict_checkpoint(best_b)["iter"] == num_iterations - num_checkpoints
            with pytest.raises(RuntimeError, match="Invalid metric name.*"):
                result.get_best_checkpoint(metric="invalid_metric", mode="max")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "sgd's RuntimeError names the folder, what a run folder holds and what to pass instead ('... is not an sgd "
    "run (no such folder): a run folder holds trainer.json, ...'); Ray's says \"Experiment folder ... doesn't "
    "exist!\" (the same class; code that catches RuntimeError runs unchanged)"))
@pytest.mark.parametrize("path_type", ["str", "PathLike"])
def test_result_from_path_validation(ray_start_4_cpus, tmp_path, path_type):
    # sgd: local storage only (Ray's "remote" case needs a mock S3 server)
    nonexistent_folder = str(tmp_path / "nonexistent_experiment")
    existing_folder = str(tmp_path / "existing_experiment")

    folder = Path(nonexistent_folder) if path_type == "PathLike" else nonexistent_folder
    with pytest.raises(RuntimeError, match="Experiment folder .* doesn't exist!"):
        Result.from_path(folder)

    Path(existing_folder).mkdir(parents=True, exist_ok=True)
    folder = Path(existing_folder) if path_type == "PathLike" else existing_folder
    # sgd: Ray names its own snapshot file (checkpoint_manager_snapshot.json) in this message;
    # sgd's run folder keeps no such file, so the test matches the rest of Ray's message
    with pytest.raises(RuntimeError, match="Failed to restore the Result object: .*Ray Train run"):
        Result.from_path(folder)
