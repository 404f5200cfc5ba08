"""Small helpers shared by the driver-side modules."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, List

logger = logging.getLogger("sgd")


def ensure_ray() -> None:
    """Start an embedded local Ray cluster unless Ray is already initialised.

    ``RAY_ADDRESS`` connects to a cluster instead. Without it the cluster is always a
    new embedded one (``address="local"``): a bare ``ray.init()`` would join any cluster
    that another program started on this machine with ``ray start``.
    """
    import ray

    if not ray.is_initialized():
        # The dashboard costs seconds at start and memory; opt in with SGD_RAY_DASHBOARD=1.
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or "local",
            include_dashboard=os.environ.get("SGD_RAY_DASHBOARD", "0") == "1",
        )


def wrap_train_func(train_func: Callable[..., Any], config: Any) -> Callable[[], Any]:
    """Check ``train_func`` takes zero or one argument and bind ``config or {}`` to it.

    :raises ValueError: ``train_func`` needs two or more arguments.
    :raises TypeError: ``train_func`` is not callable.
    """
    if not callable(train_func):
        raise TypeError(f"train_func must be callable, got {type(train_func).__name__}")
    params: List[inspect.Parameter]
    try:
        params = list(inspect.signature(train_func).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: call with no argument
        params = []
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    takes_any = any(p.kind is p.VAR_POSITIONAL for p in params)
    takes_one = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) or takes_any
    if len(positional) > 1:
        name = getattr(train_func, "__name__", repr(train_func))
        raise ValueError(
            f"train_func {name!r} takes {len(positional)} required arguments "
            f"({', '.join(p.name for p in positional)}); it must take none or one (config)."
        )
    cfg = config if config is not None else {}
    if takes_one:
        return lambda: train_func(cfg)
    return lambda: train_func()
