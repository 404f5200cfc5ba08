"""The run controller's two policies. Each *returns* a decision; only the controller acts.

- :class:`FailurePolicy` ``.decide(failure) -> Retry | Raise``: a worker death is retried
  while ``max_retries`` allows, then ends in :class:`~sgd.errors.TrainingFailedError` whose
  ``__cause__`` is the last death. An exception a training function raised on a worker is
  retried the same way only where the scope says so (``retry_worker_errors``: the AIR/v2
  trainers' ``FailureConfig(max_failures)``, as Ray 2.x), and raised as it is once the retries
  run out; any other error (a callback's, the driver's own) is raised as it is.
- :class:`ScalingPolicy` ``.decide(cluster, current) -> Resize | Wait | NoOp``: how many
  workers a group should have, given what the cluster has room for now. Draining hosts are
  left when the rest has room (after a checkpoint, or when the drain deadline is near); an
  elastic group grows toward its max when room appears; the size of a (re)start is the
  room clamped to ``[min, max]``.

Both are plain objects with no Ray in them, so they are tested as functions
(``packages/sgd-core/tests/test_policies.py``) and a different policy is one class away.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional, Union

from sgd._common.nodes import NodeInfo
from sgd.errors import TrainingFailedError, WorkerDiedError, WorkerError

logger = logging.getLogger("sgd")


# --- failures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """Something went wrong while the controller was ``phase`` ("starting the workers", "training"...)."""

    error: BaseException
    phase: str


@dataclass(frozen=True)
class Retry:
    """Restart the workers from the latest checkpoint; ``attempt`` failures so far."""

    attempt: int


@dataclass(frozen=True)
class Raise:
    """Give up: the controller raises ``error`` (and the run ends as errored)."""

    error: BaseException


class FailurePolicy:
    """Counts worker failures against ``max_retries`` (``-1``: unlimited).

    A worker's death (:class:`~sgd.errors.WorkerDiedError`, a hang included) is always a
    failure to retry. An exception the training function raised on a worker (one whose
    ``__cause__`` is the :class:`~sgd.errors.WorkerError` naming its rank) is one too when
    ``retry_worker_errors`` is set for the scope: the rule of Ray 2.x's
    ``FailureConfig(max_failures)``, which the AIR/v2 trainers follow. Without it (Ray Train
    1.x's ``Trainer(max_retries=)``) such an exception is raised at once, as it is.

    The run controller holds one and resets it (:meth:`reset`) for each scope it guards (a trainer's
    ``start``, one run), so that deaths while the group starts, while the run starts, mid-run
    or while restarting all count against the same limit. It is the only retry counter: the
    launcher, the AIR and v1 trainers and sgd-horovod read ``failures`` (the controller's
    ``attempt``) rather than counting on their own.

    :param max_retries: failures recovered from; ``-1``: unlimited.
    :param retry_worker_errors: also retry a training function's exception (see above).
    """

    def __init__(self, max_retries: int, retry_worker_errors: bool = False):
        self.max_retries = max_retries
        self.retry_worker_errors = retry_worker_errors
        self.failures = 0

    def reset(self, max_retries: Optional[int] = None, retry_worker_errors: bool = False) -> None:
        """Start a new scope (the group's start, or a run): no failures so far; ``max_retries``,
        when given, is the new scope's limit (a trainer's may change between runs);
        ``retry_worker_errors``: whether this scope retries a training function's exception
        (a run of an AIR/v2 trainer does; the group's start never does)."""
        if max_retries is not None:
            self.max_retries = max_retries
        self.retry_worker_errors = retry_worker_errors
        self.failures = 0

    def decide(self, failure: Failure) -> Union[Retry, Raise]:
        error = failure.error
        died = isinstance(error, WorkerDiedError)
        if not died and not (self.retry_worker_errors and worker_rank(error) is not None):
            return Raise(error)  # Ray 1.x's rule: a user's exception would happen again
        self.failures += 1
        limit = self.max_retries
        n = self.failures
        if limit != -1 and n > limit:
            if not died:
                # Raised as it is (its own type, its rank and remote traceback as __cause__):
                # Trainer.run's contract; fit() wraps it in a WorkerGroupError.
                logger.error("%s; giving up after %d attempt%s (max_failures=%s)", describe_failure(error), n,
                             "s" if n != 1 else "", limit)
                return Raise(error)
            given_up = TrainingFailedError(
                f"training failed after {n} attempt{'s' if n != 1 else ''} (max_retries={limit}); "
                f"last failure, while {failure.phase}: {error}"
            )
            given_up.__cause__ = error
            return Raise(given_up)
        logger.warning("%s; restarting the workers from the latest checkpoint (failure %d of %s)",
                       describe_failure(error), n, "unlimited" if limit == -1 else limit)
        return Retry(n)


def worker_rank(error: BaseException) -> Optional[int]:
    """The world rank of the worker whose training function raised ``error`` (the original
    exception rebuilt on the driver, whose ``__cause__`` is a :class:`~sgd.errors.WorkerError`,
    or that :class:`~sgd.errors.WorkerError` itself when the original did not unpickle), else
    ``None`` (a death, a callback's or the driver's own error)."""
    if isinstance(error, WorkerError):
        return error.world_rank
    cause = error.__cause__
    if isinstance(cause, WorkerError):
        return cause.world_rank
    return None


def describe_failure(error: BaseException) -> str:
    """One line for the log: what failed, and where (a worker's rank, type and message)."""
    rank = worker_rank(error)
    if rank is None or isinstance(error, WorkerError):
        return str(error).split("\n", 1)[0]
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"worker rank {rank} raised {name}: {str(error).splitlines()[0] if str(error) else ''}"


# --- sizes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterView:
    """What the controller read of the cluster for one scaling decision.

    :param room: how many workers the group could have if it were placed anew now: free
        resources plus the group's own, lost and draining hosts left out.
    :param draining: the draining hosts the group runs on, by node id.
    :param deadline_near: a draining host's deadline is closer than ``SGD_DRAIN_MARGIN_S``
        and no checkpoint came since the notice.
    """

    room: int
    draining: Dict[str, NodeInfo] = field(default_factory=dict)
    deadline_near: bool = False


@dataclass(frozen=True)
class Resize:
    """Restart the group from the latest checkpoint with ``num_workers`` (placed anew: off
    draining and lost hosts); not counted as a failure."""

    num_workers: int
    reason: str


@dataclass(frozen=True)
class Wait:
    """Something should change but cannot now (no room elsewhere): keep going as is."""

    reason: str


@dataclass(frozen=True)
class NoOp:
    """Nothing to change."""


class ScalingPolicy:
    """Sizes a group of ``min_workers..max_workers`` (equal for a fixed-size group)."""

    def __init__(self, min_workers: int, max_workers: int):
        if not 1 <= min_workers <= max_workers:
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {min_workers}, {max_workers}")
        self.min_workers = min_workers
        self.max_workers = max_workers

    @property
    def elastic(self) -> bool:
        return self.min_workers != self.max_workers

    def size(self, room: int) -> int:
        """The size to (re)start with when ``room`` workers fit: never below min (the
        placement then waits for room), never above max."""
        return max(self.min_workers, min(self.max_workers, room))

    def decide(self, cluster: ClusterView, current: int) -> Union[Resize, Wait, NoOp]:
        """After a checkpoint (or when a drain deadline is near): should the group move or grow?

        :param current: the group's size now.
        """
        if cluster.draining:
            where = ", ".join(n.describe() for n in cluster.draining.values())
            if cluster.room >= self.min_workers:
                why = ("its deadline is near and no checkpoint came since the notice" if cluster.deadline_near
                       else "checkpoint committed")
                return Resize(self.size(cluster.room), f"host {where} is draining; {why}, leaving it")
            return Wait(f"host {where} is draining, but the other hosts have room for {cluster.room} of the "
                        f"{self.min_workers} workers needed; staying on it until it goes")
        if self.elastic and current < self.max_workers and min(cluster.room, self.max_workers) > current:
            n = min(cluster.room, self.max_workers)
            return Resize(n, f"room for {n} workers (running {current}, max {self.max_workers})")
        return NoOp()


__all__ = ["ClusterView", "Failure", "FailurePolicy", "NoOp", "Raise", "Resize", "Retry", "ScalingPolicy", "Wait",
           "describe_failure", "worker_rank"]
