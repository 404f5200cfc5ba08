"""Ray Train 2.x's callbacks of ``RunConfig(callbacks=[...])``: :class:`UserCallback` objects, called
on the driver after every report round and after every failure of the workers, with the run's
:class:`TrainRunContext`.

:class:`UserCallbacks` is how an AIR-style trainer calls them: one :class:`sgd.TrainingCallback`
standing for all of a run's user callbacks (a trainer with none adds nothing to a round). Ray's own
``ray.train.UserCallback`` objects (``ray.tune.integration.ray_train.TuneReportCallback``, kept under
its Ray import) are called the same way.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Type

from sgd._common.protocol import DETAIL_KEY, DETAILED_AUTOFILLED_KEYS
from sgd._common.public import public_module
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import Checkpoint
from sgd.errors import WorkerDiedError, WorkerError

logger = logging.getLogger("sgd")

#: Ray's class of v2 user callbacks, by dotted name (recognised without importing Ray Train): where it
#: is defined, and the name Ray gives it (``ray.train`` sets its ``__module__``).
RAY_USER_CALLBACKS = frozenset(("ray.train.v2.api.callback.UserCallback", "ray.train.UserCallback"))

#: What sgd stamps on every report besides the user's metrics (left out of ``after_report``'s).
_STAMPED_KEYS = frozenset(("_training_iteration", "_timestamp", "_time_this_iter_s", DETAIL_KEY,
                           *DETAILED_AUTOFILLED_KEYS))


@public_module("sgd.air")
class UserCallback:
    """Ray Train 2.x's callback (``ray.train.UserCallback``): override either method; both are
    called on the driver (the process that called ``fit()``), never on a worker.

    Pass instances in ``RunConfig(callbacks=[...])``. An exception raised by either method ends the
    run: ``fit()`` raises :class:`sgd.ControllerError` whose ``controller_failure`` is that
    exception, and nothing is retried, as in Ray 2.60.
    """

    def after_report(self, run_context: TrainRunContext, metrics: List[Dict[str, Any]],
                     checkpoint: Optional[Checkpoint]) -> None:
        """Called once every worker reported (``sgd.report``) in a round.

        :param run_context: the run (:class:`TrainRunContext`).
        :param metrics: one dict per worker, ``metrics[i]`` what world rank ``i`` reported (sgd's
            own fields, ``_training_iteration`` and the like, left out, as in Ray).
        :param checkpoint: the checkpoint of this round, already persisted in the run's
            checkpoint folder (``checkpoint.path``), or ``None`` when no worker passed one.
        """

    def after_exception(self, run_context: TrainRunContext, worker_exceptions: Dict[int, Exception]) -> None:
        """Called after a worker failed: its training function raised, or its process died
        (``sgd.WorkerDiedError``), or it hung past ``FailureConfig(hang_timeout_s)``. Called
        before the failure is retried (``FailureConfig(max_failures)``) or ends the run, so once
        per failure, retried or not.

        :param run_context: the run (:class:`TrainRunContext`).
        :param worker_exceptions: the exception by world rank (the training function's own
            exception type, with an :class:`sgd.WorkerError` naming the rank as its ``__cause__``).
        """


@public_module("sgd.air")
@dataclass(frozen=True)
class TrainRunContext:
    """The run a :class:`UserCallback` is called for (Ray Train 2.x's ``TrainRunContext``).

    :ivar run_id: a new id (hex) for each ``fit()``.
    :ivar run_config: the trainer's :class:`sgd.RunConfig`.
    :ivar train_loop_config: the config the training function gets.
    :ivar scaling_config: the trainer's :class:`sgd.ScalingConfig`.
    :ivar backend_config: the framework backend (``sgd_torch.TorchConfig``...).
    :ivar dataset_config: the trainer's dataset config (``None`` when none was passed).
    """

    run_id: str = field(init=False, default_factory=lambda: uuid.uuid4().hex)
    run_config: Any
    train_loop_config: Optional[Dict[str, Any]]
    scaling_config: Any
    backend_config: Any
    dataset_config: Any = None

    def get_run_config(self) -> Any:
        """The run config of this run (Ray's accessor)."""
        return self.run_config


def is_user_callback(value: Any) -> bool:
    """Whether ``value`` is a :class:`UserCallback`, sgd's or Ray Train 2.x's (without importing Ray)."""
    if isinstance(value, UserCallback):
        return True
    return any(f"{c.__module__}.{c.__name__}" in RAY_USER_CALLBACKS for c in type(value).__mro__)


def worker_exceptions(error: BaseException) -> Dict[int, BaseException]:
    """The failed workers of a failure, ``{world rank: exception}``; empty when no worker is to
    blame (the driver's own error, a group that could not be placed)."""
    failures = getattr(error, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        return dict(failures)
    stragglers = getattr(error, "stragglers", None)
    if isinstance(stragglers, list) and stragglers:  # a hang: every straggler is to blame
        return {int(rank): error for rank in stragglers}
    for carrier in (error, error.__cause__):
        if isinstance(carrier, (WorkerError, WorkerDiedError)) and carrier.world_rank >= 0:
            return {carrier.world_rank: error}
    return {}


def user_metrics(result: Dict[str, Any]) -> Dict[str, Any]:
    """What the worker reported, without the fields sgd stamps on every report."""
    return {k: v for k, v in result.items() if k not in _STAMPED_KEYS}


class UserCallbacks(TrainingCallback):
    """Calls a run's :class:`UserCallback` objects from the run's rounds and failures.

    :param callbacks: the user callbacks, in the order given.
    :param context: the run's :class:`TrainRunContext`.
    :param checkpoint_cls: the class of the checkpoint ``after_report`` gets (the trainer's:
        ``TorchCheckpoint`` for a ``TorchTrainer``).
    """

    def __init__(self, callbacks: Sequence[Any], context: TrainRunContext,
                 checkpoint_cls: Type[Checkpoint] = Checkpoint):
        self.callbacks = list(callbacks)
        self.context = context
        self.checkpoint_cls = checkpoint_cls
        #: the committed checkpoint folder of a report, by its ``_training_iteration``
        #: (``TrainingIterator.checkpoint_for``); set once the run's iterator exists.
        self.checkpoint_for: Optional[Callable[[int], Optional[Path]]] = None

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        checkpoint = None
        iteration = results[0].get("_training_iteration") if results else None
        if self.checkpoint_for is not None and iteration:
            path = self.checkpoint_for(int(iteration))
            if path is not None:
                checkpoint = self.checkpoint_cls(path=path)
        self._call("after_report", run_context=self.context, metrics=[user_metrics(r) for r in results],
                   checkpoint=checkpoint)

    def handle_failure(self, error: BaseException, **info: Any) -> None:
        failed = worker_exceptions(error)
        if failed:
            self._call("after_exception", run_context=self.context, worker_exceptions=failed)

    def _call(self, hook: str, **kwargs: Any) -> None:
        # A callback's exception ends the run as it is, never retried (it does not go through the
        # failure policy); fit() raises it as a ControllerError, as Ray 2.60 does.
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(**kwargs)
            except Exception as exc:
                logger.error("%s.%s raised %s: %s; ending the run", type(callback).__name__, hook,
                             type(exc).__name__, exc)
                raise


def user_callbacks_of(trainer: Any, callbacks: Optional[Sequence[Any]]) -> Optional[UserCallbacks]:
    """The :class:`UserCallbacks` of an AIR-style ``trainer`` for one run, or ``None`` when
    ``callbacks`` (its ``RunConfig``'s) hold no user callback: then a round costs nothing more."""
    users = [c for c in (callbacks or ()) if is_user_callback(c)]
    if not users:
        return None
    context = TrainRunContext(
        run_config=trainer.run_config, train_loop_config=trainer.train_loop_config,
        scaling_config=trainer.scaling_config, backend_config=trainer.backend_config,
        dataset_config=getattr(trainer, "dataset_config", None))
    return UserCallbacks(users, context, getattr(trainer, "_checkpoint_cls", Checkpoint))
