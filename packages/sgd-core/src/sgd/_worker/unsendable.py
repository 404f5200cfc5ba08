"""What to do when a worker's poll reply cannot be sent: a value given to ``sgd.report``
(or ``sgd.save_checkpoint``) that cannot be pickled, such as a lock.

Reports cost nothing extra on the hot path: Ray pickles a poll's reply after the worker
returned it, and only when that fails does the driver ask the worker (through
``_sgd_execute``) which item and which key was at fault. The worker keeps its last reply
(:attr:`Session._last_batch`) until the next poll, so the items before the bad one are
returned and delivered (nothing reported earlier is lost), and the run then fails with a
``TypeError`` naming ``sgd.report`` and the key.
"""

from __future__ import annotations

import os
import socket
from typing import Any, List, Optional, Tuple

from sgd._common.protocol import CHECKPOINT, CHECKPOINT_KEY, Item, RemoteError
from sgd._worker.session import STATE


def _pickling_error(value: Any) -> Optional[BaseException]:
    import ray.cloudpickle as cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        return exc
    return None


def _describe(kind: str, data: Any) -> Optional[str]:
    """Which part of one item cannot be pickled, in words; ``None`` if it can."""

    if _pickling_error(data) is None:
        return None
    if isinstance(data, dict):
        for key, value in data.items():
            exc = _pickling_error(value)
            if exc is None:
                continue
            if kind == CHECKPOINT:
                where = f"sgd.save_checkpoint got a value that cannot be sent to the driver: key {key!r}"
            elif key == CHECKPOINT_KEY:
                where = "sgd.report(checkpoint=...) got a checkpoint that cannot be sent to the driver"
            else:
                where = f"sgd.report got a value that cannot be sent to the driver: key {key!r}"
            return (f"{where} (a {type(value).__module__}.{type(value).__qualname__}) cannot be pickled "
                    f"({type(exc).__name__}: {exc}). Report numbers, strings, lists, dicts, arrays or tensors; "
                    "convert that value or leave it out.")
    name = "sgd.save_checkpoint" if kind == CHECKPOINT else "sgd.report"
    exc = _pickling_error(data)
    return f"{name} got a value that cannot be pickled ({type(exc).__name__}: {exc})"


def split_unsendable() -> Optional[Tuple[List[Item], bool, Any, Any]]:
    """On the worker: the last poll reply cut before its first unpicklable item, with the
    error that names it, as a poll reply; ``None`` if every item pickles (another failure)."""

    session = STATE.session
    batch = getattr(session, "_last_batch", None)
    if session is None or not batch:
        return None
    for index, item in enumerate(batch):
        problem = _describe(item[0], item[1])
        if problem is None:
            continue
        import ray.cloudpickle as cloudpickle

        error = TypeError(problem)
        context = session.context
        remote = RemoteError(cloudpickle.dumps(error), "builtins.TypeError", problem,
                             f"TypeError: {problem}\n", context.world_rank, os.getpid(),
                             socket.gethostname())
        return batch[:index], True, None, remote
    return None


def recover_poll(worker: Any, error: BaseException) -> Tuple[List[Item], bool, Any, Any]:
    """On the driver, when ``worker._sgd_poll`` raised ``error``: the reply's sendable part
    and an error naming the unpicklable key, or ``error`` again if that was not the cause."""
    import ray

    if not isinstance(error, TypeError):  # RayTaskError(TypeError) is a TypeError too
        raise error
    try:
        reply = ray.get(worker._sgd_execute.remote(split_unsendable, (), {}))
    except Exception:
        reply = None
    if reply is None:
        raise error
    return reply
