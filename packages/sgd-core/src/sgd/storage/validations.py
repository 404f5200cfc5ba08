"""Asynchronous validation of committed checkpoints (Ray 2.60's ``ValidationConfig``), driver side.

A report with ``validation=True`` (or a :class:`sgd.ValidationTaskConfig`) hands its committed
checkpoint to :class:`Validations`: one Ray task at a time, in report order, runs
``fn(checkpoint, **fn_kwargs)`` (the trainer's ``task_config.fn_kwargs`` under the report's own),
on the driver's node (where the run's checkpoints are), beside training. A background thread of
the driver waits for it, so the controller's work per round does not change; when it ends, the
checkpoint's status (``VALIDATED``, ``VALIDATION_FAILED``, ``VALIDATION_TIMEOUT``) and, once
validated, its metrics (the validation's merged in, re-scored) are written to its metadata and the
index of reported checkpoints (:mod:`sgd.storage.reported`), under the manager's lock. The run
ends once every validation asked for has ended (:meth:`Validations.finish`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, Optional, Tuple

from sgd.checkpoint import Checkpoint
from sgd.report_config import ValidationTaskConfig

logger = logging.getLogger("sgd")

#: How long the background thread waits on a validation task at a time (the timeout's resolution).
WAIT_SLICE_S = 0.5


def _run_validation(fn: Any, kwargs: Dict[str, Any], path: str) -> Dict[str, Any]:
    """The Ray task: the user's function on the committed checkpoint; its metrics (a dict)."""

    metrics = fn(Checkpoint.from_directory(path), **kwargs)
    if not isinstance(metrics, dict):
        raise TypeError(f"the validation function must return a dict of metrics, got {type(metrics).__name__}")
    return metrics


class Validations:
    """A run's validations (see the module). ``update(kept, metrics, status)`` records an outcome:
    :meth:`sgd.storage.manager.CheckpointManager.validated`."""

    def __init__(self, config: Any, update: Any, lock: Any):
        self._config = config
        self._update = update
        self._lock = lock  # the manager's
        self._queue: Deque[Tuple[Any, Any]] = deque()
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._busy = False

    def submit(self, kept: Any, spec: Any) -> None:
        """Validate the committed checkpoint ``kept`` (a ``_Kept``) as ``spec`` (``True`` or a
        ``ValidationTaskConfig``) says, after those submitted before it."""
        with self._cv:
            self._queue.append((kept, spec))
            self._busy = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="sgd-validations", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def finish(self, timeout_s: Optional[float] = None) -> bool:
        """Wait until every validation submitted has ended; whether they did within ``timeout_s``."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._busy, timeout_s)

    def _work(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    self._busy = False
                    self._cv.notify_all()
                    return
                kept, spec = self._queue.popleft()
            try:
                metrics, status = self._validate(kept, spec)
            except Exception:  # never leave a checkpoint pending because of sgd's own error
                logger.exception("validating checkpoint %s failed in sgd", kept.path)
                metrics, status = {}, "VALIDATION_FAILED"
            with self._lock:
                self._update(kept, metrics, status)

    def _validate(self, kept: Any, spec: Any) -> Tuple[Dict[str, Any], str]:
        import ray

        task_config = self._config.task_config
        kwargs = dict(task_config.fn_kwargs or {})
        timeout_s = task_config.timeout_s
        if spec is not True and spec is not False:  # a ValidationTaskConfig: its kwargs win
            kwargs.update(spec.fn_kwargs or {})
            timeout_s = spec.timeout_s
        options = dict(self._config.ray_remote_kwargs)
        if "scheduling_strategy" not in options:  # where the run's checkpoints are
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=True)
        task = ray.remote(_run_validation).options(**options).remote(self._config.fn, kwargs, str(kept.path))
        started = time.monotonic()
        while True:
            left = None if timeout_s is None else timeout_s - (time.monotonic() - started)
            if left is not None and left <= 0:
                logger.warning("the validation of checkpoint %s ran past timeout_s=%s; cancelled", kept.path, timeout_s)
                ray.cancel(task, force=True)
                return {}, "VALIDATION_TIMEOUT"
            done, _ = ray.wait([task], timeout=WAIT_SLICE_S if left is None else min(WAIT_SLICE_S, left))
            if done:
                break
        try:
            return ray.get(task), "VALIDATED"
        except Exception as exc:
            logger.error("the validation of checkpoint %s failed: %s", kept.path, exc)
            return {}, "VALIDATION_FAILED"


def no_validation_config_error() -> ValueError:
    return ValueError("sgd.report(validation=...) asks for a validation, but the trainer has no validation_config: "
                      "pass validation_config=sgd.ValidationConfig(fn) to the trainer")



def spec_to_json(spec: Any) -> Any:
    """A report's ``validation=`` as its checkpoint's metadata keeps it (so that a run resumed
    by name validates a checkpoint whose validation had not ended)."""
    if spec is True or spec is False:
        return spec
    return {"fn_kwargs": spec.fn_kwargs, "timeout_s": spec.timeout_s}


def spec_from_json(value: Any) -> Any:
    """:func:`spec_to_json` read back (``True`` for anything it cannot read)."""
    if isinstance(value, dict):

        try:
            return ValidationTaskConfig(dict(value.get("fn_kwargs") or {}), value.get("timeout_s"))
        except (TypeError, ValueError):
            return True
    return True
