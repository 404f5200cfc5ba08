"""Registration, the part of Ray SGD v1's ``TrainingOperator`` a subclass fills in.

``setup(config)`` builds the models, optimizers, loss, schedulers and data and hands them to
``register`` and ``register_data``, which move them to the worker's device, wrap the models in
``DistributedDataParallel`` and give each worker its own part of the data. The properties read
back what was registered (``model``, ``optimizers``, ...) and where the operator runs
(``world_rank``, ``device``, ...). A base of :class:`sgd_torch.v1.TrainingOperator`, whose
``__init__`` sets the attributes declared here.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from sgd_torch.train_loop_utils import with_distributed_sampler
from sgd_torch.v1.data import EpochLoader, as_list, one_or_list
from sgd_torch.v1.fp16 import Amp, warn_apex_args


class _Registration:
    """``setup``, ``register``, ``register_data`` and what they registered, read back."""

    # Set by TrainingOperator.__init__.
    _config: Dict[str, Any]
    _world_size: int
    _world_rank: int
    _local_rank: int
    _is_distributed: bool
    _device: torch.device
    _use_fp16: bool
    _use_tqdm: bool
    _wrap_ddp: bool
    _add_dist_sampler: bool
    _scheduler_step_freq: str
    _amp: Amp
    _original_models: List[torch.nn.Module]
    _models: List[torch.nn.Module]
    _optimizers: List[Any]
    _criterion: Any
    _schedulers: List[Any]
    _train_loader: Optional[EpochLoader]
    _validation_loader: Optional[EpochLoader]
    _overrides: Dict[str, Any]
    _registered: bool
    _in_setup: bool
    _epoch: int

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
