"""``TorchTrainer``: the AIR-style trainer for PyTorch (``TorchTrainer(...).fit() -> sgd.Result``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from sgd.air import DataParallelTrainer, RunConfig, ScalingConfig
from sgd.data import DatasetConfig
from sgd_torch.checkpoint import TorchCheckpoint
from sgd_torch.config import TorchConfig


class TorchTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on workers joined in one ``torch.distributed`` process group.

    Inside the loop use ``sgd_torch.prepare_model`` / ``prepare_data_loader`` and
    ``sgd.report(metrics, checkpoint=sgd.Checkpoint.from_directory(d))``.

    :param torch_config: :class:`TorchConfig` (default: gloo on CPU, nccl with GPUs).
    Other arguments as :class:`sgd.DataParallelTrainer`.
    """

    _checkpoint_cls = TorchCheckpoint
    _default_backend_config = TorchConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        train_loop_config: Optional[Dict[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        torch_config: Optional[TorchConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        resume_from_checkpoint: Any = None,
        *,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        preprocessor: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        validation_config: Any = None,
    ):
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise TypeError(f"torch_config must be a sgd_torch.TorchConfig, got {type(torch_config).__name__}")
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=torch_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
            metadata=metadata,
            validation_config=validation_config,
        )
