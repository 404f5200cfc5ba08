"""``ray_logger``: send dicts from the workers to the driver's callbacks (Horovod's
``horovod.ray.ray_logger``).

Inside a function run by :class:`sgd_horovod.ElasticRayExecutor` or an elastic
:class:`sgd_horovod.RayExecutor` (``min_workers=...``)::

    from sgd_horovod import ray_logger      # was: from horovod.ray import ray_logger

    ray_logger.log({"epoch": epoch, "loss": loss})

Every worker's dicts reach each callback passed to ``run(..., callbacks=[...])`` on the
driver, in the order each worker logged them. Without callbacks the dicts are dropped.
Outside such a run, ``log`` warns once and drops the dict.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

_queue: Optional[Any] = None
_configured = False
_warned = False


def configure(queue: Optional[Any]) -> None:
    """Send later :func:`log` calls of this process to ``queue`` (a ``ray.util.queue.Queue``);
    ``None`` drops them (a run without callbacks). Called by the executor on each worker."""
    global _queue, _configured
    _queue = queue
    _configured = True


def reset() -> None:
    """Forget the run's queue (the worker's group ended): a later :func:`log` in this process,
    outside such a run, warns and drops its dict."""
    global _queue, _configured
    _queue = None
    _configured = False


def log(info_dict: Dict[str, Any]) -> None:
    """Send ``info_dict`` (anything Ray can serialise) to the driver's callbacks.

    :raises TypeError: ``info_dict`` is not a dict.
    """
    global _warned
    if not isinstance(info_dict, dict):
        raise TypeError(f"ray_logger.log takes a dict, got {type(info_dict).__name__}")
    if not _configured:
        if not _warned:
            warnings.warn("sgd_horovod.ray_logger.log was called outside an elastic RayExecutor run; "
                          "the dict is dropped", UserWarning, stacklevel=2)
            _warned = True
        return
    if _queue is not None:
        _queue.put(info_dict)
