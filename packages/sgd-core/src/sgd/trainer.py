"""``Trainer``: run a training function on N Ray workers with a backend set up."""

from __future__ import annotations

import datetime
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from sgd._internal.backend_executor import BackendExecutor, RunState, TrainingFailedError, WorkerDiedError
from sgd._internal.checkpoint_manager import CheckpointManager
from sgd._internal.run_dir import RunDirectory
from sgd._internal.session import CHECKPOINT, CHECKPOINT_KEY, DirectCheckpoint, DirectWrite
from sgd._internal.utils import wrap_train_func
from sgd.backend import BackendConfig
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import Checkpoint, CheckpointStrategy
from sgd.data import DatasetConfig, shard_datasets, shards_survive_restart
from sgd.plugins import get_plugin_manager, resolve_backend
from sgd.worker_group import WorkerGroup

logger = logging.getLogger("sgd")

_RUN_DIR = re.compile(r"^run_(\d{3,})$")


def results_root() -> Path:
    """Where runs go by default: ``$SGD_RESULTS_DIR`` or ``~/sgd_results``."""
    return Path(os.environ.get("SGD_RESULTS_DIR") or "~/sgd_results").expanduser()


def _resolve_logdir(logdir: Optional[Union[str, os.PathLike]]) -> Path:
    if logdir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        return (results_root() / f"train_{stamp}").resolve()
    path = Path(logdir).expanduser()
    if not path.is_absolute():
        path = results_root() / path
    return path.resolve()


def _resolve_backend(backend: Any) -> BackendConfig:
    if isinstance(backend, BackendConfig):
        return backend
    if isinstance(backend, str):
        return resolve_backend(backend).config_cls()
    raise TypeError(
        f"backend must be a backend name (str) or a BackendConfig instance, got {type(backend).__name__}"
    )


def _resolve_num_workers(num_workers: Any) -> Tuple[int, int]:
    def ok(n: Any) -> bool:
        return isinstance(n, int) and not isinstance(n, bool) and n > 0

    if isinstance(num_workers, tuple):
        if len(num_workers) != 2 or not all(ok(n) for n in num_workers) or num_workers[0] > num_workers[1]:
            raise ValueError(f"num_workers as a tuple must be (min, max) with 0 < min <= max, got {num_workers!r}")
        return num_workers
    if not ok(num_workers):
        raise ValueError(f"num_workers must be a positive int or a (min, max) tuple, got {num_workers!r}")
    return num_workers, num_workers


def _resolve_resources(use_gpu: bool, resources_per_worker: Optional[Dict[str, float]]) -> Dict[str, float]:
    resources: Dict[str, float] = {"CPU": 1, "GPU": int(use_gpu)}
    resources.update(resources_per_worker or {})  # a copy: the caller's dict is never changed
    for key, value in resources.items():
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"resources_per_worker[{key!r}] must be a number >= 0, got {value!r}")
    if not use_gpu and resources["GPU"] > 0:
        raise ValueError(
            f"resources_per_worker asks for {resources['GPU']} GPU(s) but use_gpu=False; pass use_gpu=True "
            "or drop 'GPU' from resources_per_worker."
        )
    if use_gpu and resources["GPU"] == 0:
        raise ValueError("use_gpu=True but resources_per_worker sets 'GPU' to 0; set it above 0 or use_gpu=False.")
    return resources


class Trainer:
    """Runs a training function on ``num_workers`` Ray actors with ``backend`` set up.

    :param backend: a registered backend name (``"torch"``...) or a :class:`BackendConfig`.
    :param num_workers: a positive int, or ``(min, max)`` for elastic training.
    :param use_gpu: reserve one GPU per worker (unless ``resources_per_worker`` says otherwise).
    :param resources_per_worker: Ray resources per worker; default ``{"CPU": 1, "GPU": int(use_gpu)}``.
    :param logdir: where runs are written (default ``~/sgd_results/train_<timestamp>``).
    :param max_retries: worker-group failures to recover from (``-1``: unlimited).
    :param storage_path: also copy every kept checkpoint here (a local path or a storage URI
        such as ``s3://bucket/prefix``), under ``<logdir name>/run_NNN/checkpoints/``.
    :param placement_strategy: how the workers' placement group spreads them over nodes
        (``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"``, ``"STRICT_SPREAD"``).
    """

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
    ):
        self._min_workers, self._max_workers = _resolve_num_workers(num_workers)
        from sgd.worker_group import PLACEMENT_STRATEGIES

        if placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {placement_strategy!r}")
        self.placement_strategy = placement_strategy
        self._backend_config = _resolve_backend(backend)
        self._use_gpu = bool(use_gpu)
        self._resources = _resolve_resources(self._use_gpu, resources_per_worker)
        if not isinstance(max_retries, int) or max_retries < -1:
            raise ValueError(f"max_retries must be an int >= -1 (-1: unlimited), got {max_retries!r}")
        self.max_retries = max_retries
        self.logdir: Path = _resolve_logdir(logdir)
        #: Where checkpoints are also copied: ``storage_path/<logdir name>/run_NNN/checkpoints/``.
        self.storage_path: Optional[str] = None
        if storage_path is not None:
            from sgd._internal.storage import get_storage, is_uri

            uri = storage_path if is_uri(storage_path) else Path(storage_path).expanduser().resolve().as_uri()
            get_storage(uri)  # fail now, with the install hint, not at the first checkpoint
            self.storage_path = uri
        self._executor: Optional[BackendExecutor] = None
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
        """Rank 0's state from the latest ``sgd.save_checkpoint`` of the latest run."""
        return self._manager.latest() if self._manager else None

    @property
    def best_checkpoint_path(self) -> Optional[Path]:
        """``checkpoints/checkpoint_NNNNNN`` of the latest run that scores best, or ``None``."""
        return self._manager.best_path if self._manager else None

    @property
    def best_checkpoint(self) -> Optional[dict]:
        """The state of :attr:`best_checkpoint_path`, loaded."""
        path = self.best_checkpoint_path
        return self.load_checkpoint_from_path(path) if path is not None else None

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
        if backend is None:
            backend = resolve_backend(settings["backend"]).config_cls(**settings["backend_config"])
        trainer = cls(
            backend=backend,
            num_workers=tuple(settings["num_workers"]) if settings["num_workers"][0] != settings["num_workers"][1]
            else settings["num_workers"][0],
            use_gpu=settings["use_gpu"],
            resources_per_worker=settings["resources_per_worker"],
            logdir=run.path.parent,
            max_retries=settings["max_retries"],
            storage_path=settings.get("storage_path"),
            placement_strategy=settings.get("placement_strategy", "PACK"),
        )
        trainer._resume_run = run
        return trainer

    # --- lifecycle ----------------------------------------------------------------

    def _make_executor(self) -> BackendExecutor:
        return BackendExecutor(self._backend_config, self._max_workers, self._resources,
                               min_workers=self._min_workers, placement_strategy=self.placement_strategy)

    def _settings(self) -> Dict[str, Any]:
        import dataclasses

        return {
            "backend": self._backend_config.name,
            "backend_config": dataclasses.asdict(self._backend_config)
            if dataclasses.is_dataclass(self._backend_config) else {},
            "num_workers": [self._min_workers, self._max_workers],
            "use_gpu": self._use_gpu,
            "resources_per_worker": self._resources,
            "max_retries": self.max_retries,
            "storage_path": self.storage_path,
            "placement_strategy": self.placement_strategy,
        }

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None) -> None:
        """Start the workers, run ``initialization_hook`` on each, set the backend up."""
        if self._executor is not None:
            raise RuntimeError("the trainer is already started; call shutdown() first")
        executor = self._make_executor()
        executor.start(initialization_hook)
        self._executor = executor

    def shutdown(self) -> None:
        """Stop the workers and release their resources; ``start()`` may be called again."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # --- running ----------------------------------------------------------------------

    def _next_run_dir(self) -> Path:
        self.logdir.mkdir(parents=True, exist_ok=True)
        numbers = [int(m.group(1)) for p in self.logdir.iterdir() if (m := _RUN_DIR.match(p.name))]
        number = max(numbers, default=0) + 1
        while True:  # another driver may take the same number at the same moment
            run_dir = self.logdir / f"run_{number:03d}"
            try:
                run_dir.mkdir()
                return run_dir
            except FileExistsError:
                number += 1

    def _mirror_for(self, run_dir: Path) -> Optional[str]:
        if self.storage_path is None:
            return None
        return f"{self.storage_path.rstrip('/')}/{self.logdir.name}/{run_dir.name}/checkpoints"

    @staticmethod
    def _checkpoint_dict(checkpoint: Any) -> Optional[dict]:
        if checkpoint is None or isinstance(checkpoint, dict):
            return checkpoint
        if isinstance(checkpoint, Checkpoint):
            return checkpoint.to_dict()
        if isinstance(checkpoint, (str, os.PathLike)):
            return Checkpoint.from_directory(checkpoint).to_dict()
        raise TypeError(
            f"checkpoint must be a dict, an sgd.Checkpoint or a path, got {type(checkpoint).__name__}"
        )

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
    ) -> TrainingIterator:
        """Start ``train_func`` on every worker and return an iterator over report rounds.

        ``dataset_config`` maps dataset names (``"default"`` for all, or for a single
        dataset) to :class:`sgd.DatasetConfig` (split or whole, per-epoch shuffle).
        """
        fn = wrap_train_func(train_func, config)
        if self._executor is None:
            raise RuntimeError("the trainer is not started; call trainer.start() before run()")
        strategy = checkpoint_strategy if checkpoint_strategy is not None else CheckpointStrategy()
        if not isinstance(strategy, CheckpointStrategy):
            raise TypeError(f"checkpoint_strategy must be an sgd.CheckpointStrategy, got {type(strategy).__name__}")
        initial = self._checkpoint_dict(checkpoint)
        all_callbacks = list(callbacks or [])
        # pluggy returns the most recently registered plugin first; use registration order.
        for extra in reversed(get_plugin_manager().hook.sgd_default_callbacks(trainer=self)):
            all_callbacks.extend(extra or [])
        codec = self._backend_config.backend_cls.checkpoint_codec
        resume, self._resume_run = self._resume_run, None
        if resume is not None:
            run = resume
            self._manager = CheckpointManager(run.checkpoint_dir, strategy, codec, start_id=run.last_checkpoint_id(),
                                              mirror=self._mirror_for(run.path))
            state, iteration = run.last_checkpoint()
            if state is not None:
                initial = state
                self._manager.latest_state, self._manager.latest_iteration = state, iteration
        else:
            run = RunDirectory.create(self._next_run_dir())
            self._manager = CheckpointManager(run.checkpoint_dir, strategy, codec, mirror=self._mirror_for(run.path))
        run.write_settings(self._settings())
        self._latest_run_dir = run.path
        if dataset_config is not None:
            bad = [k for k, v in dataset_config.items() if not isinstance(v, DatasetConfig)]
            if bad:
                raise TypeError(f"dataset_config values must be sgd.DatasetConfig (wrong for {bad})")
        return TrainingIterator(self, fn, config or {}, all_callbacks, initial, (dataset, dataset_config), run)

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
        executor = self._make_executor()
        return executor.start(actor_cls=train_cls, actor_cls_args=args, actor_cls_kwargs=kwargs)

    def to_tune_trainable(self, train_func: Callable[..., Any], dataset: Any = None) -> Any:
        """A Ray Tune trainable running this trainer's setup per trial (needs ``sgd-tune``)."""
        if self._executor is not None:
            raise RuntimeError("to_tune_trainable() needs a trainer that is not started; call it before start()")
        trainable = get_plugin_manager().hook.sgd_tune_trainable(trainer=self, train_func=train_func, dataset=dataset)
        if trainable is None:
            raise ImportError("Trainer.to_tune_trainable needs the sgd-tune package: pip install sgd-tune")
        return trainable

    def __str__(self) -> str:
        res = self._resources
        custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU")}
        n = self._max_workers
        workers = f"{self._min_workers}-{n}" if self._min_workers != n else str(n)
        rows = [
            ("backend", self._backend_config.name, ""),
            ("workers", workers, ""),
            ("CPUs", f"{res['CPU']:g}", f"{res['CPU'] * n:g}"),
            ("GPUs", f"{res['GPU']:g}", f"{res['GPU'] * n:g}"),
        ]
        rows += [(k, f"{v:g}", f"{v * n:g}") for k, v in sorted(custom.items())]
        header = ("resource", "per worker", "total")
        widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(3)]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

        def fmt(row: Tuple[str, str, str]) -> str:
            return "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"

        state = "started" if self._executor is not None else "not started"
        return "\n".join([f"sgd.Trainer ({state}, logdir={self.logdir})", line, fmt(header), line]
                         + [fmt(r) for r in rows] + [line])

    def __repr__(self) -> str:
        return (f"Trainer(backend={self._backend_config.name!r}, num_workers={self._max_workers}, "
                f"use_gpu={self._use_gpu}, resources_per_worker={self._resources})")


class TrainingIterator:
    """Iterates over the report rounds of one run; each item is a list of per-worker dicts."""

    def __init__(
        self,
        trainer: Trainer,
        train_func: Callable[[], Any],
        config: Dict[str, Any],
        callbacks: List[TrainingCallback],
        checkpoint: Optional[dict],
        datasets: Tuple[Any, Optional[Dict[str, DatasetConfig]]],
        run_dir: RunDirectory,
    ):
        self._trainer = trainer
        self._executor = trainer._executor
        assert self._executor is not None and trainer._manager is not None
        self._manager = trainer._manager
        self._train_func = train_func
        self._initial_checkpoint = checkpoint
        self._dataset, self._dataset_config = datasets
        self._shards: Dict[int, Optional[List[Any]]] = {}
        self._run_dir = run_dir
        self._delivered_iteration = run_dir.last_iteration()
        self._failures = 0
        self._callbacks = callbacks
        self._hook = get_plugin_manager().hook
        self._run_info = {
            "run_dir": str(trainer.latest_run_dir),
            "logdir": str(trainer.logdir),
            "config": config,
        }
        self._finished = False
        self._final: Optional[List[Any]] = None
        trial = trainer.trial_info or {}
        #: What ``sgd.get_context()`` tells the workers about this run.
        self._worker_run_info = {
            "experiment_name": trial.get("experiment") or trainer.logdir.name,
            "trial_dir": str(trainer.latest_run_dir),
            "trial_name": trial.get("name"),
            "trial_id": trial.get("id"),
        }
        resumed = self._delivered_iteration > 0
        for cb in callbacks:
            cb.start_training(logdir=str(trainer.latest_run_dir), config=config, resumed=resumed,
                              start_iteration=self._delivered_iteration)
        try:
            try:
                self._run: RunState = self._start(checkpoint, self._manager.latest_iteration if checkpoint else 0)
            except WorkerDiedError as exc:
                self._recover(exc)
        except BaseException as exc:
            self._finish(error=True, exc=exc)
            raise

    def _start(self, checkpoint: Optional[dict], start_iteration: int) -> RunState:
        assert self._executor is not None and self._executor.worker_group is not None
        n = self._executor.num_workers
        if self._dataset is not None and n not in self._shards:
            # Split once per start of the group (see _recover for why restarts split again).
            group = self._executor.worker_group
            hints = [m.node_id for m in group.metadata]
            self._shards = {n: shard_datasets(self._dataset, n, self._dataset_config, hints, list(group.workers))}
        shards = self._shards.get(n) if self._dataset is not None else None
        direct = None
        if self._manager.strategy.num_to_keep != 0 and self._executor.rank0_on_driver_node():
            # Rank 0 shares the driver's disk: it writes checkpoints itself, no transfer.
            self._manager.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            direct = DirectWrite(str(self._manager.checkpoint_dir), self._manager.codec,
                                 self._manager.strategy.checkpoint_score_attribute)
        return self._executor.start_training(self._train_func, checkpoint, shards, start_iteration, direct,
                                             self._worker_run_info)

    def _recover(self, error: WorkerDiedError) -> None:
        """Restart the workers and the training function from the latest checkpoint,
        as often as ``max_retries`` allows (a worker may also die while restarting)."""
        assert self._executor is not None
        limit = self._trainer.max_retries
        while True:
            self._failures += 1
            if limit != -1 and self._failures > limit:
                raise TrainingFailedError(
                    f"training failed after {self._failures} attempt{'s' if self._failures != 1 else ''} "
                    f"(max_retries={limit}); last failure: {error}"
                ) from error
            logger.warning("%s; restarting the workers (failure %d of %s)", error, self._failures,
                           "unlimited" if limit == -1 else limit)
            try:
                self._executor.restart(error)
                self._manager.remove_temporary()  # the old workers are gone, mid-write or not
                # Ray Data's streaming split counts a dead consumer that had reached its
                # epoch barrier and cannot forget it: a restarted group needs a new split.
                # Materialised shards (DatasetConfig(streaming=False)) are reused.
                if not shards_survive_restart(self._dataset, self._dataset_config):
                    self._shards = {}
                state = self._manager.latest()
                if state is not None:
                    self._run = self._start(state, self._manager.latest_iteration)
                else:
                    self._run = self._start(self._initial_checkpoint, 0)
                return
            except WorkerDiedError as exc:
                error = exc

    def __iter__(self) -> TrainingIterator:
        return self

    def __next__(self) -> List[Dict[str, Any]]:
        if self._finished:
            raise StopIteration
        try:
            while True:
                try:
                    round_ = self._run.next_round()
                except WorkerDiedError as exc:
                    self._recover(exc)
                    continue
                if round_ is None:
                    self._final = self._run.returns
                    self._finish(error=False)
                    raise StopIteration
                kind, data = round_
                if kind == CHECKPOINT:
                    if isinstance(data[0], DirectCheckpoint):
                        self._manager.register_written(Path(data[0].path), data[0].score_values,
                                                       self._delivered_iteration)
                    else:
                        assert self._executor is not None
                        self._manager.register(self._executor.decode_checkpoint(data[0]), self._delivered_iteration)
                    continue
                payloads = [d.pop(CHECKPOINT_KEY, None) for d in data]
                iteration = data[0].get("_training_iteration", 0)
                if iteration <= self._delivered_iteration:
                    self._discard(payloads)
                    continue  # replayed after a restart: callbacks already have it
                self._delivered_iteration = iteration
                self._run_dir.append_results(data)
                if any(p is not None for p in payloads):
                    # After the results line: a driver that dies in between resumes from an
                    # older checkpoint and replays (de-duplicated), never skips, this round.
                    assert self._executor is not None
                    first = next(i for i, p in enumerate(payloads) if p is not None)
                    self._manager.register_reported(payloads, data[first], iteration,
                                                    decode=self._executor.decode_checkpoint)
                self._hook.sgd_handle_result(results=data, run_info=self._run_info)
                for cb in self._callbacks:
                    cb.handle_result(data)
                return data
        except StopIteration:
            raise
        except BaseException as exc:
            self._finish(error=True, exc=exc)
            raise

    @staticmethod
    def _discard(payloads: List[Any]) -> None:
        for p in payloads:
            if isinstance(p, DirectCheckpoint):
                shutil.rmtree(p.path, ignore_errors=True)

    def _finish(self, error: bool, exc: Optional[BaseException] = None) -> None:
        if self._finished:
            return
        self._finished = True
        self._run_dir.close(error, interrupted=isinstance(exc, KeyboardInterrupt))
        if self._executor is not None:
            self._executor.end_training(ok=not error, error=exc)
        self._manager.remove_temporary()
        for cb in self._callbacks:
            try:
                cb.finish_training(error=error)
            except Exception:
                if not error:
                    raise
                logger.exception("callback %r failed in finish_training", cb)

    def is_finished(self) -> bool:
        return self._finished

    def get_final_results(self, force: bool = False) -> Optional[List[Any]]:
        """The return values in rank order; ``None`` while running unless ``force``,
        which drains (and hands to callbacks) the remaining rounds first."""
        if not self._finished:
            if not force:
                return None
            for _ in self:
                pass
        return self._final
