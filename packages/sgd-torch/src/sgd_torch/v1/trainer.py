"""``TorchTrainer`` (alias ``PyTorchTrainer``): Ray SGD v1's trainer, run by ``sgd.Trainer``.

How it maps onto sgd (one execution path, no second one):

- The constructor starts one ``sgd.Trainer`` with the ``"torch"`` backend (gloo or NCCL
  process group) and runs a first pass that builds a :class:`TrainingOperator` on every
  worker. The operators stay alive between calls in a per-process registry, so the creators
  run once per worker process, not once per ``train()``.
- Every ``train()`` / ``validate()`` / ``get_model()`` is one ``sgd.Trainer.run`` of
  :func:`sgd_torch.v1.worker.run_job`, which finds this trainer's operator in the registry
  and does one pass; each worker ``sgd.report`` s its metrics of the pass, and the driver
  averages them.
- After every training pass the driver keeps rank 0's complete state (models, optimizers,
  schedulers, AMP scaler, epoch). Each run is given that state as its ``checkpoint``, wrapped
  in a Ray object reference that workers only fetch when they need it: when sgd replaces the
  workers after a death (new processes, empty registry) the operators are rebuilt, load the
  state and the pass is redone from its start. ``train(max_retries=N)`` sets how many times.

Its arguments are checked in :mod:`sgd_torch.v1.arguments`; its state file is read in
:mod:`sgd_torch.v1.saved_state`.
"""

from __future__ import annotations

import functools
import inspect
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from sgd_torch.v1.arguments import _check_retries, _check_steps, _resolve_operator, _resolve_use_gpu, _resolve_workers
from sgd_torch.v1.fp16 import warn_apex_args
from sgd_torch.v1.metrics import reduce_stats
from sgd_torch.v1.operator import SCHEDULER_STEP_FREQS
from sgd_torch.v1.saved_state import _check_same_layout, _load_state_file
from sgd_torch.v1.worker import Job, run_job


class TorchTrainer:
    """Ray SGD v1's ``TorchTrainer``, running on ``sgd.Trainer``.

    Give either creator functions or a ``TrainingOperator`` subclass:

    :param model_creator: ``model_creator(config)`` → a model, or several (a list/tuple).
    :param data_creator: ``data_creator(config)`` → a train ``DataLoader`` or
        ``(train_loader, validation_loader)`` (``Dataset`` s are put in ``DataLoader`` s).
    :param optimizer_creator: ``optimizer_creator(models, config)`` → optimizer(s).
    :param loss_creator: ``loss_creator(config)`` → a loss, or a loss class (``nn.MSELoss``).
    :param scheduler_creator: ``scheduler_creator(optimizers, config)`` → scheduler(s).
    :param training_operator_cls: a :class:`TrainingOperator` subclass (instead of creators).
    :param config: handed to every creator and to ``setup``.
    :param num_workers: data-parallel workers (``num_replicas`` is an alias).
    :param use_gpu: one GPU per worker (``"auto"``: when the driver sees CUDA).
    :param use_fp16: mixed precision with ``torch.amp`` (autocast + GradScaler on GPU,
        bfloat16 autocast on CPU).
    :param initialization_hook: run on every worker process before anything else (again on
        workers that replace failed ones).
    :param train_function: ``train_function(models, iterator, criterion, optimizers, config)``
        → dict: replaces the operator's ``train_epoch`` (several models: a GAN).
    :param validation_function: ``validation_function(models, iterator, criterion, config)`` → dict.

    Keyword-only: ``num_replicas``, ``apex_args`` (ignored, with a warning),
    ``scheduler_step_freq`` (``"batch"`` default, ``"epoch"``, ``"manual"``), ``wrap_ddp``,
    ``add_dist_sampler``, ``serialize_data_creation``, ``use_tqdm`` (accepted, unused),
    ``backend`` (``"auto"``, ``"gloo"``, ``"nccl"``), ``timeout_s``, ``num_cpus_per_worker``,
    ``logdir`` (the ``sgd.Trainer`` log directory; each call is one run in it).
    """

    def __init__(
        self,
        model_creator: Optional[Callable[..., Any]] = None,
        data_creator: Optional[Callable[..., Any]] = None,
        optimizer_creator: Optional[Callable[..., Any]] = None,
        loss_creator: Any = None,
        scheduler_creator: Optional[Callable[..., Any]] = None,
        training_operator_cls: Optional[type] = None,
        config: Optional[Dict[str, Any]] = None,
        num_workers: int = 1,
        use_gpu: Union[bool, str] = False,
        use_fp16: bool = False,
        initialization_hook: Optional[Callable[[], Any]] = None,
        train_function: Optional[Callable[..., Any]] = None,
        validation_function: Optional[Callable[..., Any]] = None,
        *,
        num_replicas: Optional[int] = None,
        apex_args: Optional[Dict[str, Any]] = None,
        scheduler_step_freq: Optional[str] = None,
        wrap_ddp: bool = True,
        add_dist_sampler: bool = True,
        serialize_data_creation: bool = True,
        use_tqdm: bool = False,
        backend: str = "auto",
        timeout_s: int = 1800,
        num_cpus_per_worker: float = 1,
        logdir: Optional[Union[str, os.PathLike]] = None,
    ):
        self._num_workers = _resolve_workers(num_workers, num_replicas)
        self._use_gpu = _resolve_use_gpu(use_gpu)
        self._operator_cls = _resolve_operator(
            model_creator, data_creator, optimizer_creator, loss_creator, scheduler_creator,
            training_operator_cls, train_function, validation_function, serialize_data_creation,
        )
        if scheduler_step_freq is not None and scheduler_step_freq not in SCHEDULER_STEP_FREQS:
            raise ValueError(f"scheduler_step_freq must be one of {', '.join(map(repr, SCHEDULER_STEP_FREQS))} "
                             f"or None, got {scheduler_step_freq!r}")
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
        if initialization_hook is not None and not callable(initialization_hook):
            raise TypeError(f"initialization_hook must be a function, got {type(initialization_hook).__name__}")
        warn_apex_args(apex_args)
        self._config: Dict[str, Any] = dict(config or {})
        self._operator_kwargs = {
            "config": self._config,
            "use_fp16": bool(use_fp16),
            "use_tqdm": bool(use_tqdm),
            "wrap_ddp": bool(wrap_ddp),
            "add_dist_sampler": bool(add_dist_sampler),
            "scheduler_step_freq": scheduler_step_freq,
        }
        self._id = uuid.uuid4().hex
        self._state: Optional[Dict[str, Any]] = None  # rank 0's latest complete state
        self._state_ref: Any = None  # the same in Ray's object store (made when a run needs it)
        self._version = 0
        self._has_validation = False

        import sgd
        from sgd_torch.config import TorchConfig

        self._trainer: Optional[sgd.Trainer] = sgd.Trainer(
            # Every worker is replaced after a death: each process keeps its operator (its
            # DDP model bound to the process group, its state mid-pass) between calls.
            backend=TorchConfig(backend=None if backend == "auto" else backend, timeout_s=timeout_s,
                                keep_survivors=False),
            num_workers=self._num_workers,
            use_gpu=self._use_gpu,
            resources_per_worker={"CPU": num_cpus_per_worker},
            logdir=logdir,
            max_retries=0,
        )
        self._trainer.start(initialization_hook)
        try:
            self._run("init", max_retries=0)  # creators run now: their errors surface here, as in v1
        except BaseException:
            self.shutdown()
            raise

    # --- running passes ---------------------------------------------------------------------

    @property
    def config(self) -> Dict[str, Any]:
        """The config every worker's operator was built with."""
        return dict(self._config)

    @property
    def logdir(self) -> Path:
        """The ``sgd.Trainer`` log directory; every call of this trainer is one ``run_NNN`` in it."""
        return self._sgd_trainer().logdir

    def _sgd_trainer(self) -> Any:
        if self._trainer is None:
            raise RuntimeError("this TorchTrainer is shut down; create a new one")
        return self._trainer

    def _current_ref(self) -> Any:
        if self._state is not None and self._state_ref is None:
            import ray

            self._state_ref = ray.put(self._state)
        return self._state_ref

    def _run(self, kind: str, max_retries: int, restart: Any = None, **options: Any) -> List[Dict[str, Any]]:
        trainer = self._sgd_trainer()
        ref = self._current_ref()
        changes_state = kind in ("init", "train")
        job = Job(
            trainer_id=self._id,
            operator_cls=self._operator_cls,
            operator_kwargs=self._operator_kwargs,
            use_gpu=self._use_gpu,
            kind=kind,
            version=self._version,
            state=[ref] if ref is not None else None,
            new_version=self._version + 1 if changes_state else self._version,
            **options,
        )
        restart_refs = [restart] if restart is not None else job.state
        trainer.max_retries = max_retries  # per call; read by sgd when a worker group fails
        results = trainer.run(functools.partial(run_job, job),
                              checkpoint={"state": restart_refs} if restart_refs else None)
        head = results[0]
        if changes_state or (kind == "state" and self._state is None):
            self._state, self._state_ref = head["state"], None
        self._version = job.new_version
        self._has_validation = bool(head["has_validation"])
        return results

    def _restart_ref(self, checkpoint: Any) -> Any:
        if checkpoint is None or checkpoint == "auto":
            return None  # the state this call starts from
        if isinstance(checkpoint, dict):
            state = checkpoint
        elif isinstance(checkpoint, (str, os.PathLike)):
            state = _load_state_file(checkpoint)
        else:
            raise TypeError(f"checkpoint must be None, 'auto', a path written by save() or a state dict, "
                            f"got {type(checkpoint).__name__}")
        import ray

        return ray.put(state)

    def train(
        self,
        max_retries: int = 0,
        checkpoint: Any = None,
        *,
        num_steps: Optional[int] = None,
        profile: bool = False,
        reduce_results: bool = True,
        info: Optional[Dict[str, Any]] = None,
    ) -> Any:
        """One pass over the training data on every worker.

        :param max_retries: when workers die during the pass, replace them and redo the pass
            from its starting state, at most this many times (``-1``: no limit). Giving up
            raises ``sgd.TrainingFailedError``.
        :param checkpoint: the state replaced workers start from: ``None`` or ``"auto"`` (the
            state this call began with, which the trainer always keeps), a path written by
            :meth:`save`, or a dict from :meth:`state_dict`.
        :param num_steps: stop each worker after this many batches.
        :param profile: add ``profile`` timings.
        :param reduce_results: average over workers (else a list, one dict per worker).
        :param info: extra entries for the ``info`` dict of ``train_epoch``.
        :returns: e.g. ``{"num_samples", "epoch", "batch_count", "train_loss", "last_train_loss"}``.
        """
        retries = _check_retries(max_retries)
        _check_steps(num_steps)
        restart = self._restart_ref(checkpoint)
        results = self._run("train", retries, restart, num_steps=num_steps, info=dict(info or {}),
                            profile=bool(profile))
        stats = [r["stats"] for r in results]
        return reduce_stats(stats) if reduce_results else stats

    def validate(
        self,
        num_steps: Optional[int] = None,
        profile: bool = False,
        reduce_results: bool = True,
        info: Optional[Dict[str, Any]] = None,
    ) -> Any:
        """One pass over the validation data on every worker.

        :returns: e.g. ``{"num_samples", "batch_count", "val_loss", "last_val_loss"}``
            (+ ``val_accuracy`` for classification), averaged over workers unless
            ``reduce_results=False``.
        """
        _check_steps(num_steps)
        if not self._has_validation:
            raise RuntimeError(
                f"{self._operator_cls.__name__} has no validation data: return (train_loader, validation_loader) "
                "from data_creator, or call self.register_data(validation_loader=...) in setup()."
            )
        results = self._run("validate", 0, num_steps=num_steps, info=dict(info or {}), profile=bool(profile))
        stats = [r["stats"] for r in results]
        return reduce_stats(stats) if reduce_results else stats

    # --- models and state -------------------------------------------------------------------

    def get_model(self) -> Any:
        """The trained model as a CPU copy without DDP; a list when there are several."""
        models = self._run("models", 0)[0]["models"]
        return models[0] if len(models) == 1 else models

    def state_dict(self) -> Dict[str, Any]:
        """The trainer's complete state (rank 0's operator; see ``TrainingOperator.full_state_dict``)."""
        if self._state is None:
            self._run("state", 0)
        assert self._state is not None
        return self._state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load ``state`` (from :meth:`state_dict`) into every worker."""
        if not isinstance(state, dict) or "models" not in state:
            raise ValueError("load_state_dict() takes a dict from TorchTrainer.state_dict() (no models in it)")
        if self._state is not None:
            _check_same_layout(self._state, state, self._operator_cls.__name__)
        previous = (self._state, self._state_ref)
        # A new version: workers that are alive load it; workers built later start from it.
        self._state, self._state_ref, self._version = state, None, self._version + 1
        try:
            self._run("sync", 0)  # load it now, so that a mismatch fails here and not in train()
        except BaseException:
            # The failed run stopped the workers; the next call rebuilds them from the old state.
            self._state, self._state_ref = previous
            raise

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Write the trainer's state to the file ``path`` with ``torch.save`` (into
        ``path/trainer.pt`` when ``path`` is a directory); returns the file's path."""
        from sgd_torch import codec

        path = Path(path).expanduser()
        if path.is_dir():
            path = path / "trainer.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                codec.save(self.state_dict(), f)
            os.replace(tmp, path)  # never a half-written file under the final name
        finally:
            tmp.unlink(missing_ok=True)
        return str(path)

    def restore(self, path: Union[str, os.PathLike], trusted: Optional[bool] = None) -> None:
        """Load a file written by :meth:`save` (by this or another trainer) into every worker.

        Tensors, state dicts and plain data load with ``torch.load(weights_only=True)``; state
        holding other Python objects needs ``trusted=True`` (or ``SGD_TRUST_CHECKPOINTS=1``)
        and raises :class:`sgd.checkpoint.UntrustedCheckpointError` otherwise.
        """
        self.load_state_dict(_load_state_file(path, trusted))

    def load(self, path: Union[str, os.PathLike], trusted: Optional[bool] = None) -> None:
        """Same as :meth:`restore` (v1 had both names)."""
        self.restore(path, trusted)

    def shutdown(self, force: bool = False) -> None:
        """Stop the workers. ``force`` is accepted for v1 compatibility."""
        trainer, self._trainer = self._trainer, None
        if trainer is not None:
            trainer.shutdown()

    def __enter__(self) -> TorchTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    @classmethod
    def as_trainable(cls, *args: Any, override_tune_step: Optional[Callable[..., Any]] = None,
                     **kwargs: Any) -> type:
        """A Ray Tune class trainable: each trial makes ``TorchTrainer(*args, **kwargs)`` with
        ``config`` updated by the trial's config; each step is ``train()`` (+ ``validate()``
        when there is validation data), or ``override_tune_step(trainer, info)``.
        Needs ``sgd-tune``."""
        from sgd_torch.v1.tune import make_trainable

        return make_trainable(cls, args, kwargs, override_tune_step)

    def __repr__(self) -> str:
        state = "shut down" if self._trainer is None else "running"
        return f"TorchTrainer(operator={self._operator_cls.__name__}, num_workers={self._num_workers}, {state})"


PyTorchTrainer = TorchTrainer


def check_trainer_args(*args: Any, **kwargs: Any) -> None:
    """Check ``TorchTrainer(*args, **kwargs)`` would accept its arguments, without starting workers."""
    bound = inspect.signature(TorchTrainer.__init__).bind(None, *args, **kwargs)
    a = bound.arguments
    _resolve_workers(a.get("num_workers"), a.get("num_replicas"))
    _resolve_use_gpu(a.get("use_gpu", False))
    _resolve_operator(a.get("model_creator"), a.get("data_creator"), a.get("optimizer_creator"), a.get("loss_creator"),
                      a.get("scheduler_creator"), a.get("training_operator_cls"), a.get("train_function"),
                      a.get("validation_function"), a.get("serialize_data_creation", True))
