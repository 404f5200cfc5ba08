"""What a worker runs when a training function on it raised (a leaf module: imports nothing
of sgd). Backends register through :func:`sgd.backend.on_worker_run_error`; the session runs
them (:mod:`sgd._worker.session`)."""

from __future__ import annotations

import logging
from typing import Callable, List

#: run in the training thread, in order, when a training function raised
RUN_ERROR_HOOKS: List[Callable[[], None]] = []


def run_error_hooks() -> None:
    for hook in list(RUN_ERROR_HOOKS):
        try:
            hook()
        except Exception:  # the run's own error is what the driver reports
            logging.getLogger("sgd").exception("a run-error hook (%r) raised", hook)
