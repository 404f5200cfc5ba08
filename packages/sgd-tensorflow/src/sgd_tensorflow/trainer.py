"""``TensorflowTrainer``: the AIR-style trainer for TensorFlow (``TensorflowTrainer(...).fit() -> sgd.Result``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from sgd.air import DataParallelTrainer, RunConfig, ScalingConfig
from sgd.data import DatasetConfig
from sgd_tensorflow.checkpoint import TensorflowCheckpoint
from sgd_tensorflow.config import TensorflowConfig


class TensorflowTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on workers with ``TF_CONFIG`` set for
    ``tf.distribute.MultiWorkerMirroredStrategy`` (build the strategy inside the loop).

    :param tensorflow_config: :class:`TensorflowConfig` (default: tf-keras when installed).
    Other arguments as :class:`sgd.DataParallelTrainer`.
    """

    _checkpoint_cls = TensorflowCheckpoint
    _default_backend_config = TensorflowConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        train_loop_config: Optional[Dict[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        tensorflow_config: Optional[TensorflowConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        resume_from_checkpoint: Any = None,
        *,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        preprocessor: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        validation_config: Any = None,
    ):
        if tensorflow_config is not None and not isinstance(tensorflow_config, TensorflowConfig):
            raise TypeError("tensorflow_config must be a sgd_tensorflow.TensorflowConfig, "
                            f"got {type(tensorflow_config).__name__}")
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=tensorflow_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
            metadata=metadata,
            validation_config=validation_config,
        )
