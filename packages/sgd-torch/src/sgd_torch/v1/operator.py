"""``TrainingOperator``: Ray SGD v1's unit of training logic, running on sgd.

One operator lives in each worker process. ``setup(config)`` builds the models, optimizers,
loss and data and hands them to :meth:`TrainingOperator.register` and
:meth:`TrainingOperator.register_data`, which move them to the worker's device, wrap the
models in ``DistributedDataParallel`` (through :func:`sgd_torch.prepare_model`) and give each
worker its own part of the data. ``train_epoch`` / ``train_batch`` and ``validate`` /
``validate_batch`` hold the loops; override any of them.

The same class runs under :class:`sgd_torch.v1.TorchTrainer` and, unchanged, inside a v2
training function: ``MyOperator(config)`` reads its rank and device from the process group
sgd set up, and :meth:`TrainingOperator.run_train_epoch` does what the v1 trainer does for
one ``train()`` call.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset

from sgd_torch.train_loop_utils import to_device, with_distributed_sampler
from sgd_torch.v1.data import (
    Batches,
    EpochLoader,
    as_list,
    batch_size,
    one_or_list,
)
from sgd_torch.v1.fp16 import Amp, warn_apex_args
from sgd_torch.v1.metrics import NUM_SAMPLES, Meters

SCHEDULER_STEP_FREQS = ("batch", "epoch", "manual")
#: Version tag of the dict that :meth:`TrainingOperator.full_state_dict` returns.
STATE_FORMAT = "sgd_torch.v1/1"


class TrainingOperator:
    """Training logic for one worker: subclass it and implement :meth:`setup`.

    Every argument may be left out: under sgd the rank comes from ``torch.distributed``,
    the device from :func:`sgd_torch.get_device`; outside any process group the operator
    is a single-process one (rank 0, no DDP). The v1 trainer passes them explicitly.

    :param config: the configuration handed to :meth:`setup` (``self.config``).
    :param world_rank: this worker's rank (default: ``torch.distributed`` rank, else 0).
    :param local_rank: its rank on its node (default: ``$LOCAL_RANK``, else 0).
    :param is_distributed: wrap models in DDP and shard data (default: world size > 1).
    :param device: where models and batches go (default: this worker's GPU, else CPU).
    :param use_gpu: with ``device`` left out, ``False`` keeps everything on the CPU.
    :param use_fp16: mixed precision with ``torch.amp`` (see :mod:`sgd_torch.v1.fp16`).
    :param use_tqdm: accepted for v1 compatibility; no progress bar is drawn.
    :param wrap_ddp: wrap registered models in ``DistributedDataParallel``.
    :param add_dist_sampler: give each worker its own part of registered ``DataLoader`` s.
    :param scheduler_step_freq: when registered schedulers step: ``"batch"`` (the default),
        ``"epoch"`` or ``"manual"`` (never by the operator).
    """

    def __init__(
        self,
        config: Optional[Dict[str, Any]] = None,
        world_rank: Optional[int] = None,
        local_rank: Optional[int] = None,
        is_distributed: Optional[bool] = None,
        device: Optional[Any] = None,
        use_gpu: Optional[bool] = None,
        use_fp16: bool = False,
        use_tqdm: bool = False,
        wrap_ddp: bool = True,
        add_dist_sampler: bool = True,
        scheduler_step_freq: Optional[str] = None,
    ):
        if scheduler_step_freq is not None and scheduler_step_freq not in SCHEDULER_STEP_FREQS:
            raise ValueError(
                f"scheduler_step_freq must be one of {', '.join(map(repr, SCHEDULER_STEP_FREQS))} or None, "
                f"got {scheduler_step_freq!r}"
            )
        group = dist.is_available() and dist.is_initialized()
        self._config: Dict[str, Any] = config if config is not None else {}
        self._world_size = dist.get_world_size() if group else 1
        self._world_rank = int(world_rank) if world_rank is not None else (dist.get_rank() if group else 0)
        self._local_rank = int(local_rank) if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
        self._is_distributed = bool(is_distributed) if is_distributed is not None else self._world_size > 1
        if device is None:
            from sgd_torch.train_loop_utils import get_device

            device = get_device() if use_gpu is not False else torch.device("cpu")
        self._device = torch.device(device)
        self._use_fp16 = bool(use_fp16)
        self._use_tqdm = bool(use_tqdm)
        self._wrap_ddp = bool(wrap_ddp)
        self._add_dist_sampler = bool(add_dist_sampler)
        self._scheduler_step_freq = scheduler_step_freq or "batch"
        self._amp = Amp(self._use_fp16, self._device)

        self._original_models: List[torch.nn.Module] = []
        self._models: List[torch.nn.Module] = []
        self._optimizers: List[Any] = []
        self._criterion: Any = None
        self._schedulers: List[Any] = []
        self._train_loader: Optional[EpochLoader] = None
        self._validation_loader: Optional[EpochLoader] = None
        self._overrides: Dict[str, Any] = {}
        self._registered = False
        self._in_setup = False
        self._epoch = 0
        #: Batches trained so far (all epochs); part of the operator's state.
        self.global_step = 0

    # --- to implement -------------------------------------------------------------------

    def setup(self, config: Dict[str, Any]) -> None:
        """Build models, optimizers, loss, schedulers and data; register them.

        Call ``self.register(models=..., optimizers=..., criterion=..., schedulers=...)`` and
        ``self.register_data(train_loader=..., validation_loader=...)``. Runs once per
        operator: when you call it, else on first use.
        """
        raise NotImplementedError(
            f"{type(self).__name__}.setup(config) is not implemented: override it and call self.register(...) "
            "and self.register_data(...) in it, or build the class with TrainingOperator.from_creators(...)."
        )

    def _ensure_setup(self) -> None:
        if self._registered or self._in_setup:
            return
        self._in_setup = True
        try:
            self.setup(self._config)
        finally:
            self._in_setup = False
        if not self._registered:
            raise RuntimeError(
                f"{type(self).__name__}.setup() did not call self.register(models=..., optimizers=...); "
                "register the models and optimizers there."
            )

    def register(
        self,
        *,
        models: Any,
        optimizers: Any,
        criterion: Any = None,
        schedulers: Any = None,
        ddp_args: Optional[Dict[str, Any]] = None,
        apex_args: Optional[Dict[str, Any]] = None,
    ) -> Any:
        """Register the training objects: models go to the device and, with several
        workers, into ``DistributedDataParallel``.

        :param models: a ``torch.nn.Module`` or a list of them.
        :param optimizers: an optimizer or a list of them.
        :param criterion: the loss (module or function), used by the default batch methods.
        :param schedulers: a learning-rate scheduler or a list of them.
        :param ddp_args: keyword arguments for ``DistributedDataParallel``.
        :param apex_args: ignored (with a warning): mixed precision uses ``torch.amp``.
        :returns: as in v1, ``(models, optimizers[, criterion][, schedulers])`` with each a
            single object when one was registered, else a list; models are the wrapped ones.
        """
        warn_apex_args(apex_args)
        model_list = as_list(models)
        if not model_list:
            raise ValueError("register() needs at least one model: register(models=..., optimizers=...)")
        bad = [type(m).__name__ for m in model_list if not isinstance(m, torch.nn.Module)]
        if bad:
            raise TypeError(f"register(models=...) takes torch.nn.Module objects, got {', '.join(bad)}")
        optimizer_list = as_list(optimizers)
        bad = [type(o).__name__ for o in optimizer_list if not callable(getattr(o, "step", None))]
        if not optimizer_list or bad:
            raise TypeError(
                "register(optimizers=...) takes a torch optimizer or a list of them"
                + (f", got {', '.join(bad)}" if bad else ", got none")
            )
        self._original_models = [m.to(self._device) for m in model_list]
        self._models = [self._wrap(m, ddp_args) for m in self._original_models]
        self._optimizers = optimizer_list
        if isinstance(criterion, torch.nn.Module):
            criterion = criterion.to(self._device)
        self._criterion = criterion
        self._schedulers = as_list(schedulers)
        self._registered = True

        returned: List[Any] = [one_or_list(self._models), one_or_list(self._optimizers)]
        if criterion is not None:
            returned.append(criterion)
        if self._schedulers:
            returned.append(one_or_list(self._schedulers))
        return tuple(returned)

    def _wrap(self, model: torch.nn.Module, ddp_args: Optional[Dict[str, Any]]) -> torch.nn.Module:
        if not (self._wrap_ddp and self._is_distributed and self._world_size > 1):
            return model
        if not any(p.requires_grad for p in model.parameters()):
            return model  # DDP refuses modules without trainable parameters
        from sgd_torch.train_loop_utils import prepare_model

        kwargs = dict(ddp_args or {})
        if self._device.type == "cuda":
            kwargs.setdefault("device_ids", [self._device.index])
            kwargs.setdefault("output_device", self._device.index)
        return prepare_model(model, move_to_device=False, wrap_ddp=True, ddp_kwargs=kwargs)

    def register_data(self, *, train_loader: Any = None, validation_loader: Any = None) -> None:
        """Register the data. A ``DataLoader`` gets a ``DistributedSampler`` (shuffling kept
        if it shuffled) when several workers train; a map-style ``Dataset`` is first put in
        a ``DataLoader`` (``batch_size`` from ``config["batch_size"]``, default 16); any
        other iterable is used as it is (each worker iterates its own)."""
        self._train_loader = self._prepare_loader(train_loader, shuffle=True)
        self._validation_loader = self._prepare_loader(validation_loader, shuffle=False)

    def _prepare_loader(self, loader: Any, shuffle: bool) -> Optional[EpochLoader]:
        if loader is None:
            return None
        if isinstance(loader, EpochLoader):
            return loader
        if isinstance(loader, Dataset) and not isinstance(loader, IterableDataset) and hasattr(loader, "__len__"):
            loader = DataLoader(loader, batch_size=int(self._config.get("batch_size", 16)), shuffle=shuffle)
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"register_data() takes DataLoaders, Datasets or iterables, got {type(loader).__name__}")
        if isinstance(loader, DataLoader) and self._add_dist_sampler and self._is_distributed and self._world_size > 1:
            loader = with_distributed_sampler(loader, self._world_size, self._world_rank)
        return EpochLoader(loader)

    # --- registered objects -----------------------------------------------------------

    def _get(self, name: str, registered: Callable[[], Any]) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        self._ensure_setup()
        value = registered()
        if value is None:
            raise AttributeError(f"{type(self).__name__} has no {name}: register one in setup()")
        return value

    @property
    def model(self) -> Any:
        """The first (or only) registered model, as trained (DDP-wrapped with several workers)."""
        return self._get("model", lambda: self._models[0] if self._models else None)

    @model.setter
    def model(self, value: Any) -> None:
        self._overrides["model"] = value

    @property
    def models(self) -> List[Any]:
        """All registered models, as trained."""
        return self._get("models", lambda: list(self._models) or None)

    @models.setter
    def models(self, value: Any) -> None:
        self._overrides["models"] = value

    @property
    def optimizer(self) -> Any:
        """The first (or only) registered optimizer."""
        return self._get("optimizer", lambda: self._optimizers[0] if self._optimizers else None)

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        self._overrides["optimizer"] = value

    @property
    def optimizers(self) -> List[Any]:
        return self._get("optimizers", lambda: list(self._optimizers) or None)

    @optimizers.setter
    def optimizers(self, value: Any) -> None:
        self._overrides["optimizers"] = value

    @property
    def criterion(self) -> Any:
        """The registered loss."""
        return self._get("criterion", lambda: self._criterion)

    @criterion.setter
    def criterion(self, value: Any) -> None:
        self._overrides["criterion"] = value

    def _loss(self) -> Any:
        """The criterion, or ``None`` when there is none (custom functions may not need one)."""
        return self._overrides.get("criterion", self._criterion)

    @property
    def scheduler(self) -> Any:
        """The first (or only) registered scheduler."""
        return self._get("scheduler", lambda: self._schedulers[0] if self._schedulers else None)

    @scheduler.setter
    def scheduler(self, value: Any) -> None:
        self._overrides["scheduler"] = value

    @property
    def schedulers(self) -> List[Any]:
        return self._get("schedulers", lambda: list(self._schedulers) or None)

    @schedulers.setter
    def schedulers(self, value: Any) -> None:
        self._overrides["schedulers"] = value

    @property
    def train_loader(self) -> Optional[EpochLoader]:
        self._ensure_setup()
        return self._train_loader

    @property
    def validation_loader(self) -> Optional[EpochLoader]:
        self._ensure_setup()
        return self._validation_loader

    # v1 names the migration guide's example calls.
    def _get_train_loader(self) -> Optional[EpochLoader]:
        return self.train_loader

    def _get_validation_loader(self) -> Optional[EpochLoader]:
        return self.validation_loader

    def _get_original_models(self) -> Any:
        """The registered models unwrapped (no DDP): one, or a list when several."""
        self._ensure_setup()
        return one_or_list(self._original_models)

    # --- context --------------------------------------------------------------------------

    @property
    def config(self) -> Dict[str, Any]:
        return self._config

    @property
    def world_rank(self) -> int:
        return self._world_rank

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def use_gpu(self) -> bool:
        return self._device.type == "cuda"

    @property
    def use_fp16(self) -> bool:
        return self._use_fp16

    @property
    def use_tqdm(self) -> bool:
        return self._use_tqdm

    @property
    def scheduler_step_freq(self) -> str:
        return self._scheduler_step_freq

    @property
    def epoch(self) -> int:
        """Training passes completed by :meth:`run_train_epoch` (restored with the state)."""
        return self._epoch

    # --- mixed precision --------------------------------------------------------------------

    @property
    def scaler(self) -> Optional[torch.amp.GradScaler]:
        """The ``GradScaler`` with ``use_fp16`` on a GPU, else ``None``."""
        return self._amp.scaler

    def autocast(self) -> ContextManager[Any]:
        """Context for forward passes: ``torch.autocast`` with ``use_fp16``, else nothing."""
        return self._amp.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled with ``use_fp16`` on a GPU."""
        self._amp.backward(loss)

    def step_optimizer(self, optimizer: Any, update_scale: bool = True) -> None:
        """``optimizer.step()`` through the gradient scaler when there is one.

        :param update_scale: update the loss scale after the step; when several optimizers
            step after one shared backward pass, pass ``False`` to all but the last.
        """
        self._amp.step(optimizer, update=update_scale)

    # --- loops ------------------------------------------------------------------------------

    def _set_mode(self, train: bool) -> None:
        for model in self._models:
            model.train(train)

    def _step_schedulers(self, when: str) -> None:
        if self._scheduler_step_freq == when:
            for scheduler in self._schedulers:
                scheduler.step()

    def train_epoch(self, iterator: Iterable[Any], info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One pass over ``iterator``: :meth:`train_batch` per batch, schedulers stepped per
        ``scheduler_step_freq``. Returns the sample-weighted means of the batch metrics, each
        metric's ``last_`` value, ``batch_count`` and ``num_samples``."""
        self._ensure_setup()
        info = dict(info or {})
        meters = Meters()
        self._set_mode(True)
        for batch_idx, batch in enumerate(iterator):
            batch_info = {"batch_idx": batch_idx, "global_step": self.global_step, **info}
            meters.update(self.train_batch(batch, batch_info))
            self._step_schedulers("batch")
            self.global_step += 1
        self._step_schedulers("epoch")
        return meters.summary()

    def _features_and_target(self, batch: Any, method: str) -> Any:
        if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
            raise TypeError(
                f"the default {method} expects (features, target) batches, got {type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
                + f"; override {type(self).__name__}.{method}"
            )
        features, target = batch
        return to_device(features, self._device), to_device(target, self._device)

    def _single(self, method: str) -> None:
        self._ensure_setup()
        if len(self._models) != 1 or len(self._optimizers) != 1:
            raise RuntimeError(
                f"the default {method} trains one model with one optimizer; {type(self).__name__} registered "
                f"{len(self._models)} model(s) and {len(self._optimizers)} optimizer(s). Override {method} "
                "(or pass train_function / validation_function to TorchTrainer)."
            )
        if self._criterion is None and "criterion" not in self._overrides:
            raise RuntimeError(
                f"the default {method} needs a loss: pass loss_creator to TorchTrainer or "
                f"register(criterion=...), or override {method}."
            )

    def train_batch(self, batch: Any, batch_info: Dict[str, Any]) -> Dict[str, Any]:
        """Forward, loss, backward and optimizer step on one ``(features, target)`` batch.

        :returns: ``{"train_loss": ..., "num_samples": ...}``.
        """
        self._single("train_batch")
        features, target = self._features_and_target(batch, "train_batch")
        with self.autocast():
            output = self.model(features)
            loss = self.criterion(output, target)
        self.optimizer.zero_grad()
        self.backward(loss)
        self.step_optimizer(self.optimizer)
        return {"train_loss": loss.item(), NUM_SAMPLES: batch_size(features)}

    def validate(self, val_iterator: Iterable[Any], info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One pass over ``val_iterator`` without gradients: :meth:`validate_batch` per batch."""
        self._ensure_setup()
        info = dict(info or {})
        meters = Meters()
        self._set_mode(False)
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(val_iterator):
                    meters.update(self.validate_batch(batch, {"batch_idx": batch_idx, **info}))
        finally:
            self._set_mode(True)
        return meters.summary()

    def validate_batch(self, batch: Any, batch_info: Dict[str, Any]) -> Dict[str, Any]:
        """Loss on one ``(features, target)`` batch, and accuracy when it is a classification
        (2-D output, integer class targets).

        :returns: ``{"val_loss": ..., "num_samples": ...}`` (+ ``"val_accuracy"``).
        """
        self._single("validate_batch")
        features, target = self._features_and_target(batch, "validate_batch")
        with self.autocast():
            output = self.model(features)
            loss = self.criterion(output, target)
        metrics = {"val_loss": loss.item(), NUM_SAMPLES: batch_size(target)}
        if (
            isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor) and output.dim() == 2
            and output.shape[1] > 1 and target.dim() == 1 and not target.is_floating_point()
        ):
            metrics["val_accuracy"] = (output.argmax(dim=1) == target).float().mean().item()
        return metrics

    # --- what the v1 trainer calls (usable in a v2 train_func too) ---------------------------

    def _base_info(self, num_steps: Optional[int]) -> Dict[str, Any]:
        return {"epoch_idx": self._epoch, "num_steps": num_steps, "use_fp16": self._use_fp16,
                "scheduler_step_freq": self._scheduler_step_freq}

    def run_train_epoch(
        self, num_steps: Optional[int] = None, info: Optional[Dict[str, Any]] = None, profile: bool = False
    ) -> Dict[str, Any]:
        """One ``train()`` of the v1 trainer on this worker: a pass over the registered
        training data (shuffled for this epoch), then the epoch counter goes up.

        :param num_steps: stop after this many batches.
        :param info: extra entries for the ``info`` dict ``train_epoch`` receives.
        :param profile: add ``profile: {"train_epoch_s": ...}``.
        :returns: ``train_epoch``'s metrics and ``epoch`` (passes done, this one included).
        """
        self._ensure_setup()
        if self._train_loader is None:
            raise RuntimeError(
                f"{type(self).__name__} has no training data: return a loader from data_creator or call "
                "self.register_data(train_loader=...) in setup()."
            )
        self._train_loader.set_epoch(self._epoch)
        batches = Batches(self._train_loader, self._device, num_steps)
        start = time.perf_counter()
        stats = dict(self.train_epoch(batches, {**self._base_info(num_steps), **(info or {})}) or {})
        self._epoch += 1
        stats["epoch"] = self._epoch
        if profile:
            stats["profile"] = {"train_epoch_s": time.perf_counter() - start}
        return stats

    @property
    def has_validation_data(self) -> bool:
        return self.validation_loader is not None

    def run_validation(
        self, num_steps: Optional[int] = None, info: Optional[Dict[str, Any]] = None, profile: bool = False
    ) -> Dict[str, Any]:
        """One ``validate()`` of the v1 trainer on this worker: a pass over the registered
        validation data (its first ``num_steps`` batches if given)."""
        self._ensure_setup()
        if self._validation_loader is None:
            raise RuntimeError(
                f"{type(self).__name__} has no validation data: return (train_loader, validation_loader) from "
                "data_creator or call self.register_data(validation_loader=...) in setup()."
            )
        batches = Batches(self._validation_loader, self._device, num_steps)
        start = time.perf_counter()
        stats = dict(self.validate(batches, {**self._base_info(num_steps), **(info or {})}) or {})
        if profile:
            stats["profile"] = {"validate_s": time.perf_counter() - start}
        return stats

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Extra state of your operator to checkpoint (registered objects are saved anyway)."""
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned."""

    def full_state_dict(self) -> Dict[str, Any]:
        """Everything to resume from: models (unwrapped), optimizers, schedulers, the AMP
        scaler, epoch and step counters and :meth:`state_dict`. What ``TorchTrainer.save``
        writes; in a v2 ``train_func`` hand it to ``sgd.save_checkpoint(**state)``."""
        self._ensure_setup()
        return {
            "format": STATE_FORMAT,
            "epoch": self._epoch,
            "global_step": self.global_step,
            "models": [m.state_dict() for m in self._original_models],
            "optimizers": [o.state_dict() for o in self._optimizers],
            "schedulers": [s.state_dict() for s in self._schedulers],
            "amp": self._amp.state_dict(),
            "operator": self.state_dict(),
        }

    def load_full_state_dict(self, state: Dict[str, Any]) -> None:
        """Load what :meth:`full_state_dict` returned (on every worker)."""
        self._ensure_setup()
        if not isinstance(state, dict) or "models" not in state:
            raise ValueError("not a state written by sgd_torch.v1 (TorchTrainer.save / full_state_dict)")
        for what, mine in (("model", self._original_models), ("optimizer", self._optimizers),
                           ("scheduler", self._schedulers)):
            theirs = state.get(f"{what}s") or []
            if len(theirs) != len(mine):
                raise ValueError(
                    f"the state holds {len(theirs)} {what}(s) but {type(self).__name__} registered {len(mine)}; "
                    "restore it into a trainer built with the same creators / operator class."
                )
        for model, sd in zip(self._original_models, state["models"]):
            model.load_state_dict(sd)
        for optimizer, sd in zip(self._optimizers, state["optimizers"]):
            optimizer.load_state_dict(sd)
        for scheduler, sd in zip(self._schedulers, state.get("schedulers") or []):
            scheduler.load_state_dict(sd)
        self._amp.load_state_dict(state.get("amp"))
        self._epoch = int(state.get("epoch", 0))
        self.global_step = int(state.get("global_step", 0))
        self.load_state_dict(state.get("operator") or {})

    # --- building from creator functions ------------------------------------------------------

    @classmethod
    def from_creators(
        cls,
        model_creator: Callable[[Dict[str, Any]], Any],
        optimizer_creator: Callable[[Any, Dict[str, Any]], Any],
        data_creator: Optional[Callable[[Dict[str, Any]], Any]] = None,
        loss_creator: Any = None,
        scheduler_creator: Optional[Callable[[Any, Dict[str, Any]], Any]] = None,
        serialize_data_creation: bool = True,
    ) -> type:
        """A ``TrainingOperator`` subclass whose ``setup`` calls the v1 creator functions.

        ``model_creator(config)`` → model(s); ``optimizer_creator(models, config)`` →
        optimizer(s); ``data_creator(config)`` → a train loader or ``(train, validation)``;
        ``loss_creator(config)`` or a loss class (``torch.nn.MSELoss``);
        ``scheduler_creator(optimizers, config)`` → scheduler(s). With
        ``serialize_data_creation`` the workers of a node run ``data_creator`` one at a time.
        """
        from sgd_torch.v1.creators import operator_from_creators

        return operator_from_creators(cls, model_creator, optimizer_creator, data_creator, loss_creator,
                                      scheduler_creator, serialize_data_creation)
