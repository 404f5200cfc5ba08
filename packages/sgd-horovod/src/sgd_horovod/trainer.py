"""``HorovodTrainer``: the AIR-style trainer for Horovod (``HorovodTrainer(...).fit() -> sgd.Result``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from sgd.air import DataParallelTrainer, RunConfig, ScalingConfig
from sgd.data import DatasetConfig
from sgd_horovod.config import HorovodConfig


class HorovodTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on workers set up as one Horovod (Gloo) job: call
    ``hvd.init()`` in the loop, with no arguments.

    :param horovod_config: :class:`HorovodConfig` (default: ``HorovodConfig()``).
    Other arguments as :class:`sgd.DataParallelTrainer`.
    """

    _default_backend_config = HorovodConfig

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        train_loop_config: Optional[Dict[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        horovod_config: Optional[HorovodConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        resume_from_checkpoint: Any = None,
        *,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        preprocessor: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        validation_config: Any = None,
    ):
        if horovod_config is not None and not isinstance(horovod_config, HorovodConfig):
            raise TypeError(f"horovod_config must be a sgd_horovod.HorovodConfig, got {type(horovod_config).__name__}")
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=horovod_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
            metadata=metadata,
            validation_config=validation_config,
        )
