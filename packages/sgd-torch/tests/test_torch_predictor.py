"""Train, then predict from the checkpoint (issue 37): ``TorchPredictor``, ``BatchPredictor`` and
its ``map_batches`` form, with the trainer's preprocessor applied; and their errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import ray
import torch

import sgd
from sgd import BatchPredictor, Checkpoint, CheckpointError, RunConfig, ScalingConfig
from sgd_torch import TorchCheckpoint, TorchPredictor, TorchTrainer


def _linear():
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.fill_(0.5)
    return model


class ByName(torch.nn.Module):
    """A model that takes a dict of columns, as Ray AIR's TorchPredictor passed several columns."""

    def forward(self, columns):
        return columns["a"] + 2 * columns["b"]


def test_torch_predictor_on_frames_arrays_and_dicts():
    predictor = TorchPredictor(_linear())
    tensors = pd.DataFrame({"x": [np.array([1.0, 1.0]), np.array([0.0, 2.0])]})  # one tensor column: stacked
    assert predictor.predict(tensors, dtype=torch.float)["predictions"].tolist() == [3.5, 4.5]
    assert predictor.predict(np.array([[1.0, 1.0]], dtype="float32")).tolist() == [[3.5]]
    assert predictor.predict({"x": np.array([[0.0, 1.0]], dtype="float32")})["predictions"].tolist() == [[2.5]]
    columns = pd.DataFrame({"a": [1.0, 0.0], "b": [1.0, 2.0]})  # several columns: a dict by name
    assert TorchPredictor(ByName()).predict(columns, dtype=torch.float)["predictions"].tolist() == [3.0, 4.0]
    with pytest.raises(TypeError, match="DataFrame, a numpy array or a dict"):
        predictor.predict([1, 2])


def test_train_then_predict_from_the_checkpoint(ray_cluster, tmp_path):
    from ray.data.preprocessors import Chain, Concatenator, StandardScaler

    def loop():
        sgd.report({"done": 1}, checkpoint=TorchCheckpoint.from_state_dict(_linear().state_dict()))

    train = ray.data.from_items([{"a": 0.0, "b": 1.0}, {"a": 2.0, "b": 1.0}])  # a: mean 1, std 1
    result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=1), datasets={"train": train},
                          preprocessor=Chain(StandardScaler(columns=["a"]),
                                             Concatenator(columns=["a", "b"], output_column_name="x")),
                          run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None, result.error

    predictor = TorchPredictor.from_checkpoint(result.checkpoint, model=torch.nn.Linear(2, 1))
    frame = pd.DataFrame({"a": [3.0], "b": [1.0]})  # a scaled to 2, then [a, b] in one column: 1*2 + 2*1 + 0.5
    assert predictor.predict(frame, dtype=torch.float)["predictions"].tolist() == [4.5]

    data = ray.data.from_items([{"a": 3.0, "b": 1.0, "id": i} for i in range(5)])
    batch = BatchPredictor.from_checkpoint(result.checkpoint, TorchPredictor, model=torch.nn.Linear(2, 1))
    out = batch.predict(data, feature_columns=["a", "b"], keep_columns=["id"], batch_size=2, dtype=torch.float)
    rows = sorted(out.take_all(), key=lambda r: r["id"])
    assert [(r["id"], r["predictions"]) for r in rows] == [(i, 4.5) for i in range(5)]

    # Ray's later form: map_batches over a class that makes the predictor once per actor.
    class Scorer:
        def __init__(self):
            self.predictor = TorchPredictor.from_checkpoint(result.checkpoint, model=torch.nn.Linear(2, 1))

        def __call__(self, frame):
            return self.predictor.predict(frame[["a", "b"]], dtype=torch.float)

    scored = data.map_batches(Scorer, batch_format="pandas", batch_size=2, concurrency=1)
    assert [r["predictions"] for r in scored.take_all()] == [4.5] * 5


def test_batch_predictor_errors(ray_cluster, tmp_path):
    checkpoint = TorchCheckpoint.from_model(_linear())
    empty = ray.data.from_items([{"a": 1.0, "b": 1.0}]).filter(lambda r: False)
    with pytest.raises(ValueError, match="no rows"):
        BatchPredictor.from_checkpoint(checkpoint, TorchPredictor).predict(empty)
    with pytest.raises(ValueError, match="no column 'c'"):
        BatchPredictor.from_checkpoint(checkpoint, TorchPredictor).predict(
            ray.data.from_items([{"a": 1.0}]), feature_columns=["c"])
    with pytest.raises(TypeError, match="Ray Dataset"):
        BatchPredictor.from_checkpoint(checkpoint, TorchPredictor).predict(pd.DataFrame({"a": [1.0]}))
    with pytest.raises(TypeError, match="Predictor class"):
        BatchPredictor(checkpoint, object)
    # A checkpoint of another framework (Keras weights), and a state dict without a model: at once.
    keras_like = Checkpoint.from_dict({"model": [np.zeros((2, 1)), np.zeros(1)]})
    with pytest.raises(CheckpointError, match="TensorflowCheckpoint"):
        BatchPredictor.from_checkpoint(keras_like, TorchPredictor)
    with pytest.raises(ValueError, match="state dict"):
        TorchPredictor.from_checkpoint(TorchCheckpoint.from_state_dict(_linear().state_dict()))
