"""``DataParallelTrainer``: an AIR-style trainer, ``fit() -> Result``, over :class:`sgd.Trainer`.

``fit()`` builds a trainer from the configs, runs ``train_loop_per_worker`` through the same run
engine (same fault tolerance, checkpoints, run directory) and turns the run directory into a
:class:`sgd.Result`. It keeps itself in the run directory, so that ``restore(path)`` can go on.
How it prepares its datasets and starts its loop, and how Ray Tune runs it, is :mod:`sgd.air.loop_run`
(mixins of the trainer).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Type, Union

from sgd._common.public import public_module
from sgd.air.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from sgd.air.config_fields import check_ray_settings
from sgd.air.loop_run import _LoopRun, _TuneTrainable
from sgd.air.outcome import first_return, training_failed
from sgd.air.preprocessing import is_preprocessor
from sgd.air.result import Result
from sgd.air.run_folder import run_folder
from sgd.air.saved import SAVED_CONFIGS, backend_name, config_of_backend, subclasses
from sgd.air.tune_callbacks import TuneCallbacks
from sgd.backend import BackendConfig
from sgd.checkpoint import Checkpoint
from sgd.data import DataConfig, DatasetConfig
from sgd.report_config import ValidationConfig
from sgd.runs import find_run
from sgd.storage import saved_trainer
from sgd.storage.errors import RunNotFoundError
from sgd.storage.lock import check_free
from sgd.trainer import Trainer
from sgd.utils import wrap_train_func

logger = logging.getLogger("sgd")


@public_module("sgd.air")
class DataParallelTrainer(_LoopRun, _TuneTrainable):
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` workers; ``fit()`` → :class:`Result`.

    :param train_loop_per_worker: the training function: no argument, or one (the config).
    :param train_loop_config: passed to ``train_loop_per_worker``.
    :param backend_config: the framework backend (default: none, plain processes).
    :param scaling_config: :class:`ScalingConfig`.
    :param run_config: :class:`RunConfig`.
    :param datasets: Ray Datasets by name; ``sgd.get_dataset_shard(name)`` in the loop.
    :param dataset_config: an :class:`sgd.DataConfig` (Ray Train 2.60: which datasets are split,
        Ray Data's execution options), or Ray AIR 2.x's dict of :class:`sgd.DatasetConfig` by
        dataset name (split or whole, shuffle, per dataset).
    :param resume_from_checkpoint: an :class:`sgd.Checkpoint` (or path) the loop starts from
        (``sgd.get_checkpoint()``).
    :param preprocessor: a Ray Data preprocessor (``ray.data.preprocessors``), as in Ray AIR:
        fitted on the ``"train"`` dataset (unless already fitted), applied to every dataset
        before it reaches the workers, and kept in every checkpoint of the run
        (``checkpoint.get_preprocessor()``).
    :param metadata: accepted for Ray Train compatibility, kept as ``self.metadata``.
    :param validation_config: an :class:`sgd.ValidationConfig` (Ray 2.60): how checkpoints
        reported with ``sgd.report(..., validation=True)`` are validated, asynchronously.

    Datasets follow Ray Train 2.60's rule: without ``dataset_config`` (or with
    ``DataConfig()``) **every** dataset is split among the workers;
    ``DataConfig(datasets_to_split=[...])`` splits only those and gives the others whole to every
    worker. A dict of :class:`sgd.DatasetConfig` keeps Ray AIR 2.x's rules: ``"train"`` split,
    every other dataset whole to every worker unless its ``DatasetConfig`` says otherwise.

    Rank 0's return value of the loop is ``Result.return_value`` when it pickles (Ray 2.60's;
    ``sgd.Trainer.run`` returns every rank's).
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
        dataset_config: Union[DataConfig, Dict[str, DatasetConfig], None] = None,
        resume_from_checkpoint: Any = None,
        preprocessor: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        validation_config: Optional[ValidationConfig] = None,
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
        if preprocessor is not None and not is_preprocessor(preprocessor):
            raise TypeError("preprocessor must be a ray.data.preprocessor.Preprocessor, "
                            f"got {type(preprocessor).__name__}")
        if dataset_config is not None and not isinstance(dataset_config, DataConfig):
            if not isinstance(dataset_config, dict):
                raise TypeError("dataset_config must be an sgd.DataConfig or a dict of sgd.DatasetConfig by dataset "
                                f"name (or None), got {type(dataset_config).__name__}")
            bad = [k for k, v in dataset_config.items() if not isinstance(v, DatasetConfig)]
            if bad:
                raise TypeError(f"dataset_config values must be sgd.DatasetConfig (wrong for {bad})")
        self.resume_from_checkpoint = resume_from_checkpoint
        self.preprocessor = preprocessor
        self.metadata = dict(metadata or {})
        self.validation_config = ValidationConfig.of(validation_config)
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

    def _experiment_dir(self, numbered_runs: bool = False) -> Tuple[Path, Optional[str]]:
        """The run's folder (``storage_path/name``; with ``numbered_runs`` the folder its
        ``run_NNN`` go into), and the storage URI checkpoints are mirrored to."""
        return run_folder(type(self).__name__, self.run_config, numbered_runs)

    @property
    def resuming_run_dir(self) -> Optional[Path]:
        """The run directory a trainer made by :meth:`restore` continues, else ``None``."""
        return self._restore_run_dir

    def make_trainer(self, numbered_runs: bool = False) -> Trainer:
        """The :class:`sgd.Trainer` that :meth:`fit` runs, not started: the scaling, run and
        failure configs applied (for a restored trainer, one that continues its run directory).
        sgd-tune runs each trial on one.

        Its runs go into ``storage_path/name`` itself (``Trainer(run_dir=...)``), where a run
        already there is resumed from its newest checkpoint that verifies (Ray 2.60's resume by
        name). ``numbered_runs=True``: each run in a new ``storage_path/name/run_NNN`` instead,
        never resuming (what sgd-tune's trials do: Tune decides what a trial resumes from).

        ``FailureConfig(max_failures)`` becomes its ``max_retries`` with
        ``retry_worker_errors=True``: an exception raised by the training function is retried
        from the latest checkpoint like a worker's death, as Ray 2.x does.

        :raises sgd.RunInUseError: another driver is running in the run's folder now.
        """
        sc = self.scaling_config
        check_ray_settings(sc, self.run_config)
        if self.run_config.logging_config is not None:
            logger.setLevel(self.run_config.logging_config.log_level)
        failure_config = self.run_config.failure_config or FailureConfig()
        failures = failure_config.max_failures
        if self._restore_run_dir is not None:
            check_free(self._restore_run_dir)
            trainer = Trainer.restore(self._restore_run_dir, backend=self.backend_config,
                                      trusted=self.__dict__.get("_restore_trusted"))
            trainer.max_retries = failures
            trainer.retry_worker_errors = True
            if failure_config.placement_timeout_s is not None:
                trainer.placement_timeout_s = float(failure_config.placement_timeout_s)
            if failure_config.hang_timeout_s is not None:
                trainer.hang_timeout_s = float(failure_config.hang_timeout_s)
            trainer.validation_config = self.__dict__.get("validation_config")
            return trainer
        folder, mirror = self._experiment_dir(numbered_runs)
        if not numbered_runs:
            check_free(folder)  # another driver in the run: say so before any worker starts
        trainer = Trainer(
            backend=self.backend_config,
            num_workers=sc.num_workers,
            use_gpu=sc.use_gpu,
            # accelerator_type / use_tpu add Ray resources to what each worker reserves
            resources_per_worker=sc.resources_per_worker_resolved if sc.accelerator_type or sc.use_tpu
            else sc.resources_per_worker,
            logdir=folder if numbered_runs else None,
            run_dir=None if numbered_runs else folder,
            max_retries=failures,
            storage_path=mirror,
            placement_strategy=sc.placement_strategy,
            placement_timeout_s=failure_config.placement_timeout_s,
            hang_timeout_s=failure_config.hang_timeout_s,
            retry_worker_errors=True,
        )
        trainer.validation_config = self.__dict__.get("validation_config")  # (restored trainers may lack it)
        return trainer

    def fit(self) -> Result:
        """Train; the :class:`Result` of the run (``return_value``: rank 0's return value of the
        training function, when it pickles).

        A failed run raises, as Ray 2.60's ``fit()`` does (and Ray AIR 2.x's did), with the run's
        :class:`Result` so far as the exception's ``.result`` (``path``, ``checkpoint``,
        ``best_checkpoints``, ``metrics``), so that nothing is lost. An exception of the training
        function (and a worker's death) is first retried from the latest checkpoint, up to
        ``FailureConfig(max_failures)`` times.

        :raises sgd.WorkerGroupError: the training function failed on a worker (raised, or its
            process died) past ``max_failures``; ``worker_failures`` holds the worker's exception by
            rank, and the exception is also an instance of the worker's exception's class.
        :raises sgd.ControllerError: the driver failed (a callback raised, the workers could not
            be placed in time, a preprocessor failed); also an instance of that error's class.
            Both are ``sgd.TrainingFailedError``.
        :raises ValueError: a setting this trainer cannot honour (``CheckpointConfig(checkpoint_frequency=...)``),
            before anything runs.
        """
        self.check_settings()
        trainer = self.make_trainer()
        error: Optional[BaseException] = None
        returns: Optional[list] = None
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
                returns = iterator.get_final_results()
            finally:
                trainer.shutdown()
        except Exception as exc:  # raised below, with the run's result attached
            error = exc
            logger.error("training failed: %s: %s", type(exc).__name__, exc)
        finally:
            if self.run_config.verbose == 0:
                if previous_progress is None:
                    os.environ.pop("SGD_PROGRESS", None)
                else:
                    os.environ["SGD_PROGRESS"] = previous_progress
            tune_callbacks.end(error)
        result = self._result(trainer.latest_run_dir, error)
        if error is not None:
            raise training_failed(error, result) from error
        result.return_value = first_return(returns)
        return result

    def _result(self, run_dir: Optional[Path], error: Optional[BaseException]) -> Result:
        """The run's :class:`Result`, read from its run directory (empty if it has none yet)."""
        if run_dir is not None:
            try:
                return Result.from_path(run_dir, error=error, checkpoint_cls=self._checkpoint_cls)
            except Exception:
                if error is None:
                    raise
                # The run's error is what the caller needs; what could be read is kept.
                logger.exception("reading the failed run's result from %s failed", run_dir)
                return Result(metrics=None, checkpoint=None, error=error, path=str(run_dir))
        return Result(metrics=None, checkpoint=None, error=error, path=None)

    def check_settings(self) -> None:
        """Raise ``ValueError`` for settings this trainer cannot honour (called by ``fit()``)."""
        (self.run_config.checkpoint_config or CheckpointConfig()).check_for_loop_trainer(type(self).__name__)
    # --- restore ----------------------------------------------------------------------

    def _save_for_restore(self, run_dir: Optional[Path]) -> None:
        """Keep this trainer (without its datasets) in the run directory for :meth:`restore`:
        its settings as JSON, what JSON cannot hold (the training function) pickled apart."""
        if run_dir is None:
            return
        state = saved_trainer.state_of(self, ("datasets", "_restore_run_dir", "_restore_trusted"))
        saved_trainer.save(run_dir, type(self), state, SAVED_CONFIGS, backend_name)

    @classmethod
    def can_restore(cls, path: Union[str, os.PathLike]) -> bool:
        """Whether ``path`` names a run this trainer can continue: ``result.path``
        (``storage_path/name``), or an experiment folder of numbered runs written before
        2026-11-29 (its latest ``run_NNN``). ``False`` for a folder with no such run, or one a
        newer sgd wrote (:meth:`restore` says which)."""
        try:
            run = find_run(path)
        except (FileNotFoundError, ValueError):
            return False
        return (run / "trainer.json").exists() and saved_trainer.exists(run)

    @classmethod
    def restore(cls, path: Union[str, os.PathLike], train_loop_per_worker: Optional[Callable[..., Any]] = None,
                train_loop_config: Optional[Dict[str, Any]] = None, datasets: Optional[Dict[str, Any]] = None,
                trusted: Optional[bool] = None, **overrides: Any) -> DataParallelTrainer:
        """A trainer that continues the run in ``path`` (``result.path``, ``storage_path/name``; an
        experiment folder of numbered runs written before 2026-11-29 stands for its latest
        ``run_NNN``), e.g. after its driver died. Running the trainer again with the same
        ``RunConfig(name, storage_path)`` does the same with the settings you pass
        (Ray 2.60's way, where ``restore`` is deprecated).

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

        :raises sgd.RunNotFoundError: ``path`` holds no run (a ``FileNotFoundError``), or not
            one ``fit()`` wrote.
        :raises sgd.RunFormatError: the run was written by a newer sgd (a ``ValueError``).
        :raises TypeError: an argument that is not one of the trainer's, or the run was written
            by another trainer class.
        """
        from sgd.checkpoint.codecs import resolve_trusted

        run = find_run(path)
        if not (run / "trainer.json").exists():
            raise RunNotFoundError(f"{run} is not an sgd run directory (no trainer.json); pass result.path")
        if not saved_trainer.exists(run):
            raise RunNotFoundError(f"{run} has no {saved_trainer.STATE_FILE}; it was not started by "
                                    f"{cls.__name__}.fit() (or by a version of sgd before 2026-11-26)")
        saved = saved_trainer.SavedTrainer(run)
        saved_cls: Any = saved.saved_class(
            [*subclasses(cls), *(c for c in cls.__mro__ if issubclass(c, DataParallelTrainer))])
        given = dict(overrides)
        for name, value in (("train_loop_per_worker", train_loop_per_worker),
                            ("train_loop_config", train_loop_config)):
            if value is not None:
                given[name] = value
        for key in overrides:
            if key not in saved.keys:
                raise TypeError(f"{cls.__name__}.restore() got an unexpected argument {key!r}")
        state = saved.load([*given, "datasets"], resolve_trusted(trusted), SAVED_CONFIGS, config_of_backend,
                           cls.__name__)
        trainer = saved_cls.__new__(saved_cls)
        trainer.__dict__.update(state)
        for key, value in given.items():
            setattr(trainer, key, dict(value) if key == "train_loop_config" else value)
        trainer.datasets = datasets
        trainer._restore_run_dir = run
        trainer._restore_trusted = trusted
        return trainer
    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend_config.name!r}, "
                f"scaling_config={self.scaling_config!r})")


@public_module("sgd.air")
class DiscardReturn:
    """The training loop as an AIR trainer runs it: its return value discarded (Ray AIR's rule),
    so a loop that returns something that does not pickle (a model) does not fail the run."""

    def __init__(self, loop: Callable[..., Any]):
        self.loop = loop

    def __call__(self, config: Dict[str, Any]) -> None:
        wrap_train_func(self.loop, config)()


def _check_type(name: str, value: Any, expected: type) -> None:
    if value is not None and not isinstance(value, expected):
        raise TypeError(f"{name} must be a {expected.__name__} (or None), got {type(value).__name__}")
