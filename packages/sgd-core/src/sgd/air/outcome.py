"""How an AIR/v2 trainer's run ends for its caller: the training function's return value
(:class:`ReturnValue`, ``Result.return_value``) and the exception ``fit()`` raises for a failed
run (:func:`training_failed`), as Ray 2.60 has them.

Which exception, chosen by where the failure happened:

- a worker's: the training function raised on a worker (after the retries of
  ``FailureConfig(max_failures)``), or a worker died past them (a hang counts as a death):
  :class:`sgd.WorkerGroupError`, ``worker_failures`` keyed by the failed worker's world rank;
- anything else is the driver's: a callback raised, the workers could not be placed in
  time, a preprocessor or the backend's setup failed, workers reported out of step:
  :class:`sgd.ControllerError`, never retried.

Either is also an instance of the failure's own class (as Ray AIR 2.x's error was), carries the
run's :class:`sgd.Result` as ``.result`` and has the failure as ``__cause__``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional

from sgd.errors import (
    ControllerError,
    TrainingFailedError,
    TrainingHangError,
    WorkerDiedError,
    WorkerGroupError,
    also_instance_of,
)
from sgd.run.policies import describe_failure, worker_rank
from sgd.session import world_rank
from sgd.utils import wrap_train_func

logger = logging.getLogger("sgd")


class ReturnValue:
    """The training loop as an AIR/v2 trainer runs it: rank 0 returns the loop's return value
    (``Result.return_value``, Ray 2.60's), when it pickles; every other rank returns ``None``, so
    that nothing else crosses to the driver. A value that does not pickle (a model holding a
    lock, an open file) does not fail the run: it is logged and dropped (Ray AIR 2.x's rule was
    to discard every return value)."""

    def __init__(self, loop: Callable[..., Any]):
        self.loop = loop

    def __call__(self, config: Dict[str, Any]) -> Any:

        value = wrap_train_func(self.loop, config)()
        if value is None or world_rank() != 0:
            return None
        import ray.cloudpickle as cloudpickle

        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            logger.warning("the training function returned a %s.%s that cannot be pickled (%s: %s); "
                           "Result.return_value is None", type(value).__module__, type(value).__qualname__,
                           type(exc).__name__, exc)
            return None
        return value


def worker_failures(error: BaseException) -> Dict[int, BaseException]:
    """The failed workers' exceptions by world rank, if ``error`` is a worker's failure; else empty.

    :param error: what the run raised: a worker's own exception (chained to its
        :class:`sgd.WorkerError`), a :class:`sgd.WorkerDiedError`, or the
        :class:`sgd.TrainingFailedError` that gave up on one.
    """
    rank = worker_rank(error)
    if rank is not None:
        return {rank: error}
    if isinstance(error, TrainingFailedError) and not isinstance(error, WorkerDiedError):
        cause = error.__cause__
        if not isinstance(cause, WorkerDiedError):
            return {}
        error = cause
    if isinstance(error, TrainingHangError) and error.stragglers:
        return {r: error for r in error.stragglers}
    if isinstance(error, WorkerDiedError):
        return {error.world_rank: error}
    return {}


def training_failed(error: BaseException, result: Any) -> TrainingFailedError:
    """The exception ``fit()`` raises for the run that ended with ``error``: a
    :class:`sgd.WorkerGroupError` or a :class:`sgd.ControllerError` (module docstring), with
    ``result`` (an :class:`sgd.Result`, whose ``error`` becomes the returned exception) as
    ``.result`` and ``error`` as ``__cause__``."""
    failures = worker_failures(error)
    raised: TrainingFailedError
    if failures:
        single = next(iter(failures.values()))
        message = describe_failure(error) if worker_rank(error) is not None else str(error)
        group: Any = also_instance_of(WorkerGroupError, single) if len({id(f) for f in failures.values()}) == 1 \
            else WorkerGroupError
        raised = group(message, failures, result=result)
    else:
        controller: Any = also_instance_of(ControllerError, error)
        raised = controller(error, result=result)
    raised.__cause__ = error
    if result is not None:
        result.error = raised
    return raised


def first_return(returns: Optional[list]) -> Any:
    """Rank 0's return value (``Result.return_value``) of a finished run's returns."""
    return returns[0] if returns else None


__all__ = ["ReturnValue", "first_return", "training_failed", "worker_failures"]
