"""Operators made from functions: v1's creator functions and Ray 0.8's custom
``train_function`` / ``validation_function``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Optional

import torch

from sgd_torch.v1.data import node_lock, one_or_list, split_loaders

if TYPE_CHECKING:
    from sgd_torch.v1.operator import TrainingOperator


def operator_from_creators(
    base: type,
    model_creator: Callable[[Dict[str, Any]], Any],
    optimizer_creator: Callable[[Any, Dict[str, Any]], Any],
    data_creator: Optional[Callable[[Dict[str, Any]], Any]] = None,
    loss_creator: Any = None,
    scheduler_creator: Optional[Callable[[Any, Dict[str, Any]], Any]] = None,
    serialize_data_creation: bool = True,
) -> type:
    """A subclass of ``base`` whose ``setup`` calls the creators (see ``TrainingOperator.from_creators``)."""
    for name, fn, required in (("model_creator", model_creator, True),
                               ("optimizer_creator", optimizer_creator, True),
                               ("data_creator", data_creator, False),
                               ("scheduler_creator", scheduler_creator, False),
                               ("loss_creator", loss_creator, False)):
        if fn is None and required:
            raise ValueError(f"TrainingOperator.from_creators needs {name}")
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function (or, for loss_creator, a loss class), "
                            f"got {type(fn).__name__}")

    def setup(self: TrainingOperator, config: Dict[str, Any]) -> None:
        models = model_creator(config)
        optimizers = optimizer_creator(models, config)
        schedulers = scheduler_creator(optimizers, config) if scheduler_creator is not None else None
        criterion = None
        if loss_creator is not None:
            is_class = isinstance(loss_creator, type) and issubclass(loss_creator, torch.nn.Module)
            criterion = loss_creator() if is_class else loss_creator(config)
        self.register(models=models, optimizers=optimizers, criterion=criterion, schedulers=schedulers)
        if data_creator is not None:
            with node_lock(serialize_data_creation):
                loaders = data_creator(config)
            train, validation = split_loaders(loaders)
            self.register_data(train_loader=train, validation_loader=validation)

    name = f"CreatorOperator_{getattr(model_creator, '__name__', 'model')}".replace("<", "").replace(">", "")
    attrs = {"setup": setup, "__module__": __name__, "__doc__": "TrainingOperator built from creator functions."}
    return type(name, (base,), attrs)


def with_custom_functions(
    operator_cls: type,
    train_function: Optional[Callable[..., Any]],
    validation_function: Optional[Callable[..., Any]],
) -> type:
    """``operator_cls`` with its epoch loops replaced by v1-style functions.

    ``train_function(models, iterator, criterion, optimizers, config) -> dict`` and
    ``validation_function(models, iterator, criterion, config) -> dict``; ``models`` and
    ``optimizers`` are single objects when one was registered, else lists. The functions
    run under ``self.autocast()`` with ``use_fp16`` (gradient scaling is theirs to do).
    Registered schedulers are stepped after each pass with ``scheduler_step_freq="epoch"``;
    otherwise ``train_function`` steps them.
    """
    attrs: Dict[str, Any] = {"__module__": __name__}
    if train_function is not None:
        def train_epoch(self: TrainingOperator, iterator: Iterable[Any], info: Optional[Dict[str, Any]] = None):
            self._set_mode(True)
            with self.autocast():
                stats = train_function(one_or_list(self.models), iterator, self._loss(),
                                       one_or_list(self.optimizers), self.config)
            self._step_schedulers("epoch")
            return dict(stats or {})

        attrs["train_epoch"] = train_epoch
    if validation_function is not None:
        def validate(self: TrainingOperator, val_iterator: Iterable[Any], info: Optional[Dict[str, Any]] = None):
            self._set_mode(False)
            try:
                with torch.no_grad(), self.autocast():
                    stats = validation_function(one_or_list(self.models), val_iterator, self._loss(), self.config)
            finally:
                self._set_mode(True)
            return dict(stats or {})

        attrs["validate"] = validate
    if len(attrs) == 1:
        return operator_cls
    return type(f"{operator_cls.__name__}WithFunctions", (operator_cls,), attrs)
