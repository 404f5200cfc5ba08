"""Ray 2.3's ``python/ray/train/tests/test_tensorflow_trainer.py``, ported (issue 37).

As Ray's Train 1.12 tests were: imports renamed to sgd's, nothing else changed except where a
``# sgd:`` comment says so. Ray's example module ``tensorflow_regression_example`` is not part of
Ray's public API; its ``get_dataset`` and ``train_func`` are written anew below (marked).
"""

import os

import numpy as np
import pytest
import ray

import sgd.session as session  # sgd: was ``from ray.air import session``
from sgd import (
    Checkpoint,  # sgd: was ray.air.checkpoint
    ScalingConfig,  # sgd: was ray.air.config
)
from sgd_tensorflow import TensorflowPredictor, TensorflowTrainer  # sgd: was ray.train.tensorflow

MODEL_KEY, TRAIN_DATASET_KEY = "model", "train"  # sgd: were ray.train.constants


def get_dataset(a=5, b=10, size=256):  # sgd: was ray.air.examples.tf.tensorflow_regression_example; anew
    """Rows ``{"x": x, "y": a * x + b}`` for x evenly spread over [0, 1)."""
    return ray.data.from_items([{"x": i / size, "y": a * i / size + b} for i in range(size)])


def tensorflow_linear_train_func(config):  # sgd: was the same example's train_func; written anew
    """Fit y = a x + b with one Dense layer under MultiWorkerMirroredStrategy; report and return
    Keras' logs of every epoch."""
    import tensorflow as tf

    from sgd_tensorflow import ReportCheckpointCallback

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(1,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=config["lr"]), loss="mse")
    rows = session.get_dataset_shard(TRAIN_DATASET_KEY).take_all()
    x = np.array([[r["x"]] for r in rows], dtype="float32")
    y = np.array([[r["y"]] for r in rows], dtype="float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(config["batch_size"])
    data = data.with_options(_no_autoshard(tf))  # each worker already holds its own shard
    results = []
    for _ in range(config["epochs"]):
        history = model.fit(data, callbacks=[ReportCheckpointCallback()], verbose=0)
        results.append({k: v[-1] for k, v in history.history.items()})
    return results


def _no_autoshard(tf):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


@pytest.fixture
def ray_start_4_cpus(ray_cluster, results_dir):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown() per test;
    # runs written under a temporary SGD_RESULTS_DIR
    yield ray_cluster


def build_model():
    import tensorflow as tf

    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=()),
            # Add feature dimension, expanding (batch_size,) to (batch_size, 1).
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(1),
        ]
    )

    return model


@pytest.mark.parametrize("num_workers", [1, 2])
def test_tensorflow_linear(ray_start_4_cpus, num_workers):
    """Also tests air Keras callback."""

    def train_func(config):
        result = tensorflow_linear_train_func(config)
        assert len(result) == epochs
        assert result[-1]["loss"] < result[0]["loss"]

    num_workers = num_workers
    epochs = 3
    scaling_config = ScalingConfig(num_workers=num_workers)
    config = {
        "lr": 1e-3,
        "batch_size": 32,
        "epochs": epochs,
    }
    trainer = TensorflowTrainer(
        train_loop_per_worker=train_func,
        train_loop_config=config,
        scaling_config=scaling_config,
        datasets={TRAIN_DATASET_KEY: get_dataset()},
    )
    trainer.fit()


def test_tensorflow_e2e(ray_start_4_cpus):
    def train_func():
        model = build_model().get_weights()
        session.report({}, checkpoint=Checkpoint.from_dict({MODEL_KEY: model}))

    scaling_config = ScalingConfig(num_workers=2)
    trainer = TensorflowTrainer(
        train_loop_per_worker=train_func, scaling_config=scaling_config
    )
    result = trainer.fit()

    class TensorflowScorer:
        def __init__(self):
            self.pred = TensorflowPredictor.from_checkpoint(
                result.checkpoint, build_model
            )

        def __call__(self, x):
            return self.pred.predict(x, dtype=np.float64)  # sgd: np.float is gone from numpy

    predict_dataset = ray.data.range(3)
    predictions = predict_dataset.map_batches(
        TensorflowScorer, batch_format="pandas", concurrency=1  # sgd: Ray 2.60 has no compute="actors"
    )
    assert predictions.count() == 3


def test_report_and_load_using_ml_session(ray_start_4_cpus, tmp_path):  # sgd: tmp_path
    def train_func():
        if session.get_checkpoint():
            with session.get_checkpoint().as_directory() as checkpoint_dir:
                import tensorflow as tf

                model = tf.keras.models.load_model(checkpoint_dir)
        else:
            model = build_model()

        # sgd: a folder per rank under tmp_path (Ray's workers each ran in a directory of their own)
        my_model = os.path.join(tmp_path, f"my_model_{session.get_world_rank()}")
        model.save(my_model)
        session.report(
            metrics={"iter": 1}, checkpoint=Checkpoint.from_directory(my_model)
        )

    scaling_config = ScalingConfig(num_workers=2)
    trainer = TensorflowTrainer(
        train_loop_per_worker=train_func, scaling_config=scaling_config
    )
    result = trainer.fit()

    trainer2 = TensorflowTrainer(
        train_loop_per_worker=train_func,
        scaling_config=scaling_config,
        resume_from_checkpoint=result.checkpoint,
    )
    result = trainer2.fit()
    checkpoint = result.checkpoint
    with checkpoint.as_directory() as ckpt_dir:
        assert os.path.exists(os.path.join(ckpt_dir, "saved_model.pb"))
    assert result.metrics["iter"] == 1
