"""The arguments of Ray SGD v1's ``TorchTrainer`` and its calls, checked and resolved.

Each check raises on the driver, before any worker starts, with what to pass instead:
``num_workers`` / ``num_replicas``, ``use_gpu``, the operator (a ``TrainingOperator`` subclass
or creator functions, with ``train_function`` / ``validation_function``), ``num_steps`` and
``max_retries``.
"""

from __future__ import annotations

from typing import Any

import torch

from sgd_torch.v1.creators import with_custom_functions
from sgd_torch.v1.operator import TrainingOperator

_CREATOR_ARGS = ("model_creator", "data_creator", "optimizer_creator", "loss_creator", "scheduler_creator")


def _check_retries(max_retries: Any) -> int:
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < -1:
        raise ValueError(f"max_retries must be an int >= 0 (or -1: unlimited), got {max_retries!r}")
    return max_retries


def _check_steps(num_steps: Any) -> None:
    if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps <= 0):
        raise ValueError(f"num_steps must be a positive int or None, got {num_steps!r}")


def _resolve_workers(num_workers: Any, num_replicas: Any) -> int:
    """``num_replicas`` (v1's name) wins over ``num_workers`` left at its default of 1."""
    for name, value in (("num_workers", num_workers), ("num_replicas", num_replicas)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_replicas is None:
        return num_workers if num_workers is not None else 1
    if num_workers not in (None, 1, num_replicas):
        raise ValueError(
            f"num_workers={num_workers} and num_replicas={num_replicas} disagree; num_replicas is v1's name "
            "for num_workers: pass only one of them."
        )
    return num_replicas


def _resolve_use_gpu(use_gpu: Any) -> bool:
    if use_gpu == "auto":
        return torch.cuda.is_available()
    if not isinstance(use_gpu, bool):
        raise ValueError(f"use_gpu must be True, False or 'auto', got {use_gpu!r}")
    return use_gpu


def _resolve_operator(
    model_creator: Any, data_creator: Any, optimizer_creator: Any, loss_creator: Any, scheduler_creator: Any,
    training_operator_cls: Any, train_function: Any, validation_function: Any, serialize_data_creation: bool,
) -> type:
    creators = dict(zip(_CREATOR_ARGS, (model_creator, data_creator, optimizer_creator, loss_creator,
                                        scheduler_creator)))
    given = [name for name, fn in creators.items() if fn is not None]
    for name, fn in (("train_function", train_function), ("validation_function", validation_function)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
    if training_operator_cls is not None:
        if not (isinstance(training_operator_cls, type) and issubclass(training_operator_cls, TrainingOperator)):
            raise TypeError(
                "training_operator_cls must be a subclass of sgd_torch.v1.TrainingOperator, got "
                f"{training_operator_cls!r}"
            )
        if given:
            raise ValueError(
                f"pass either training_operator_cls or creator functions, not both (got {', '.join(given)}); "
                "build an operator from creators with TrainingOperator.from_creators(...)."
            )
        operator_cls = training_operator_cls
    else:
        missing = [name for name in ("model_creator", "data_creator", "optimizer_creator") if creators[name] is None]
        if missing:
            raise ValueError(
                f"TorchTrainer needs training_operator_cls, or model_creator, data_creator and optimizer_creator "
                f"(missing: {', '.join(missing)})."
            )
        operator_cls = TrainingOperator.from_creators(
            model_creator, optimizer_creator, data_creator, loss_creator=loss_creator,
            scheduler_creator=scheduler_creator, serialize_data_creation=serialize_data_creation,
        )
    return with_custom_functions(operator_cls, train_function, validation_function)
