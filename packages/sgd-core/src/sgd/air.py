"""AIR-style trainers (the API of later Ray Train): ``TorchTrainer(...).fit() -> Result``.

A thin layer over :class:`sgd.Trainer`: ``fit()`` builds a trainer from the configs,
runs ``train_loop_per_worker`` through the same executor (same fault tolerance,
checkpoints, run directory) and turns the run directory into a :class:`Result`.

Framework packages subclass :class:`DataParallelTrainer` with their backend config
(``sgd_torch.TorchTrainer``, ``sgd_tensorflow.TensorflowTrainer``,
``sgd_horovod.HorovodTrainer``).
"""

from __future__ import annotations

import datetime
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

from sgd._common.protocol import detailed_metrics_enabled, strip_detailed
from sgd._internal import saved_trainer
from sgd.backend import BackendConfig
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import Checkpoint, CheckpointStrategy
from sgd.checkpoint.storage import is_uri
from sgd.data import DatasetConfig
from sgd.plugins import get_plugin_manager
from sgd.runs import checkpoints, read_settings, result_rows, run_status
from sgd.trainer import Trainer
from sgd.utils import resolve_num_workers, resolve_resources, results_root, wrap_train_func
from sgd.worker_group import PLACEMENT_STRATEGIES

logger = logging.getLogger("sgd")

__all__ = ["ScalingConfig", "RunConfig", "CheckpointConfig", "FailureConfig", "Result", "DataParallelTrainer"]

#: The pickled trainer a run directory keeps, so ``restore(path)`` needs no arguments.


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


@dataclass
class Result:
    """What ``fit()`` returns, also when training failed (then ``error`` is set).

    :ivar metrics: the last report of rank 0 (``None`` if there was none), with Ray Train's
        result fields added: ``training_iteration``, ``time_this_iter_s``, ``time_total_s``,
        ``timestamp``, ``date``, ``hostname``, ``node_ip``, ``pid`` (of rank 0's process),
        ``config`` (the run's config), ``done`` (``True`` when the run finished without error)
        and ``trial_id`` (the Ray Tune trial's id, else the run directory's name).
    :ivar checkpoint: the latest persisted checkpoint, or ``None``.
    :ivar best_checkpoints: ``(checkpoint, metrics)`` for every kept checkpoint in Ray's order:
        ascending by the ``CheckpointConfig`` score (the worst first, the best last; NaN or a
        missing score ranks worst); without a score attribute, by recency (oldest first).
    :ivar error: the exception that ended training (the worker's own type), or ``None``.
    :ivar path: the run directory (``<storage>/<name>/run_NNN``).
    """

    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional[Checkpoint]
    error: Optional[BaseException] = None
    path: Optional[str] = None
    best_checkpoints: List[Tuple[Checkpoint, Dict[str, Any]]] = field(default_factory=list)
    _rows: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        """One row per report of rank 0, as a ``pandas.DataFrame`` (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Result.metrics_dataframe needs pandas: pip install pandas") from exc
        return pd.DataFrame(self._rows)

    @classmethod
    def from_path(cls, path: Union[str, os.PathLike], error: Optional[BaseException] = None,
                  checkpoint_cls: Type[Checkpoint] = Checkpoint) -> Result:
        """The result of the run in ``path`` (a run directory), read from disk.

        :param checkpoint_cls: the class of ``checkpoint`` and ``best_checkpoints``
            (``sgd_torch.TorchCheckpoint`` for a ``TorchTrainer``'s result).
        """
        run = Path(path).expanduser().resolve()
        if not run.is_dir():
            raise FileNotFoundError(f"no run directory at {run}")

        rows = [r[0] for r in result_rows(run)]
        _add_ray_fields(run, rows, finished=error is None)
        by_iteration = {r.get("_training_iteration"): r for r in rows}
        kept = []
        found = checkpoints(run)
        for c in found:
            # sgd.save_checkpoint stores no metrics: the report it followed stands in.
            metrics = c["metrics"] if c["metrics"] is not None else by_iteration.get(c["iteration"], {})
            kept.append((checkpoint_cls.from_directory(c["path"]), metrics))
        latest = kept[-1][0] if kept else None
        # Ray's order: ascending by score (worst first, the best last; by recency: oldest first).
        ranked = sorted(zip(found, kept), key=lambda fk: (
            fk[0]["score"] if isinstance(fk[0]["score"], (int, float)) else -math.inf,
            fk[0]["id"] if isinstance(fk[0]["id"], int) else -1))
        return cls(
            metrics=rows[-1] if rows else None,
            checkpoint=latest,
            error=error,
            path=str(run),
            best_checkpoints=[k for _, k in ranked],
            _rows=rows,
        )

    def __repr__(self) -> str:
        return (f"Result(metrics={self.metrics!r}, checkpoint={self.checkpoint!r}, "
                f"error={self.error!r}, path={self.path!r})")


#: Ray Train's result field → the autofilled sgd key it is read from.
RAY_RESULT_FIELDS = {
    "training_iteration": "_training_iteration",
    "time_this_iter_s": "_time_this_iter_s",
    "time_total_s": "_time_total_s",
    "timestamp": "_timestamp",
    "date": "_date",
    "hostname": "_hostname",
    "node_ip": "_node_ip",
    "pid": "_pid",
}


def _add_ray_fields(run: Path, rows: List[Dict[str, Any]], finished: bool) -> None:
    """Give each of rank 0's rows Ray Train's result fields (see :attr:`Result.metrics`), in place."""

    try:
        settings = read_settings(run)
    except (OSError, ValueError):
        settings = {}
    config = settings.get("run_config") or {}
    trial_id = settings.get("trial_id") or run.name
    done = finished and run_status(run) == "FINISHED"
    detailed = detailed_metrics_enabled()
    for i, row in enumerate(rows):
        for ray_key, key in RAY_RESULT_FIELDS.items():
            if key in row:
                row.setdefault(ray_key, row[key])
        if not detailed:
            strip_detailed([row])
        row.setdefault("done", done and i == len(rows) - 1)
        row.setdefault("trial_id", trial_id)
    if rows:
        rows[-1].setdefault("config", config)


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` workers; ``fit()`` → :class:`Result`.

    :param train_loop_per_worker: the training function: no argument, or one (the config).
    :param train_loop_config: passed to ``train_loop_per_worker``.
    :param backend_config: the framework backend (default: none, plain processes).
    :param scaling_config: :class:`ScalingConfig`.
    :param run_config: :class:`RunConfig`.
    :param datasets: Ray Datasets by name; ``sgd.get_dataset_shard(name)`` in the loop.
    :param dataset_config: :class:`sgd.DatasetConfig` by dataset name (split or whole, shuffle).
    :param resume_from_checkpoint: an :class:`sgd.Checkpoint` (or path) the loop starts from
        (``sgd.get_checkpoint()``).
    :param preprocessor: a Ray Data preprocessor (``ray.data.preprocessors``), as in Ray AIR:
        fitted on the ``"train"`` dataset (unless already fitted), applied to every dataset
        before it reaches the workers, and kept in every checkpoint of the run
        (``checkpoint.get_preprocessor()``).
    :param metadata: accepted for Ray Train compatibility, kept as ``self.metadata``.

    Datasets follow Ray AIR's rules: ``"train"`` is split among the workers, every other
    dataset goes whole to every worker; ``dataset_config`` overrides that per dataset
    (:class:`sgd.DatasetConfig`, AIR's fields included). The loop's return value is
    discarded, as in Ray AIR (``sgd.Trainer.run`` returns it).
    """

    _default_backend_config: Callable[[], BackendConfig] = BackendConfig
    #: The class of ``Result.checkpoint`` (framework trainers set their own: ``TorchCheckpoint``).
    _checkpoint_cls: Type[Checkpoint] = Checkpoint
    #: The trainer's dataset rules (Ray AIR's ``_dataset_config``): by name, ``"*"`` for the others.
    _dataset_config: Dict[str, DatasetConfig] = {
        "train": DatasetConfig(split=True, fit=True, transform=True),
        "*": DatasetConfig(split=False, fit=False, transform=True),
    }

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[Dict[str, Any]] = None,
        backend_config: Optional[BackendConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        resume_from_checkpoint: Any = None,
        preprocessor: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
    ):

        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, got {type(train_loop_per_worker).__name__}")
        wrap_train_func(train_loop_per_worker, train_loop_config)  # checks the signature now
        _check_type("train_loop_config", train_loop_config, dict)
        _check_type("backend_config", backend_config, BackendConfig)
        _check_type("scaling_config", scaling_config, ScalingConfig)
        _check_type("run_config", run_config, RunConfig)
        _check_type("datasets", datasets, dict)
        resume = resume_from_checkpoint
        if resume is not None and not isinstance(resume, (Checkpoint, str, os.PathLike)):
            raise TypeError("resume_from_checkpoint must be an sgd.Checkpoint or a path, "
                            f"got {type(resume_from_checkpoint).__name__}")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = dict(train_loop_config or {})
        self.backend_config = backend_config if backend_config is not None else type(self)._default_backend_config()
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.datasets = datasets
        self.dataset_config = dataset_config
        if preprocessor is not None and not _is_preprocessor(preprocessor):
            raise TypeError("preprocessor must be a ray.data.preprocessor.Preprocessor, "
                            f"got {type(preprocessor).__name__}")
        if dataset_config is not None:
            _check_type("dataset_config", dataset_config, dict)
            bad = [k for k, v in dataset_config.items() if not isinstance(v, DatasetConfig)]
            if bad:
                raise TypeError(f"dataset_config values must be sgd.DatasetConfig (wrong for {bad})")
        self.resume_from_checkpoint = resume_from_checkpoint
        self.preprocessor = preprocessor
        self.metadata = dict(metadata or {})
        self._restore_run_dir: Optional[Path] = None

    @property
    def _train_loop_config(self) -> Dict[str, Any]:
        # Ray AIR's attribute name (its tests read it).
        return self.train_loop_config

    def apply_param_space(self, space: Dict[str, Any]) -> Dict[str, Any]:
        """Take the keys of a Tune trial's sampled ``param_space`` that are this trainer's own
        arguments; return the keys left.

        sgd-tune calls it on each trial's copy of the trainer, after it applied
        ``train_loop_config`` and the arguments every trainer has (``scaling_config``,
        ``run_config``, ``datasets``, ``resume_from_checkpoint``); a key still left is an error
        naming it. The base class takes none. A framework trainer overrides it for arguments of
        its own, as Ray Train's trainers did (``XGBoostTrainer`` merges ``param_space["params"]``
        into its boosting parameters).

        :param space: the trial's values not taken yet, by key (not to be mutated).
        :returns: the keys of ``space`` this trainer did not take, with their values.
        """
        return dict(space)

    # --- running ----------------------------------------------------------------------

    def _experiment_dir(self) -> Tuple[Path, Optional[str]]:
        """The local folder runs go to, and the storage URI checkpoints are mirrored to."""

        name = self.run_config.name or (
            f"{type(self).__name__}_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}")
        storage = self.run_config.storage_path
        if storage is None:
            return results_root() / name, None
        if is_uri(str(storage)):
            return results_root() / name, str(storage)
        return Path(storage).expanduser().resolve() / name, None

    @property
    def resuming_run_dir(self) -> Optional[Path]:
        """The run directory a trainer made by :meth:`restore` continues, else ``None``."""
        return self._restore_run_dir

    def make_trainer(self) -> Trainer:
        """The :class:`sgd.Trainer` that :meth:`fit` runs, not started: the scaling, run and
        failure configs applied (for a restored trainer, one that continues its run directory).
        sgd-tune runs each trial on one."""
        sc = self.scaling_config
        failure_config = self.run_config.failure_config or FailureConfig()
        failures = failure_config.max_failures
        if self._restore_run_dir is not None:
            trainer = Trainer.restore(self._restore_run_dir, backend=self.backend_config,
                                      trusted=self.__dict__.get("_restore_trusted"))
            trainer.max_retries = failures
            if failure_config.placement_timeout_s is not None:
                trainer.placement_timeout_s = float(failure_config.placement_timeout_s)
            if failure_config.hang_timeout_s is not None:
                trainer.hang_timeout_s = float(failure_config.hang_timeout_s)
            return trainer
        logdir, mirror = self._experiment_dir()
        return Trainer(
            backend=self.backend_config,
            num_workers=sc.num_workers,
            use_gpu=sc.use_gpu,
            resources_per_worker=sc.resources_per_worker,
            logdir=logdir,
            max_retries=failures,
            storage_path=mirror,
            placement_strategy=sc.placement_strategy,
            placement_timeout_s=failure_config.placement_timeout_s,
            hang_timeout_s=failure_config.hang_timeout_s,
        )

    def fit(self) -> Result:
        """Train; the :class:`Result`, whose ``error`` is set if training failed (never raises for it).

        :raises ValueError: a setting this trainer cannot honour (``CheckpointConfig(checkpoint_frequency=...)``),
            before anything runs.
        """
        self.check_settings()
        trainer = self.make_trainer()
        error: Optional[BaseException] = None
        previous_progress = os.environ.get("SGD_PROGRESS")
        if self.run_config.verbose == 0:
            os.environ["SGD_PROGRESS"] = "0"
        tune_callbacks = TuneCallbacks(self.run_config.callbacks, self.train_loop_config)
        try:
            # Before the workers start: fitting the preprocessor runs Ray Data tasks, which need
            # CPUs the workers may take all of.
            prepared = self.preprocess_datasets()
            trainer.start()
            try:
                iterator = self.run_on(trainer, callbacks=[tune_callbacks], prepared=prepared)
                self._save_for_restore(trainer.latest_run_dir)
                for _ in iterator:
                    pass
            finally:
                trainer.shutdown()
        except Exception as exc:  # a training error is the result's, not the caller's
            error = exc
            logger.error("training failed: %s: %s", type(exc).__name__, exc)
        finally:
            if self.run_config.verbose == 0:
                if previous_progress is None:
                    os.environ.pop("SGD_PROGRESS", None)
                else:
                    os.environ["SGD_PROGRESS"] = previous_progress
            tune_callbacks.end(error)
        run_dir = trainer.latest_run_dir
        if run_dir is None:
            return Result(metrics=None, checkpoint=None, error=error, path=None)
        return Result.from_path(run_dir, error=error, checkpoint_cls=self._checkpoint_cls)

    def check_settings(self) -> None:
        """Raise ``ValueError`` for settings this trainer cannot honour (called by ``fit()``)."""
        (self.run_config.checkpoint_config or CheckpointConfig()).check_for_loop_trainer(type(self).__name__)

    def dataset_configs(self) -> Dict[str, DatasetConfig]:
        """The config of every dataset passed, Ray AIR's way: the trainer's rules
        (:attr:`_dataset_config`) with the user's ``dataset_config`` merged in, resolved.

        :raises ValueError: a dataset marked ``required`` is missing, or more than one is to be fitted.
        """
        rules = type(self)._dataset_config
        user = dict(self.dataset_config or {})
        datasets = self.datasets or {}
        for name, config in user.items():
            if config.required and name not in datasets and name not in ("*", "default"):
                raise ValueError(f"dataset {name!r} is required (DatasetConfig(required=True)) and was not passed; "
                                 f"passed: {', '.join(map(str, datasets)) or 'none'}")
        resolved = {}
        for name in datasets:
            base = rules.get(name, rules.get("*", DatasetConfig()))
            for key in ("*", "default", name):
                if key in user:
                    base = user[key].merged(base)
            resolved[name] = base.resolved(split=True)
        fitted = [n for n, c in resolved.items() if c.fit]
        if self.preprocessor is not None and len(fitted) > 1:
            raise ValueError(f"the preprocessor can be fitted on one dataset; DatasetConfig(fit=True) is set for "
                             f"{', '.join(fitted)}")
        return resolved

    def preprocess_datasets(self) -> Tuple[Optional[Dict[str, Any]], Dict[str, DatasetConfig]]:
        """The datasets as the workers get them (the preprocessor fitted and applied) and their configs."""
        configs = self.dataset_configs()
        if self.datasets is None:
            return None, configs
        datasets = dict(self.datasets)
        p = self.preprocessor
        if p is None:
            return datasets, configs
        fit_on = [n for n, c in configs.items() if c.fit]
        if fit_on and _needs_fit(p):
            _fit(p, fit_on[0], datasets[fit_on[0]])
        for name, ds in datasets.items():
            if configs[name].transform is not False and hasattr(ds, "map_batches"):
                datasets[name] = p.transform(ds)
        return datasets, configs

    def run_on(self, trainer: Trainer, callbacks: Optional[Sequence[Any]] = None,
               prepared: Optional[Tuple[Optional[Dict[str, Any]], Dict[str, DatasetConfig]]] = None) -> Any:
        """Start this trainer's loop on ``trainer`` (an :class:`sgd.Trainer` made by
        :meth:`make_trainer`, started); the :class:`sgd.TrainingIterator`. ``fit()`` and
        sgd-tune's trials run it. The datasets are preprocessed first (unless ``prepared``, what
        :meth:`preprocess_datasets` returned, is given); the loop's return value is discarded."""
        datasets, configs = prepared if prepared is not None else self.preprocess_datasets()
        checkpoint_config = self.run_config.checkpoint_config or CheckpointConfig()
        own = [c for c in (self.run_config.callbacks or []) if isinstance(c, TrainingCallback)]
        return trainer.run_iterator(
            DiscardReturn(self.train_loop_per_worker),
            config=self.train_loop_config,
            dataset=datasets,
            checkpoint=self.resume_from_checkpoint,  # a restored run's own latest wins
            checkpoint_strategy=checkpoint_config.to_strategy(),
            callbacks=[*own, *(callbacks or [])],
            dataset_config=configs or None,
            preprocessor=self.preprocessor,
        )

    # --- restore ----------------------------------------------------------------------

    def _save_for_restore(self, run_dir: Optional[Path]) -> None:
        """Keep this trainer (without its datasets) in the run directory for :meth:`restore`:
        its settings as JSON, what JSON cannot hold (the training function) pickled apart."""
        if run_dir is None:
            return
        state = saved_trainer.state_of(self, ("datasets", "_restore_run_dir", "_restore_trusted"))
        saved_trainer.save(run_dir, type(self), state, _SAVED_CONFIGS, _backend_name)

    @classmethod
    def can_restore(cls, path: Union[str, os.PathLike]) -> bool:
        """Whether ``path`` is a run directory this trainer can continue."""
        run = Path(path).expanduser()
        return (run / "trainer.json").exists() and saved_trainer.exists(run)

    @classmethod
    def restore(cls, path: Union[str, os.PathLike], train_loop_per_worker: Optional[Callable[..., Any]] = None,
                train_loop_config: Optional[Dict[str, Any]] = None, datasets: Optional[Dict[str, Any]] = None,
                trusted: Optional[bool] = None, **overrides: Any) -> DataParallelTrainer:
        """A trainer that continues the run in ``path`` (``result.path``), e.g. after its driver died.

        ``fit()`` goes on in the same run directory from its latest checkpoint; reports
        already in it are not repeated. Datasets are not saved with the run: pass them
        again. Other arguments (``run_config=``...) replace the saved ones.

        The trainer's settings are kept as JSON in the run directory; the training function
        (and anything else JSON cannot hold, such as callbacks) only pickled, and unpickling
        runs whatever code the file names. So pass the training function again
        (``restore(path, train_loop_per_worker=train_func)``), or ``trusted=True`` if you wrote
        the run directory yourself; without either, :class:`sgd.UntrustedCheckpointError` names
        what is missing. ``trusted=True`` also lets the run's checkpoints unpickle arbitrary
        objects (see :class:`sgd.Checkpoint`). The run goes on from its newest checkpoint that
        verifies.

        :raises FileNotFoundError: ``path`` is not a run directory ``fit()`` wrote.
        :raises TypeError: an argument that is not one of the trainer's, or the run was written
            by another trainer class.
        """
        from sgd.checkpoint.codecs import resolve_trusted

        run = Path(path).expanduser().resolve()
        if not (run / "trainer.json").exists():
            raise FileNotFoundError(f"{run} is not an sgd run directory (no trainer.json); pass result.path")
        if not saved_trainer.exists(run):
            raise FileNotFoundError(f"{run} has no {saved_trainer.STATE_FILE}; it was not started by "
                                    f"{cls.__name__}.fit() (or by a version of sgd before 2026-11-26)")
        saved = saved_trainer.SavedTrainer(run)
        saved_cls: Any = saved.saved_class(
            [*_subclasses(cls), *(c for c in cls.__mro__ if issubclass(c, DataParallelTrainer))])
        given = dict(overrides)
        for name, value in (("train_loop_per_worker", train_loop_per_worker),
                            ("train_loop_config", train_loop_config)):
            if value is not None:
                given[name] = value
        for key in overrides:
            if key not in saved.keys:
                raise TypeError(f"{cls.__name__}.restore() got an unexpected argument {key!r}")
        state = saved.load([*given, "datasets"], resolve_trusted(trusted), _SAVED_CONFIGS, _backend_config,
                           cls.__name__)
        trainer = saved_cls.__new__(saved_cls)
        trainer.__dict__.update(state)
        for key, value in given.items():
            setattr(trainer, key, dict(value) if key == "train_loop_config" else value)
        trainer.datasets = datasets
        trainer._restore_run_dir = run
        trainer._restore_trusted = trusted
        return trainer

    # --- Ray Tune -------------------------------------------------------------------

    def as_trainable(self) -> Any:
        """A Ray Tune function trainable running this trainer per trial (needs ``sgd-tune``).

        ``param_space={"train_loop_config": {...}}`` values are merged into
        ``train_loop_config``. ``tune.Tuner(trainer, ...)`` works too: the trainer is callable.
        """

        trainable = get_plugin_manager().hook.sgd_tune_trainable(trainer=self, train_func=None, dataset=None)
        if trainable is None:
            raise ImportError(f"{type(self).__name__}.as_trainable needs the sgd-tune package: pip install sgd-tune")
        return trainable

    def __call__(self, config: Dict[str, Any]) -> Any:
        """Run as a Ray Tune function trainable (``tune.Tuner(trainer, param_space=...)``)."""
        return self.as_trainable()(config)

    @property
    def _resources(self) -> Any:
        # What Ray Tune reads off a function trainable to reserve resources for a trial.
        return getattr(self.as_trainable(), "_resources", None)

    @property
    def __mixins__(self) -> tuple:
        """Classes Ray Tune mixes into the trainable it makes of this trainer (sgd-tune's keeps
        the workers between trials when Tune reuses the actor, and shuts them down after)."""
        return tuple(getattr(self.as_trainable(), "__mixins__", ()))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend_config.name!r}, "
                f"scaling_config={self.scaling_config!r})")


class DiscardReturn:
    """The training loop as an AIR trainer runs it: its return value discarded (Ray AIR's rule),
    so a loop that returns something that does not pickle (a model) does not fail the run."""

    def __init__(self, loop: Callable[..., Any]):
        self.loop = loop

    def __call__(self, config: Dict[str, Any]) -> None:
        wrap_train_func(self.loop, config)()


def _is_preprocessor(value: Any) -> bool:
    return any(f"{c.__module__}.{c.__name__}" == "ray.data.preprocessor.Preprocessor" for c in type(value).__mro__)


def _needs_fit(p: Any) -> bool:
    try:
        status = p.fit_status()
    except AttributeError:
        return True
    return getattr(status, "name", str(status)) not in ("FITTED", "NOT_FITTABLE")


def _fit(p: Any, name: str, ds: Any) -> None:
    """Fit ``p`` on dataset ``name``; a failure names the dataset and the columns."""
    try:
        p.fit(ds)
    except Exception as exc:
        try:
            columns = list(ds.schema().names)
        except Exception:
            columns = []
        wanted = [c for c in (getattr(p, "columns", None) or []) if c not in columns] if columns else []
        missing = f"; columns it needs that dataset {name!r} lacks: {', '.join(map(str, wanted))}" if wanted else ""
        raise ValueError(
            f"the preprocessor {type(p).__name__} failed to fit on dataset {name!r} (columns: "
            f"{', '.join(map(str, columns)) or 'unknown'}){missing}: {type(exc).__name__}: {exc}") from exc


def is_tune_callback(value: Any) -> bool:
    """Whether ``value`` is a Ray Tune ``Callback`` (without importing Ray Tune)."""
    return any(f"{c.__module__}.{c.__name__}" == "ray.tune.callback.Callback" for c in type(value).__mro__)


class TrialView:
    """What the Ray Tune callbacks in ``RunConfig(callbacks=...)`` get as ``trial`` when
    ``fit()`` runs without Tune: the run's id, name, config, directory and last result."""

    def __init__(self, config: Dict[str, Any]):
        self.trial_id = ""
        self.trial_name = ""
        self.config = config
        self.local_path: Optional[str] = None
        self.last_result: Dict[str, Any] = {}
        self.status = "PENDING"

    @property
    def logdir(self) -> Optional[str]:
        return self.local_path

    def __str__(self) -> str:
        return self.trial_name

    def __repr__(self) -> str:
        return f"TrialView({self.trial_name!r}, status={self.status})"


class TuneCallbacks(TrainingCallback):
    """Calls the Ray Tune callbacks of a ``RunConfig`` as a Tune run of one trial would."""

    def __init__(self, callbacks: Optional[Sequence[Any]], config: Dict[str, Any]):
        self.callbacks = [c for c in (callbacks or []) if is_tune_callback(c)]
        self.trial = TrialView(config)
        self.iteration = 0
        self.started = False

    def _call(self, hook: str, **kwargs: Any) -> None:
        for c in self.callbacks:
            getattr(c, hook)(iteration=self.iteration, trials=[self.trial], **kwargs)

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        run_dir = Path(info.get("run_dir") or logdir)
        self.trial.trial_id = self.trial.trial_name = run_dir.name
        self.trial.local_path = str(run_dir)
        self.trial.status = "RUNNING"
        self.started = True
        for c in self.callbacks:
            c.setup(num_samples=1, total_num_samples=1)
        self._call("on_trial_start", trial=self.trial)

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        self.iteration += 1
        result = dict(results[0])
        for ray_key, key in RAY_RESULT_FIELDS.items():
            if key in result:
                result.setdefault(ray_key, result[key])
        result.setdefault("trial_id", self.trial.trial_id)
        self.trial.last_result = result
        self._call("on_trial_result", trial=self.trial, result=result)

    def end(self, error: Optional[BaseException]) -> None:
        if not self.callbacks:
            return
        if self.started:
            self.trial.status = "ERROR" if error is not None else "TERMINATED"
            if error is not None:
                self._call("on_trial_error", trial=self.trial)
            else:
                self._call("on_trial_complete", trial=self.trial)
        for c in self.callbacks:
            c.on_experiment_end(trials=[self.trial])


def _check_type(name: str, value: Any, expected: type) -> None:
    if value is not None and not isinstance(value, expected):
        raise TypeError(f"{name} must be a {expected.__name__} (or None), got {type(value).__name__}")


def _subclasses(cls: type) -> List[type]:
    found: List[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _backend_name(config: Any) -> Optional[str]:
    """The name ``config``'s class is registered under as a backend, else ``None``."""
    from sgd.plugins import available_backends

    if not isinstance(config, BackendConfig):
        return None
    for name, spec in available_backends().items():
        if spec.config_cls is type(config):
            return name
    return None


def _backend_config(name: str, fields: Dict[str, Any]) -> BackendConfig:
    from sgd.plugins import resolve_backend

    return resolve_backend(name).config_cls(**fields)


#: The config classes air_trainer.json may hold (by module and name; nothing else is built from it).
_SAVED_CONFIGS: Tuple[type, ...] = (
    ScalingConfig, RunConfig, CheckpointConfig, FailureConfig, DatasetConfig, CheckpointStrategy, BackendConfig)
