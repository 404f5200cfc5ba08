"""``sgd_tensorflow`` and ``sgd_tensorflow.keras`` carry Ray Train 2.60's ``ray.train.tensorflow`` and
``ray.train.tensorflow.keras`` (issue 53): every public name (read from the installed Ray wheel),
with compatible signatures, and Ray's ``ReportCheckpointCallback``: a checkpoint at every epoch's
end by default. TensorFlow is slow to start here: two tests, one of them on 2 workers."""

from __future__ import annotations

import os

import pytest

import sgd
from sgd_testing.ray_api import compare_in_subprocess

pytest.importorskip("tensorflow")

#: Ray's names that are its backend machinery, not a user's API.
NOT_USER_API = {"TensorflowConfig.framework: no such property in sgd"}
#: Listed differences: sgd's TensorflowCheckpoint keeps weights and architecture as data, not a
#: model file named in Ray's checkpoint metadata.
KNOWN = {"TensorflowCheckpoint.MODEL_FILENAME_KEY: no such attribute in sgd"}


def test_every_ray_name_with_a_compatible_signature():
    # Ray's keras module has no __all__: its one public class.
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    found = compare_in_subprocess(("ray.train.tensorflow", "sgd_tensorflow"),
                                  ("ray.train.tensorflow.keras", "sgd_tensorflow.keras", ["ReportCheckpointCallback"]),
                                  env=env)
    assert "prepare_dataset_shard" in found["sgd_tensorflow"]["names"]
    for module, result in found.items():
        assert result["missing"] == [], module
        assert [d for d in result["differences"] if d not in NOT_USER_API | KNOWN] == [], module


def _build():
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(2,)), tf.keras.layers.Dense(1)])


def _keras_loop(config):
    import numpy as np
    import tensorflow as tf

    from sgd_tensorflow.keras import ReportCheckpointCallback

    try:
        ReportCheckpointCallback(checkpoint_on="epoch_ends")
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _build()
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    x = np.linspace(0, 1, 64, dtype="float32").reshape(32, 2)
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(8)
    model.fit(data, epochs=2, verbose=0, callbacks=[ReportCheckpointCallback(metrics={"mse": "loss"})])
    sgd.report({"refused": refused, "final": float(model.layers[-1].bias.numpy()[0])})


def test_report_checkpoint_callback_checkpoints_every_epoch_by_default(ray_cluster, tmp_path):
    from sgd_tensorflow import TensorflowCheckpoint, TensorflowTrainer

    result = TensorflowTrainer(_keras_loop, scaling_config=sgd.ScalingConfig(num_workers=2),
                               run_config=sgd.RunConfig(storage_path=str(tmp_path), verbose=0)).fit()
    frame = result.metrics_dataframe
    assert list(frame["mse"].notna()) == [True, True, False]  # one report per epoch, then the loop's own
    assert len(result.best_checkpoints) == 2  # each epoch's report carried a checkpoint
    assert "unknown Keras event(s) ['epoch_ends']" in result.metrics["refused"]
    # The last checkpoint is the model after epoch 2: its weights load into a model built anew.
    model = TensorflowCheckpoint.from_checkpoint(result.best_checkpoints[-1][0]).get_model(_build)
    assert float(model.layers[-1].bias.numpy()[0]) == pytest.approx(result.metrics["final"], abs=1e-6)
