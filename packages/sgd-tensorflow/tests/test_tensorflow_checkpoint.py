"""``TensorflowCheckpoint`` (Ray AIR's): weights and architecture as plain data, SavedModel and
HDF5 directories, the trust rule, and a ``TensorflowTrainer``'s result (issue 37)."""

from __future__ import annotations

import numpy as np
import pytest

import sgd
from sgd import RunConfig, ScalingConfig, UntrustedCheckpointError
from sgd_tensorflow import TensorflowCheckpoint, TensorflowTrainer


def build_model():
    from tensorflow import keras

    return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])


def test_from_model_loads_weights_without_trust_and_rebuilds_with_it(tmp_path):
    model = build_model()
    path = TensorflowCheckpoint.from_model(model).to_directory(tmp_path / "c")
    checkpoint = TensorflowCheckpoint.from_directory(path)
    assert "pickle" not in (tmp_path / "c" / ".sgd_checkpoint.json").read_text()  # plain data only
    loaded = checkpoint.get_model(build_model)  # a model definition: no code from the checkpoint
    x = np.ones((1, 2), dtype="float32")
    assert np.allclose(loaded(x).numpy(), model(x).numpy())
    assert np.allclose(checkpoint.get_model(model=build_model())(x).numpy(), model(x).numpy())
    with pytest.raises(UntrustedCheckpointError, match="get_model\\(model_definition\\)"):
        checkpoint.get_model()
    assert np.allclose(checkpoint.get_model(trusted=True)(x).numpy(), model(x).numpy())


def test_saved_model_and_h5_forms_need_trust(tmp_path):
    model = build_model()
    h5 = tmp_path / "m.h5"
    model.save(str(h5))
    checkpoint = TensorflowCheckpoint.from_h5(h5)
    with pytest.raises(UntrustedCheckpointError, match="trusted=True"):
        checkpoint.get_model()
    x = np.ones((1, 2), dtype="float32")
    assert np.allclose(checkpoint.get_model(trusted=True)(x).numpy(), model(x).numpy())
    with pytest.raises(FileNotFoundError, match="no HDF5 file"):
        TensorflowCheckpoint.from_h5(tmp_path / "missing.h5")


def test_a_tensorflow_trainers_result_is_a_tensorflow_checkpoint(ray_cluster, tmp_path):
    def loop():
        sgd.report({"done": 1}, checkpoint=TensorflowCheckpoint.from_model(build_model()))

    result = TensorflowTrainer(loop, scaling_config=ScalingConfig(num_workers=1),
                               run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None, result.error
    assert isinstance(result.checkpoint, TensorflowCheckpoint)
    assert result.checkpoint.get_model(build_model).count_params() == 3


def test_tensorflow_predictor_from_a_checkpoint_and_its_errors():
    import pandas as pd

    from sgd import CheckpointError
    from sgd_tensorflow import TensorflowPredictor

    model = build_model()
    predictor = TensorflowPredictor.from_checkpoint(TensorflowCheckpoint.from_model(model), build_model)
    frame = pd.DataFrame({"x": [np.array([1.0, 0.5]), np.array([2.0, 0.0])]})  # one tensor column
    expected = model(np.array([[1.0, 0.5], [2.0, 0.0]], dtype="float32")).numpy()[:, 0]
    assert np.allclose(predictor.predict(frame, dtype="float32")["predictions"].to_numpy(dtype=float), expected)
    # A PyTorch state dict (a dict of arrays) is not Keras weights: a clear error naming the other framework.
    torch_like = sgd.Checkpoint.from_dict({"model": {"weight": np.zeros((1, 2)), "bias": np.zeros(1)}})
    with pytest.raises(CheckpointError, match="TorchCheckpoint"):
        TensorflowPredictor.from_checkpoint(torch_like, build_model)
