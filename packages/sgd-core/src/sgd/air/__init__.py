"""AIR-style trainers (the API of later Ray Train): ``TorchTrainer(...).fit() -> Result``.

A thin layer over :class:`sgd.Trainer`: ``fit()`` builds a trainer from the configs,
runs ``train_loop_per_worker`` through the same executor (same fault tolerance,
checkpoints, run directory) and turns the run directory into a :class:`Result`.

Framework packages subclass :class:`DataParallelTrainer` with their backend config
(``sgd_torch.TorchTrainer``, ``sgd_tensorflow.TensorflowTrainer``,
``sgd_horovod.HorovodTrainer``).

Re-exports only; the code is in the submodules, one concept each:

- ``config``: :class:`ScalingConfig`, :class:`RunConfig`, :class:`CheckpointConfig`, :class:`FailureConfig`;
- ``config_fields``: Ray Train 2.60's :class:`LoggingConfig` and checks of the newer fields;
- ``result``: :class:`Result` and Ray Train's result fields;
- ``data_parallel``: :class:`DataParallelTrainer` (``fit``, ``restore``, Ray Tune);
- ``loop_run``: the trainer's datasets and its loop's start, and the trainer as a Ray Tune trainable (its mixins);
- ``tune_callbacks``: Ray Tune callbacks of ``RunConfig(callbacks=...)`` and :class:`TrialView`;
- ``callback``: Ray Train 2.x's :class:`UserCallback` of ``RunConfig(callbacks=...)`` and its
  :class:`TrainRunContext`;
- ``preprocessing``: fitting the trainer's Ray Data preprocessor;
- ``saved``: what ``air_trainer.json`` may name, for ``restore()``.

The public classes keep ``sgd.air`` as their ``__module__`` (pickles and run directories name them so).
"""

from sgd.air.callback import TrainRunContext, UserCallback
from sgd.air.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from sgd.air.config_fields import LoggingConfig
from sgd.air.data_parallel import DataParallelTrainer
from sgd.air.data_parallel import DiscardReturn as DiscardReturn
from sgd.air.result import RAY_RESULT_FIELDS as RAY_RESULT_FIELDS
from sgd.air.result import Result
from sgd.air.tune_callbacks import TrialView as TrialView
from sgd.air.tune_callbacks import TuneCallbacks as TuneCallbacks
from sgd.air.tune_callbacks import is_tune_callback as is_tune_callback

__all__ = ["ScalingConfig", "RunConfig", "CheckpointConfig", "FailureConfig", "LoggingConfig", "Result",
           "DataParallelTrainer", "TrainRunContext", "UserCallback"]
