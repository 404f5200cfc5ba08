"""sgd: distributed training on Ray actors.

Re-exports only; see the modules for the code.
"""

from sgd import collective as collective  # the module: sgd.collective.barrier() after import sgd
from sgd.air import (
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    TrainRunContext,
    UserCallback,
)
from sgd.air.config_fields import LoggingConfig
from sgd.backend import Backend, BackendConfig, BackendSpec, free_address
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import Checkpoint, CheckpointStrategy
from sgd.data import TRAIN_DATASET_KEY, DataConfig, DatasetConfig, DatasetShard, cross_validation_folds
from sgd.errors import (
    CheckpointError,
    CheckpointIntegrityError,
    ControllerError,
    NCCLHangError,
    PreemptionError,
    TrainingFailedError,
    TrainingHangError,
    UntrustedCheckpointError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
)
from sgd.hookspecs import hookimpl
from sgd.predictor import BatchPredictor, Predictor
from sgd.report_config import (
    CheckpointConsistencyMode,
    CheckpointUploadMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
    ValidationConfig,
    ValidationFn,
    ValidationTaskConfig,
)
from sgd.session import (
    PreemptionInfo,
    TrainContext,
    get_all_reported_checkpoints,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    get_preemption_info,
    load_checkpoint,
    local_rank,
    local_world_size,
    node_rank,
    report,
    save_checkpoint,
    world_rank,
    world_size,
)
from sgd.storage.errors import RunFormatError, RunInUseError, RunNotFoundError
from sgd.trainer import Trainer, TrainingIterator
from sgd.worker_group import ResourcesUnavailableError, WorkerGroup
from sgd.worker_group.keep import keep_workers, kept_workers

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendConfig",
    "BackendSpec",
    "BatchPredictor",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointIntegrityError",
    "CheckpointStrategy",
    "ControllerError",
    "NCCLHangError",
    "PreemptionError",
    "TRAIN_DATASET_KEY",
    "DataParallelTrainer",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "DataConfig",
    "DatasetConfig",
    "LoggingConfig",
    "DatasetShard",
    "PreemptionInfo",
    "Predictor",
    "ResourcesUnavailableError",
    "RunFormatError",
    "RunInUseError",
    "RunNotFoundError",
    "TrainContext",
    "Trainer",
    "TrainingCallback",
    "TrainingFailedError",
    "TrainingIterator",
    "TrainRunContext",
    "UntrustedCheckpointError",
    "UserCallback",
    "TrainingHangError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupError",
    "cross_validation_folds",
    "free_address",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "keep_workers",
    "kept_workers",
    "hookimpl",
    "load_checkpoint",
    "local_rank",
    "local_world_size",
    "node_rank",
    "report",
    "save_checkpoint",
    "world_rank",
    "world_size",
    # Ray 2.60's report options and reported checkpoints (sgd.report_config)
    "CheckpointConsistencyMode",
    "CheckpointUploadMode",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "get_all_reported_checkpoints",
]
