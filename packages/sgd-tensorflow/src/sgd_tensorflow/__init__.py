"""sgd-tensorflow: the TensorFlow backend for sgd.

``TensorflowConfig`` is importable without TensorFlow; the training helpers
(``prepare_dataset_shard``, ``ReportCheckpointCallback``) import it on first use.
"""

from typing import Any

from sgd_tensorflow.checkpoint import TensorflowCheckpoint
from sgd_tensorflow.config import TensorflowConfig
from sgd_tensorflow.predictor import TensorflowPredictor
from sgd_tensorflow.trainer import TensorflowTrainer

_LAZY = {"prepare_dataset_shard": "train_loop_utils", "ReportCheckpointCallback": "keras_callback"}

__version__ = "0.1.0"
__all__ = ["TensorflowPredictor", "TensorflowCheckpoint", "TensorflowConfig", "TensorflowTrainer", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    # Plugin discovery imports this package in every sgd process: TensorFlow (and the
    # choice between Keras 3 and tf-keras it makes on import) must wait until used.
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(f"sgd_tensorflow.{_LAZY[name]}")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(f"sgd_tensorflow.{name} needs TensorFlow: pip install tensorflow ({exc})") from exc
        return getattr(module, name)
    raise AttributeError(f"module 'sgd_tensorflow' has no attribute {name!r}")
