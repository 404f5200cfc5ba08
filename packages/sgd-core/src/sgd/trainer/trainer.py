"""``Trainer``: run a training function on N Ray workers with a backend set up."""

from __future__ import annotations

import logging
import os
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from sgd import plugins as plugin_registry
from sgd._common.public import public_module
from sgd.backend import BackendConfig
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import Checkpoint
from sgd.checkpoint.format import SHARDED_KEY, is_sharded
from sgd.checkpoint.preprocessor import encode_preprocessor
from sgd.checkpoint.storage import is_uri, storage_for
from sgd.data import DatasetConfig
from sgd.group.in_process import check_local
from sgd.plugins import PluginManager, plugin_manager_for
from sgd.run.controller import RunController, RunSpec
from sgd.storage.manager import CheckpointManager
from sgd.storage.run_dir import RunDirectory
from sgd.trainer.arguments import (
    backend_config_of,
    check_dataset_config,
    check_placement_timeout,
    checkpoint_dict,
    checkpoint_strategy_of,
    resolve_run_folder,
    seconds_or_none,
)
from sgd.trainer.controller import make_controller, release_workers
from sgd.trainer.iterator import TrainingIterator
from sgd.trainer.run_dirs import open_run, resume_state
from sgd.trainer.settings import resource_table, restored_arguments, settings_json
from sgd.utils import resolve_num_workers, resolve_resources, wrap_train_func
from sgd.worker_group import PLACEMENT_STRATEGIES, WorkerGroup

logger = logging.getLogger("sgd")


@public_module("sgd.trainer")
class Trainer:
    """Runs a training function on ``num_workers`` Ray actors with ``backend`` set up.

    :param backend: a registered backend name (``"torch"``...) or a :class:`BackendConfig`.
    :param num_workers: a positive int, or ``(min, max)`` for elastic training.
    :param use_gpu: reserve one GPU per worker (unless ``resources_per_worker`` says otherwise).
    :param resources_per_worker: Ray resources per worker; default ``{"CPU": 1, "GPU": int(use_gpu)}``.
    :param logdir: where runs are written (default ``~/sgd_results/train_<timestamp>``).
    :param max_retries: worker-group failures to recover from (``-1``: unlimited). A failure is
        a worker's death (Ray Train 1.x's rule), and with ``retry_worker_errors`` also an
        exception raised by the training function.
    :param storage_path: also copy every kept checkpoint here (a local path or a storage URI
        such as ``s3://bucket/prefix``), under ``<logdir name>/run_NNN/checkpoints/`` (with
        ``run_dir``: ``<run_dir name>/checkpoints/``).
    :param run_dir: run in exactly this folder, not in a new ``logdir/run_NNN`` (``logdir`` is
        its parent then). A folder that holds a run already continues it, from its newest
        checkpoint that verifies (resume by name: the AIR trainers' ``storage_path/name``, as
        in Ray 2.60); see :meth:`restore` to continue a run with its saved settings. Either
        way one driver at a time: a second raises :class:`sgd.RunInUseError`.
    :param placement_strategy: how the workers' placement group spreads them over nodes
        (``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"``, ``"STRICT_SPREAD"``).
    :param placement_timeout_s: how long starting or restarting the workers waits for the
        cluster to have room for them (after a host is lost: for it, or another, to come back),
        logging what is missing and where, before it fails with
        :class:`~sgd.ResourcesUnavailableError`. ``None``: ``SGD_PLACEMENT_TIMEOUT_S`` (120 s).
    :param hang_timeout_s: when no worker sends anything (a report, a checkpoint, its end) for
        this long, the run is taken as hung: every worker's stack is logged with the ranks
        that are not where the others are (the stragglers), and the run fails with
        :class:`~sgd.TrainingHangError`, which ``max_retries`` restarts like a worker death.
        ``None``: ``SGD_HANG_TIMEOUT_S`` (unset: never). Set it well above a step's time.
    :param plugins: plugin objects (modules or instances with ``@sgd.hookimpl`` functions)
        that only this trainer's hooks call, beside the installed plugins; nothing is
        registered process-wide. They reach every hook this trainer calls: the backend
        lookup (a plugin may declare the backend named by ``backend``), the lifecycle and
        result hooks, checkpoint codecs and storage, and Ray Tune (each trial's trainer gets
        them). ``sgd run`` passes its launcher plugin this way. A plugin registered twice or
        implementing a hook that does not exist raises :class:`sgd.plugins.PluginError`.
    :param retry_worker_errors: also retry (against ``max_retries``, from the latest checkpoint)
        a run whose training function raised an exception on a worker, as Ray 2.x's
        ``FailureConfig(max_failures)`` does; once the retries run out the last exception is
        raised as usual (its own type). ``False`` (the default, Ray Train 1.x's rule): only a
        worker's death is retried, a training function's exception ends the run at once. The
        AIR/v2 trainers set it (:meth:`sgd.DataParallelTrainer.make_trainer`). Local mode
        (``num_workers=0``) never retries: the function runs in this process.
    """

    #: The :class:`sgd.ValidationConfig` of the checkpoints reported with ``validation=`` (set by the
    #: AIR trainers' ``validation_config=``); ``None``: such a report fails the run.
    validation_config: Any = None

    def __init__(
        self,
        backend: Union[str, BackendConfig] = "torch",
        num_workers: Union[int, Tuple[int, int]] = 1,
        use_gpu: bool = False,
        resources_per_worker: Optional[Dict[str, float]] = None,
        logdir: Optional[Union[str, os.PathLike]] = None,
        max_retries: int = 3,
        *,
        storage_path: Optional[str] = None,
        placement_strategy: str = "PACK",
        placement_timeout_s: Optional[float] = None,
        plugins: Optional[Sequence[object]] = None,
        hang_timeout_s: Optional[float] = None,
        retry_worker_errors: bool = False,
        run_dir: Optional[Union[str, os.PathLike]] = None,
    ):
        if not isinstance(retry_worker_errors, bool):
            raise TypeError(f"retry_worker_errors must be True or False, got {retry_worker_errors!r}")
        #: whether a training function's exception is retried like a death (see the class docstring)
        self.retry_worker_errors = retry_worker_errors
        self.placement_timeout_s = check_placement_timeout(placement_timeout_s)
        self.hang_timeout_s = seconds_or_none(hang_timeout_s, "hang_timeout_s")
        self._min_workers, self._max_workers = resolve_num_workers(num_workers)

        if placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {placement_strategy!r}")
        self.placement_strategy = placement_strategy
        #: Plugin objects (``@sgd.hookimpl`` functions) only this trainer's hooks call, beside
        #: the installed ones: see :attr:`plugin_manager`.
        self.plugins: List[object] = list(plugins or ())
        self._plugin_manager: Optional[Tuple[Any, PluginManager]] = None
        self._backend_config = backend_config_of(backend, self.plugin_manager)
        self._use_gpu = bool(use_gpu)
        self._resources = resolve_resources(self._use_gpu, resources_per_worker)
        if self._max_workers == 0:
            check_local(self._use_gpu)
        if not isinstance(max_retries, int) or max_retries < -1:
            raise ValueError(f"max_retries must be an int >= -1 (-1: unlimited), got {max_retries!r}")
        self.max_retries = max_retries
        #: The one folder every run of this trainer goes into (``run_dir=``), else ``None``.
        self.run_dir, self.logdir = resolve_run_folder(run_dir, logdir)
        #: Where checkpoints are also copied: ``storage_path/<logdir name>/run_NNN/checkpoints/``.
        self.storage_path: Optional[str] = None
        if storage_path is not None:

            uri = storage_path if is_uri(storage_path) else Path(storage_path).expanduser().resolve().as_uri()
            storage_for(uri, hook=self.plugin_manager)  # fail now, with the install hint, not at the first checkpoint
            self.storage_path = uri
        self._controller: Optional[RunController] = None
        self._latest_run_dir: Optional[Path] = None
        self._manager: Optional[CheckpointManager] = None
        self._resume_run: Optional[RunDirectory] = None
        #: ``{"name": ..., "id": ..., "experiment": ...}`` of the Ray Tune trial this trainer runs
        #: in (set by sgd-tune); workers read it through ``sgd.get_context()``.
        self.trial_info: Optional[Dict[str, str]] = None

    # --- properties -----------------------------------------------------------

    @property
    def backend_config(self) -> BackendConfig:
        return self._backend_config

    @property
    def num_workers(self) -> int:
        """Workers the trainer starts (the max of an elastic range)."""
        return self._max_workers

    @property
    def min_workers(self) -> int:
        """The fewest workers a run goes on with (equal to :attr:`max_workers` unless elastic)."""
        return self._min_workers

    @property
    def max_workers(self) -> int:
        """The most workers the trainer starts (its ``num_workers``, or the max of an elastic range)."""
        return self._max_workers

    @property
    def use_gpu(self) -> bool:
        return self._use_gpu

    @property
    def resuming_run_dir(self) -> Optional[Path]:
        """The run directory this trainer continues (made by :meth:`restore`), else ``None``."""
        return self._resume_run.path if self._resume_run is not None else None

    @property
    def plugin_manager(self) -> PluginManager:
        """The plugin manager this trainer's hooks are called through, as pytest keeps one per
        session: the installed plugins and :attr:`plugins`
        (:func:`sgd.plugins.plugin_manager_for`). Made when first needed and made again after the
        process-wide registry changed (a plugin registered or unregistered there)."""
        version = plugin_registry.registry_version()
        if self._plugin_manager is None or self._plugin_manager[0] != version:
            self._plugin_manager = (version, plugin_manager_for(self.plugins))
        return self._plugin_manager[1]

    def settings(self) -> Dict[str, Any]:
        """The keyword arguments that make an equal, not started trainer, ``logdir`` left out:
        ``sgd.Trainer(**trainer.settings(), logdir=...)``. sgd-tune builds each trial's
        trainer from them (``plugins`` included: the same objects)."""
        lo, hi = self._min_workers, self._max_workers
        return {
            "backend": self._backend_config,
            "num_workers": hi if lo == hi else (lo, hi),
            "use_gpu": self._use_gpu,
            "resources_per_worker": dict(self._resources),
            "max_retries": self.max_retries,
            "storage_path": self.storage_path,
            "placement_strategy": self.placement_strategy,
            "placement_timeout_s": self.placement_timeout_s,
            "hang_timeout_s": self.hang_timeout_s,
            "retry_worker_errors": self.retry_worker_errors,
            "plugins": list(self.plugins),
        }

    @property
    def resources_per_worker(self) -> Dict[str, float]:
        return dict(self._resources)

    @property
    def latest_run_dir(self) -> Optional[Path]:
        """``logdir/run_NNN`` of the latest run, ``None`` before the first."""
        return self._latest_run_dir

    @property
    def latest_checkpoint_dir(self) -> Optional[Path]:
        return self._latest_run_dir / "checkpoints" if self._latest_run_dir else None

    @property
    def latest_checkpoint(self) -> Optional[dict]:
        """Rank 0's state from the latest ``sgd.save_checkpoint`` of the latest run; for a
        sharded checkpoint (``sgd_torch.save_sharded_checkpoint``), the metadata saved with it."""
        state = self._manager.latest() if self._manager else None
        if is_sharded(state):
            assert state is not None
            return {k: v for k, v in state.items() if k != SHARDED_KEY}
        return state

    @property
    def best_checkpoint_path(self) -> Optional[Path]:
        """``checkpoints/checkpoint_NNNNNN`` of the latest run that scores best, or ``None``."""
        return self._manager.best_path if self._manager else None

    @property
    def best_checkpoint(self) -> Optional[dict]:
        """The state of :attr:`best_checkpoint_path`, loaded."""
        path = self.best_checkpoint_path
        if path is None:
            return None
        with plugin_registry.using(self.plugin_manager):  # this trainer's codecs
            return self.load_checkpoint_from_path(path)

    @staticmethod
    def load_checkpoint_from_path(path: Union[str, os.PathLike], trusted: Optional[bool] = None) -> dict:
        """Load a checkpoint directory (or storage URI) written by sgd into a dict.

        Every file is verified; pickled objects load only with ``trusted=True`` (or
        ``SGD_TRUST_CHECKPOINTS=1``), see :class:`sgd.Checkpoint`.
        """
        return Checkpoint.from_directory(path, trusted=trusted).to_dict()

    @classmethod
    def restore(cls, run_dir: Union[str, os.PathLike], backend: Optional[BackendConfig] = None,
                trusted: Optional[bool] = None) -> Trainer:
        """A trainer that continues the run in ``run_dir`` (whose driver died).

        Its settings come from the run's ``trainer.json``. Call ``start()`` and
        ``run(train_func, config)`` as before: the run goes on in the same
        directory from its last complete checkpoint, and rounds already in its
        ``results.jsonl`` are not delivered again. Pass ``backend`` for a
        ``BackendConfig`` that is not registered under a name. The run resumes from its
        newest checkpoint that verifies; ``trusted=True`` lets it unpickle arbitrary objects.
        """
        run = RunDirectory.open(Path(run_dir))
        run.trusted = trusted
        settings = run.read_settings()
        trainer = cls(**restored_arguments(settings, backend), logdir=run.path.parent)
        trainer._resume_run = run
        if settings.get("layout") == "named":  # its runs go on in the same folder
            trainer.run_dir = run.path
        return trainer

    # --- lifecycle ----------------------------------------------------------------

    def _make_controller(self) -> RunController:
        # The trainer's one plugin manager (the installed plugins and this trainer's own; pytest
        # keeps one per session): every hook of its group's lifecycle goes through it.
        return make_controller(self._backend_config, self.plugin_manager.hook, min_workers=self._min_workers,
                               max_workers=self._max_workers, resources=self._resources, use_gpu=self._use_gpu,
                               placement_strategy=self.placement_strategy,
                               placement_timeout_s=self.placement_timeout_s, max_retries=self.max_retries,
                               hang_timeout_s=self.hang_timeout_s)

    def _settings_json(self) -> Dict[str, Any]:
        """:meth:`settings` as ``trainer.json`` keeps them (what :meth:`restore` reads)."""
        return settings_json(self.settings(), self._backend_config, self._min_workers, self._max_workers)

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None) -> None:
        """Start the workers, run ``initialization_hook`` on each, set the backend up.

        A worker that dies on the way (also inside ``initialization_hook``) is replaced
        and the start tried again, up to ``max_retries`` times.

        :raises TrainingFailedError: workers kept dying; its ``__cause__`` is the last
            :class:`sgd.WorkerDiedError`.
        """
        if self._controller is not None:
            raise RuntimeError("the trainer is already started; call shutdown() first")
        controller = self._make_controller()
        controller.start(initialization_hook)
        self._controller = controller
        # A trainer dropped without shutdown() (a notebook cell that builds a new one under the
        # same name, say) releases its workers when it is collected, not when the process ends.
        self._release = weakref.finalize(self, release_workers, controller)
        self._release.atexit = False  # at exit the workers go with the driver anyway

    def shutdown(self) -> None:
        """Stop the workers and release their resources; ``start()`` may be called again."""
        controller, self._controller = self._controller, None
        release = getattr(self, "_release", None)
        if release is not None:
            release.detach()
        if controller is not None:
            controller.shutdown()

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        """Where every worker is: the Python stack of each of its threads, one string per
        worker in rank order, taken while the training function runs (each worker answers
        from a thread of its own; the training thread comes first).

        Call it from another thread while ``run`` blocks, between rounds of ``run_iterator``,
        or after a run; ``sgd stacks`` does the same from another terminal. Threads of Ray's
        that only wait are left out unless ``include_idle``.

        :param timeout_s: how long to wait for each worker; one that does not answer (its
            process frozen in C code, or gone) gets a line saying so.
        :raises RuntimeError: the trainer is not started.
        """
        controller = self._controller
        if controller is None or (controller.worker_group is None and self._max_workers != 0):
            raise RuntimeError("Trainer.stacks() needs started workers: call trainer.start() first "
                               "(or it was shut down)")
        return controller.group.stacks(timeout_s, include_idle)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- running ----------------------------------------------------------------------

    def run_iterator(
        self,
        train_func: Callable[..., Any],
        config: Optional[Dict[str, Any]] = None,
        dataset: Any = None,
        checkpoint: Any = None,
        checkpoint_strategy: Any = None,
        *,
        callbacks: Optional[Sequence[TrainingCallback]] = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        preprocessor: Any = None,
    ) -> TrainingIterator:
        """Start ``train_func`` on every worker and return an iterator over report rounds.

        ``dataset_config`` maps dataset names (``"default"`` for all, or for a single
        dataset) to :class:`sgd.DatasetConfig` (split or whole, per-epoch shuffle).
        ``preprocessor`` (a fitted Ray Data preprocessor) is kept in every checkpoint the
        run persists (``Checkpoint.get_preprocessor()``); the AIR trainers pass theirs.
        """
        fn = wrap_train_func(train_func, config)
        if self._controller is None:
            raise RuntimeError("the trainer is not started; call trainer.start() before run()")
        strategy = checkpoint_strategy_of(checkpoint_strategy)
        check_dataset_config(dataset_config)
        with plugin_registry.using(self.plugin_manager):  # read with this trainer's codecs
            initial = checkpoint_dict(checkpoint)
        all_callbacks = list(callbacks or [])
        # pluggy returns the most recently registered plugin first; use registration order.
        for extra in reversed(self._controller.group.hook.sgd_default_callbacks(trainer=self)):
            all_callbacks.extend(extra or [])
        codec = self._backend_config.backend_cls.checkpoint_codec
        resume, self._resume_run = self._resume_run, None
        run, self._manager = open_run(resume, self.logdir, self.storage_path, strategy, codec, self.plugin_manager,
                                      named=self.run_dir)
        if run.previous is not None:  # a run continued: its own newest checkpoint wins over `checkpoint`
            with plugin_registry.using(self.plugin_manager):
                state = resume_state(run, self._manager)
            initial = initial if state is None else state
        if preprocessor is not None:
            self._manager.preprocessor = encode_preprocessor(preprocessor)
        # Ray 2.60's ValidationConfig (set by the AIR/v2 trainers): reports with validation=.
        self._manager.set_validation_config(self.validation_config)
        trial = self.trial_info or {}
        # The run's config and trial are kept with it for Result.metrics (Ray Train's "config", "trial_id").
        run.write_settings(dict(self._settings_json(), run_config=config or {}, trial_id=trial.get("id")))
        self._latest_run_dir = run.path
        spec = RunSpec(
            train_func=fn, config=config or {}, callbacks=all_callbacks, checkpoint=initial,
            dataset=dataset, dataset_config=dataset_config, run_dir=run, manager=self._manager,
            max_retries=self.max_retries,
            # Local mode has no worker process to replace: its function's error is final.
            retry_worker_errors=self.retry_worker_errors and self._max_workers != 0,
            worker_run_info={
                "experiment_name": trial.get("experiment") or (run.path if run.named else self.logdir).name,
                "trial_dir": str(run.path),
                "trial_name": trial.get("name"),
                "trial_id": trial.get("id"),
            },
            run_info={"run_dir": str(run.path), "logdir": str(self.logdir), "config": config or {}},
        )
        return TrainingIterator(self._controller.begin(spec))

    def run(
        self,
        train_func: Callable[..., Any],
        config: Optional[Dict[str, Any]] = None,
        callbacks: Optional[Sequence[TrainingCallback]] = None,
        dataset: Any = None,
        checkpoint: Any = None,
        checkpoint_strategy: Any = None,
        *,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
    ) -> List[Any]:
        """Run ``train_func`` on every worker; its return values in world-rank order.

        A user exception on any worker is re-raised here with its original
        type (``__cause__`` holds the rank and remote traceback) and the other
        workers are stopped at once.
        """
        iterator = self.run_iterator(
            train_func, config, dataset=dataset, checkpoint=checkpoint,
            checkpoint_strategy=checkpoint_strategy, callbacks=callbacks, dataset_config=dataset_config,
        )
        for _ in iterator:
            pass
        results = iterator.get_final_results()
        assert results is not None
        return results

    # --- other entry points ------------------------------------------------------------

    def to_worker_group(self, train_cls: type, *args: Any, **kwargs: Any) -> WorkerGroup:
        """Start workers as instances of ``train_cls(*args, **kwargs)`` with the backend set up.

        Shut the returned group down with ``WorkerGroup.shutdown()``.
        """
        return self._make_controller().start(actor_cls=train_cls, actor_cls_args=args, actor_cls_kwargs=kwargs)

    def to_tune_trainable(self, train_func: Callable[..., Any], dataset: Any = None) -> Any:
        """A Ray Tune trainable running this trainer's setup per trial (needs ``sgd-tune``)."""
        if self._controller is not None:
            raise RuntimeError("to_tune_trainable() needs a trainer that is not started; call it before start()")
        trainable = self.plugin_manager.hook.sgd_tune_trainable(trainer=self, train_func=train_func, dataset=dataset)
        if trainable is None:
            raise ImportError("Trainer.to_tune_trainable needs the sgd-tune package: pip install sgd-tune")
        return trainable

    def __str__(self) -> str:
        state = "started" if self._controller is not None else "not started"
        return resource_table(f"sgd.Trainer ({state}, logdir={self.logdir})", self._backend_config.name,
                              self._min_workers, self._max_workers, self._resources)

    def __repr__(self) -> str:
        return (f"Trainer(backend={self._backend_config.name!r}, num_workers={self._max_workers}, "
                f"use_gpu={self._use_gpu}, resources_per_worker={self._resources})")
