"""The configs of an AIR-style trainer: how many workers (:class:`ScalingConfig`), where and how a
run is kept (:class:`RunConfig`), which checkpoints stay (:class:`CheckpointConfig`) and how many
failures are recovered from (:class:`FailureConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from sgd._common.public import public_module
from sgd.air.tune_callbacks import is_tune_callback
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import CheckpointStrategy
from sgd.utils import resolve_num_workers, resolve_resources
from sgd.worker_group import PLACEMENT_STRATEGIES


@public_module("sgd.air")
@dataclass
class ScalingConfig:
    """How many workers and what each gets.

    :param num_workers: a positive int, or ``(min, max)`` for elastic training.
    :param use_gpu: one GPU per worker unless ``resources_per_worker`` says otherwise.
    :param resources_per_worker: Ray resources per worker (``{"CPU": 2, "custom": 1}``).
    :param placement_strategy: ``"PACK"`` (default), ``"SPREAD"``, ``"STRICT_PACK"``, ``"STRICT_SPREAD"``.
    :param trainer_resources: accepted for Ray Train compatibility; sgd's driver is the
        calling process, so it reserves nothing (under Tune the trial asks one CPU for it).
    """

    num_workers: Union[int, Tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    trainer_resources: Optional[Dict[str, float]] = None

    def __post_init__(self) -> None:

        resolve_num_workers(self.num_workers)
        resolve_resources(self.use_gpu, self.resources_per_worker)
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {self.placement_strategy!r}")


@public_module("sgd.air")
@dataclass
class CheckpointConfig:
    """Which checkpoints to keep.

    :param num_to_keep: ``None`` keeps all; ``K`` keeps the K best (and the latest).
    :param checkpoint_score_attribute: a metric reported with the checkpoint
        (``sgd.report(metrics, checkpoint=...)``); ``None`` ranks by recency.
    :param checkpoint_score_order: ``"max"`` or ``"min"``.
    :param checkpoint_frequency: Ray AIR's field for trainers that run a training loop of their
        own and checkpoint it themselves (sgd-xgboost's ``XGBoostTrainer(params=...)``): a
        checkpoint every this many iterations; ``0`` (the default): none along the way. A
        :class:`DataParallelTrainer` (whose loop reports its own checkpoints) refuses a value other
        than ``0`` at ``fit()`` with ``ValueError``, as Ray's did.
    :param checkpoint_at_end: for the same trainers: a checkpoint after the last iteration
        (``None``: the trainer's default, which is yes); ``True`` is refused at ``fit()`` by a
        trainer whose loop reports its own checkpoints.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int) or self.num_to_keep < 1):
            # 0 would keep no checkpoint to resume from: Ray Train refuses it too.
            raise ValueError(f"num_to_keep must be None or an int >= 1, got {self.num_to_keep!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"checkpoint_score_order must be 'max' or 'min', got {self.checkpoint_score_order!r}")
        f = self.checkpoint_frequency
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ValueError(f"checkpoint_frequency must be an int >= 0 (0: no periodic checkpoints), got {f!r}")
        if self.checkpoint_at_end not in (None, True, False):
            raise ValueError(f"checkpoint_at_end must be None, True or False, got {self.checkpoint_at_end!r}")
        self.to_strategy()

    def check_for_loop_trainer(self, trainer_name: str) -> None:
        """Raise ``ValueError`` for the fields a trainer whose loop reports its own checkpoints cannot honour."""
        for name, value in (("checkpoint_frequency", self.checkpoint_frequency),
                            ("checkpoint_at_end", self.checkpoint_at_end)):
            if value:
                raise ValueError(
                    f"{trainer_name} does not support CheckpointConfig({name}={value!r}): its training loop "
                    "saves checkpoints itself, with sgd.report(metrics, checkpoint=...). Drop the argument.")

    def to_strategy(self) -> CheckpointStrategy:
        if self.checkpoint_score_attribute is None:
            return CheckpointStrategy(self.num_to_keep, "_training_iteration", "max")
        return CheckpointStrategy(self.num_to_keep, self.checkpoint_score_attribute, self.checkpoint_score_order)


@public_module("sgd.air")
@dataclass
class FailureConfig:
    """:param max_failures: worker-group failures to recover from; ``-1`` is unlimited.
    :param placement_timeout_s: how long a (re)start waits for room for the workers (after a
        host is lost: for it or another to come back) before it fails; ``None``: 120 s
        (``SGD_PLACEMENT_TIMEOUT_S``). See :class:`sgd.Trainer`.
    :param hang_timeout_s: no worker sent anything for this long: log every worker's stack and
        the stragglers, and fail the run (retried as a worker failure). ``None``:
        ``SGD_HANG_TIMEOUT_S`` (unset: never). See :class:`sgd.Trainer`.
    """

    max_failures: int = 0
    placement_timeout_s: Optional[float] = None
    hang_timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_failures, int) or isinstance(self.max_failures, bool) or self.max_failures < -1:
            raise ValueError(f"max_failures must be an int >= -1 (-1: unlimited), got {self.max_failures!r}")
        t = self.placement_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0):
            raise ValueError(f"placement_timeout_s must be a number of seconds >= 0 or None, got {t!r}")
        h = self.hang_timeout_s
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not h > 0):
            raise ValueError(f"hang_timeout_s must be a number of seconds > 0 or None, got {h!r}")


@public_module("sgd.air")
@dataclass
class RunConfig:
    """Where and how a run is kept.

    :param name: the experiment folder's name (default ``<TrainerClass>_<timestamp>``).
    :param storage_path: a local folder (default: the results root, ``~/sgd_results`` or
        ``SGD_RESULTS_DIR``) or a storage URI (``s3://…``, any ``pyarrow.fs``/fsspec URI);
        with a URI, the run is written locally under the results root and every kept
        checkpoint is copied to ``<storage_path>/<name>/run_NNN/checkpoints/``.
    :param callbacks: :class:`sgd.TrainingCallback` objects (``sgd_loggers`` has loggers), and
        Ray Tune ``Callback`` objects, as AIR passed them to the Tune run behind ``fit()``: their
        ``on_trial_start``, ``on_trial_result`` (rank 0's report, one per round),
        ``on_trial_complete`` / ``on_trial_error`` and ``on_experiment_end`` are called with a
        :class:`TrialView` standing for the run.
    :param local_dir: Ray AIR 2.0-2.4's name of ``storage_path``.
    :param checkpoint_config: :class:`CheckpointConfig`.
    :param failure_config: :class:`FailureConfig`.
    :param verbose: ``0`` turns sgd's live progress line off; otherwise sgd's default.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    callbacks: Optional[Sequence[Any]] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    failure_config: Optional[FailureConfig] = None
    verbose: Optional[int] = None
    local_dir: Optional[str] = None

    def __post_init__(self) -> None:
        if self.local_dir is not None:  # Ray 2.0-2.4's name of storage_path
            if self.storage_path is not None and self.storage_path != self.local_dir:
                raise ValueError("RunConfig got both storage_path and local_dir (its older name); pass one")
            self.storage_path, self.local_dir = self.local_dir, None
        if self.callbacks is not None:
            bad = [type(c).__name__ for c in self.callbacks
                   if not isinstance(c, TrainingCallback) and not is_tune_callback(c)]
            if bad:
                raise TypeError(f"RunConfig(callbacks=...) takes sgd.TrainingCallback or ray.tune.Callback objects, "
                                f"got {', '.join(bad)}")
        if self.name is not None and (not self.name or "/" in self.name or self.name in (".", "..")):
            raise ValueError(f"RunConfig(name=...) must be a plain folder name, got {self.name!r}")
