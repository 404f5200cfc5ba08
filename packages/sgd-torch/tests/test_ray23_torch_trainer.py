"""Ray 2.3's ``python/ray/train/tests/test_torch_trainer.py``, ported (issue 37).

As Ray's Train 1.12 tests were: imports renamed to sgd's, nothing else changed except where a
``# sgd:`` comment says so. Ray's example module ``torch_linear_example`` and its test helper
``DummyPreprocessor`` are not part of Ray's public API; both are written anew below (marked).
Deliberate differences are strict ``xfail``s, each listed in docs/migration-ray-train.md
("Ported test status").
"""

import os
import time

import pytest
import ray
import torch
from ray.data.preprocessor import Preprocessor

import sgd  # sgd: for sgd.ScalingConfig / RunConfig / CheckpointConfig, Ray's ray.air.*
import sgd.session as session  # sgd: was ``from ray.air import session``
import sgd_torch  # sgd: was ``import ray.train as train`` (train.torch.prepare_model -> sgd_torch...)
from sgd import (
    BatchPredictor,  # sgd: was ray.train.batch_predictor
    ScalingConfig,  # sgd: was ray.air.config
)
from sgd_torch import (  # sgd: was ray.train.torch
    TorchCheckpoint,  # sgd: was ray.train.torch.torch_checkpoint
    TorchPredictor,
    TorchTrainer,
)

DISABLE_LAZY_CHECKPOINTING_ENV = "TRAIN_DISABLE_LAZY_CHECKPOINTING"  # sgd: was ray.train.constants; unused by sgd


class DummyPreprocessor(Preprocessor):  # sgd: was ray.train.tests.dummy_preprocessor; written anew
    """Not fittable; passes batches through unchanged."""

    _is_fittable = False

    def _transform_pandas(self, df):
        return df


def linear_train_func(config):  # sgd: was ray.train.examples.pytorch.torch_linear_example; written anew
    """Fit y = 2x + 1 with a small MLP; report and return one result per epoch."""
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 2 * x + 1
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=config["batch_size"],
                                         shuffle=True)
    loader = sgd_torch.prepare_data_loader(loader)
    model = torch.nn.Sequential(torch.nn.Linear(1, config["hidden_size"]), torch.nn.Linear(config["hidden_size"], 1))
    model = sgd_torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    results = []
    for _ in range(config["epochs"]):
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            optimizer.step()
        with torch.no_grad():
            loss = torch.nn.functional.mse_loss(model(x), y).item()
        result = {"loss": loss}
        session.report(result)
        results.append(result)
    return results


@pytest.fixture
def ray_start_4_cpus(ray_cluster, results_dir):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown() per test;
    # runs written under a temporary SGD_RESULTS_DIR
    yield ray_cluster


@pytest.mark.parametrize("num_workers", [1, 2])
def test_torch_linear(ray_start_4_cpus, num_workers):
    def train_func(config):
        result = linear_train_func(config)
        assert len(result) == epochs
        assert result[-1]["loss"] < result[0]["loss"]

    num_workers = num_workers
    epochs = 3
    scaling_config = ScalingConfig(num_workers=num_workers)
    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs}
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config=config,
        scaling_config=scaling_config,
    )
    trainer.fit()


@pytest.mark.parametrize("prepare_model", (True, False))
def test_torch_e2e(ray_start_4_cpus, prepare_model):
    def train_func():
        model = torch.nn.Linear(3, 1)
        if prepare_model:
            model = sgd_torch.prepare_model(model)  # sgd: was train.torch.prepare_model
        session.report({}, checkpoint=TorchCheckpoint.from_model(model))

    scaling_config = ScalingConfig(num_workers=2)
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scaling_config,
        preprocessor=DummyPreprocessor(),
    )
    result = trainer.fit()
    assert isinstance(result.checkpoint.get_preprocessor(trusted=True), DummyPreprocessor)  # sgd: trusted=True

    predict_dataset = ray.data.range(9)
    batch_predictor = BatchPredictor.from_checkpoint(result.checkpoint, TorchPredictor,
                                                     trusted=True)  # sgd: trusted=True
    predictions = batch_predictor.predict(
        predict_dataset, batch_size=3, dtype=torch.float
    )
    assert predictions.count() == 3


@pytest.mark.parametrize("prepare_model", (True, False))
def test_torch_e2e_state_dict(ray_start_4_cpus, prepare_model):
    def train_func():
        model = torch.nn.Linear(3, 1)
        if prepare_model:
            model = sgd_torch.prepare_model(model)  # sgd: was train.torch.prepare_model
        session.report(
            {}, checkpoint=TorchCheckpoint.from_state_dict(model.state_dict())
        )

    scaling_config = ScalingConfig(num_workers=2)
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scaling_config,
        preprocessor=DummyPreprocessor(),
    )
    result = trainer.fit()
    isinstance(result.checkpoint.get_preprocessor(trusted=True), DummyPreprocessor)  # sgd: trusted=True

    # If loading from a state dict, a model definition must be passed in.
    with pytest.raises(ValueError):
        TorchPredictor.from_checkpoint(result.checkpoint)

    predict_dataset = ray.data.range(9)
    batch_predictor = BatchPredictor.from_checkpoint(
        result.checkpoint, TorchPredictor, model=torch.nn.Linear(3, 1), trusted=True  # sgd: trusted=True
    )
    predictions = batch_predictor.predict(
        predict_dataset, batch_size=3, dtype=torch.float
    )
    assert predictions.count() == 3


# We can't really test for prepare_model here as we can't detect what the user
# has saved without loading (and thus triggering the exception anyway)
@pytest.mark.parametrize("lazy_checkpointing", (True, False))
def test_torch_e2e_dir(ray_start_4_cpus, tmpdir, lazy_checkpointing, monkeypatch):
    def train_func():
        model = torch.nn.Linear(3, 1)
        # sgd: rank 0 only writes the file: two ranks writing one file race, and a rank could
        # report the other's half-written file (every rank still reports the directory)
        if session.get_world_rank() == 0:
            torch.save(model, os.path.join(tmpdir, "model"))
        session.report({}, checkpoint=TorchCheckpoint.from_directory(tmpdir))

    scaling_config = ScalingConfig(num_workers=2)
    # sgd: was patch.dict(os.environ, ...); the variable changes nothing in sgd
    monkeypatch.setenv(DISABLE_LAZY_CHECKPOINTING_ENV, str(int(not lazy_checkpointing)))
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scaling_config,
        preprocessor=DummyPreprocessor(),
    )
    result = trainer.fit()
    isinstance(result.checkpoint.get_preprocessor(trusted=True), DummyPreprocessor)  # sgd: trusted=True

    # TODO(ml-team): Add a way for TorchCheckpoint to natively support
    # models from files
    class TorchScorer:
        def __init__(self):
            with result.checkpoint.as_directory() as checkpoint_path:
                # sgd: weights_only=False: torch >= 2.6 loads weights only by default
                model = torch.load(os.path.join(checkpoint_path, "model"), weights_only=False)
            preprocessor = result.checkpoint.get_preprocessor(trusted=True)  # sgd: trusted=True
            self.pred = TorchPredictor.from_checkpoint(
                TorchCheckpoint.from_model(model, preprocessor=preprocessor), trusted=True  # sgd: trusted=True
            )

        def __call__(self, x):
            return self.pred.predict(x, dtype=torch.float)

    predict_dataset = ray.data.range(9)
    predictions = predict_dataset.map_batches(
        TorchScorer, batch_size=3, batch_format="pandas", concurrency=1  # sgd: Ray 2.60 has no compute="actors"
    )
    assert predictions.count() == 3


def test_checkpoint_freq(ray_start_4_cpus):
    # checkpoint_freq is not supported so raise an error
    trainer = TorchTrainer(
        train_loop_per_worker=lambda config: None,
        scaling_config=sgd.ScalingConfig(num_workers=1),  # sgd: was ray.air.ScalingConfig
        run_config=sgd.RunConfig(  # sgd: was ray.air.RunConfig
            checkpoint_config=sgd.CheckpointConfig(  # sgd: was ray.air.CheckpointConfig
                checkpoint_frequency=2,
            ),
        ),
    )
    with pytest.raises(ValueError):
        trainer.fit()


TENSORS = ("sgd allows torch tensors in report metrics: they arrive on the driver as CPU tensors (API section 4); "
           "Ray 2.3 raised ValueError")


@pytest.mark.xfail(strict=True, reason=TENSORS)
def test_torch_session_errors(ray_start_4_cpus):
    """Test fail-fast behavior when reporting dicts with Torch tensors"""

    def train_func():
        model = torch.nn.Linear(1, 1).state_dict()
        with pytest.raises(ValueError):
            session.report(model)

    scaling_config = ScalingConfig(num_workers=2)
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scaling_config,
    )
    trainer.fit()


def test_single_worker_failure(ray_start_4_cpus):
    """Tests if training fails upon any worker failure."""

    def single_worker_fail():
        if session.get_world_rank() == 0:
            raise ValueError
        else:
            time.sleep(1000000)

    scaling_config = ScalingConfig(num_workers=2)
    trainer = TorchTrainer(
        train_loop_per_worker=single_worker_fail,
        scaling_config=scaling_config,
    )
    with pytest.raises(ValueError):
        trainer.fit()


@pytest.mark.skip(reason="needs a two-node cluster of its own with logical GPUs and patches torch.cuda in the "
                         "workers; sgd's GPU placement is tested by test_torch_backend.py (two_node_gpu_cluster)")
@pytest.mark.parametrize(
    "num_gpus_per_worker,expected_devices", [(0.5, [0]), (1, [0]), (2, [0, 1])]
)
def test_tune_torch_get_device_gpu(num_gpus_per_worker, expected_devices):
    pass  # sgd: body not ported (see the skip reason)


def test_torch_auto_unwrap(ray_start_4_cpus):
    """Tests if underlying model from DDP is extracted when saving ckpt."""

    def train_fn():
        model = torch.nn.Linear(1, 1)

        # Wrap in DDP.
        model = sgd_torch.prepare_model(model)  # sgd: was train.torch.prepare_model

        # Save DDP wrapped model.
        session.report({}, checkpoint=TorchCheckpoint.from_model(model))

    trainer = TorchTrainer(
        train_loop_per_worker=train_fn,
        scaling_config=ScalingConfig(num_workers=2),
    )
    results = trainer.fit()

    last_checkpoint = results.checkpoint
    model = last_checkpoint.get_model(trusted=True)  # sgd: trusted=True
    assert isinstance(model, torch.nn.Module) and not isinstance(
        model, torch.nn.parallel.DistributedDataParallel
    )


def test_torch_amp(ray_start_4_cpus):
    def train_fn():
        sgd_torch.accelerate(amp=True)  # sgd: was train.torch.accelerate
        model = torch.nn.Linear(1, 1)
        model = sgd_torch.prepare_model(model)  # sgd: was train.torch.prepare_model

        session.report({}, checkpoint=TorchCheckpoint.from_model(model))

    trainer = TorchTrainer(
        train_fn,
        scaling_config=ScalingConfig(num_workers=2),
    )
    results = trainer.fit()
    assert results.checkpoint


def test_torch_amp_with_custom_get_state(ray_start_4_cpus):
    """Tests amp with a model that has a custom __getstate__ method defined.

    See https://discuss.ray.io/t/ray-train-hangs-for-long-time/6333/7
    """

    def train_fn():
        sgd_torch.accelerate(amp=True)  # sgd: was train.torch.accelerate

        class CustomLinear(torch.nn.Linear):
            def __getstate__(self):
                return self.__dict__.copy()

        model = CustomLinear(1, 1)
        model = sgd_torch.prepare_model(model)  # sgd: was train.torch.prepare_model

        # Make sure model is serializable even with amp enabled.
        session.report({}, checkpoint=TorchCheckpoint.from_model(model))

    trainer = TorchTrainer(
        train_fn,
        scaling_config=ScalingConfig(num_workers=2),
    )
    results = trainer.fit()
    assert results.checkpoint


def test_torch_env_vars(ray_start_4_cpus):
    """Check that env vars are set as expected."""

    def train_func(config):
        assert os.environ["LOCAL_RANK"] == str(session.get_local_rank())
        assert os.environ["RANK"] == str(session.get_world_rank())
        assert os.environ["LOCAL_WORLD_SIZE"] == str(session.get_local_world_size())
        assert os.environ["WORLD_SIZE"] == str(session.get_world_size())
        assert os.environ["ACCELERATE_TORCH_DEVICE"] == str(sgd_torch.get_device())  # sgd: was train.torch

    num_workers = 1
    scaling_config = ScalingConfig(num_workers=num_workers)
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scaling_config,
    )
    trainer.fit()
