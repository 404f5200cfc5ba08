"""The run controller's two policies. Each *returns* a decision; only the controller acts.

- :class:`FailurePolicy` ``.decide(failure) -> Retry | Raise``: a worker death is retried
  while ``max_retries`` allows, then ends in :class:`~sgd.errors.TrainingFailedError` whose
  ``__cause__`` is the last death; any other error (a user exception on a worker, a
  callback's) is raised as it is.
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
from sgd.errors import TrainingFailedError, WorkerDiedError

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
    """Counts worker deaths against ``max_retries`` (``-1``: unlimited).

    The run controller holds one and resets it (:meth:`reset`) for each scope it guards (a trainer's
    ``start``, one run), so that deaths while the group starts, while the run starts, mid-run
    or while restarting all count against the same limit. It is the only retry counter: the
    launcher, the AIR and v1 trainers and sgd-horovod read ``failures`` (the controller's
    ``attempt``) rather than counting on their own.
    """

    def __init__(self, max_retries: int):
        self.max_retries = max_retries
        self.failures = 0

    def reset(self, max_retries: Optional[int] = None) -> None:
        """Start a new scope (the group's start, or a run): no failures so far; ``max_retries``,
        when given, is the new scope's limit (a trainer's may change between runs)."""
        if max_retries is not None:
            self.max_retries = max_retries
        self.failures = 0

    def decide(self, failure: Failure) -> Union[Retry, Raise]:
        error = failure.error
        if not isinstance(error, WorkerDiedError):
            return Raise(error)  # a user's exception is not retried: it would happen again
        self.failures += 1
        limit = self.max_retries
        if limit != -1 and self.failures > limit:
            n = self.failures
            given_up = TrainingFailedError(
                f"training failed after {n} attempt{'s' if n != 1 else ''} (max_retries={limit}); "
                f"last failure, while {failure.phase}: {error}"
            )
            given_up.__cause__ = error
            return Raise(given_up)
        logger.warning("%s; restarting the workers (failure %d of %s)", error, self.failures,
                       "unlimited" if limit == -1 else limit)
        return Retry(self.failures)


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


__all__ = ["ClusterView", "Failure", "FailurePolicy", "NoOp", "Raise", "Resize", "Retry", "ScalingPolicy", "Wait"]
