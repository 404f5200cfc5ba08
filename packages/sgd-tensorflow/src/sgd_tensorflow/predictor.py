"""``TensorflowPredictor``: Ray AIR's predictor for a Keras model (see :mod:`sgd.predictor`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from sgd.checkpoint import Checkpoint
from sgd.predictor import Predictor
from sgd_tensorflow.checkpoint import TensorflowCheckpoint

__all__ = ["TensorflowPredictor"]


class TensorflowPredictor(Predictor):
    """Predictions of a Keras model.

    :param model: the model, or ``model_definition`` (a function returning it).
    :param preprocessor: applied to a DataFrame batch first (``transform_batch``).
    """

    def __init__(self, model: Any = None, preprocessor: Any = None,
                 model_definition: Optional[Callable[[], Any]] = None, use_gpu: bool = False):
        if model is None and model_definition is not None:
            model = model_definition()
        if model is None or not callable(model):
            raise TypeError(f"TensorflowPredictor takes a Keras model, got {type(model).__name__}")
        super().__init__(preprocessor)
        self.model = model
        self.use_gpu = use_gpu

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, model_definition: Any = None, use_gpu: bool = False,
                        trusted: Any = None) -> TensorflowPredictor:  # type: ignore[override]
        """A predictor of the model in ``checkpoint``: its weights loaded into ``model_definition()``
        (no code from the checkpoint runs), or the model rebuilt from it with ``trusted=True``."""
        tf_checkpoint = TensorflowCheckpoint.from_checkpoint(checkpoint)
        model = tf_checkpoint.get_model(model_definition, trusted=trusted)
        return cls(model, preprocessor=tf_checkpoint.get_preprocessor(trusted=trusted), use_gpu=use_gpu)

    def _predict_numpy(self, data: Any, dtype: Any = None) -> Any:  # type: ignore[override]
        import numpy as np

        inputs: Any
        if isinstance(data, dict):
            inputs = {k: np.asarray(v, dtype=dtype) for k, v in data.items()}
        else:
            inputs = np.asarray(data, dtype=dtype)
        out = self.model(inputs, training=False)
        return np.asarray(out)
