"""What a worker group tells the run controller, as data.

A group never raises to say how its run is going: :meth:`RunGroup.poll
<sgd.group.protocol.RunGroup.poll>` returns a :class:`Poll`, :meth:`RunGroup.health
<sgd.group.protocol.RunGroup.health>` a :class:`Health`, and every step that can fail
(start, restart, starting a run) returns the failure (or ``None``). The controller reads them
and decides through its policies (:mod:`sgd.run.policies`). Exceptions are kept for what the
user sees at the API's edge and for Ctrl-C.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sgd._common.nodes import NodeInfo
from sgd._common.protocol import CHECKPOINT, CHECKPOINT_KEY, REPORT, Round, decode_round
from sgd._worker.resets import Arrival
from sgd.errors import WorkerDiedError


class PollKind(enum.Enum):
    ROUND = "round"  # every worker sent its next item: ``round``
    FINISHED = "finished"  # every worker's function returned: ``returns``
    ERROR = "error"  # a worker raised, or the workers are out of step: ``error`` (not retried)
    DIED = "died"  # a worker's process (or its host) is gone: ``error``, a WorkerDiedError
    IDLE = "idle"  # nothing within the poll's timeout
    RESET = "reset"  # every worker left waits to re-form in place (sgd.elastic): ``barrier``


@dataclass(frozen=True)
class Poll:
    """One answer of :meth:`RunGroup.poll`.

    :ivar progress: how many items each worker has sent so far in this run (the hang
        watchdog names the ranks that are behind from it).
    :ivar last_progress: when (``time.monotonic()``) any worker last sent an item, ended its
        run or started it.
    :ivar more: for ``ROUND``, the rounds of plain reports that were complete right after
        ``round``, in order: a burst (a run whose workers reported faster than the driver took
        rounds) is handed over in one answer, and the controller takes them one by one.
    """

    kind: PollKind
    round: Optional[Round] = None
    returns: Optional[List[Any]] = None
    error: Optional[BaseException] = None
    progress: List[int] = field(default_factory=list)
    last_progress: float = 0.0
    barrier: Optional[Barrier] = None
    more: Tuple[Round, ...] = ()

    @classmethod
    def of_round(cls, round_: Round, more: Tuple[Round, ...] = ()) -> Poll:
        return cls(PollKind.ROUND, round=round_, more=more)

    @classmethod
    def finished(cls, returns: List[Any]) -> Poll:
        return cls(PollKind.FINISHED, returns=returns)

    @classmethod
    def failed(cls, error: BaseException) -> Poll:
        kind = PollKind.DIED if isinstance(error, WorkerDiedError) else PollKind.ERROR
        return cls(kind, error=error)

    @classmethod
    def reset(cls, barrier: Barrier) -> Poll:
        return cls(PollKind.RESET, barrier=barrier)

    @classmethod
    def idle(cls, progress: List[int], last_progress: float) -> Poll:
        return cls(PollKind.IDLE, progress=list(progress), last_progress=last_progress)


@dataclass(frozen=True)
class Barrier:
    """Every worker still in the group waits at the reset barrier (:mod:`sgd.elastic`): the
    group can re-form in place around them (:meth:`RunGroup.reform`).

    :ivar arrivals: by worker index, what each waiting worker told (its commit count, the
        last item it sent, why it is there): :class:`sgd._worker.resets.Arrival`.
    :ivar gone: by worker index, why a worker is out of the group (its death, or it did not
        come to the barrier in time and was stopped).
    :ivar grew: see below.
    """

    arrivals: Dict[int, Any]
    gone: Dict[int, BaseException] = field(default_factory=dict)
    #: the reset was asked for because new workers wait to join (a collective failed by its
    #: interrupt is then not a failure)
    grew: bool = False

    @property
    def failure(self) -> Optional[BaseException]:
        """What went wrong, for the failure policy (``None``: a sync, nothing failed)."""
        if self.gone:
            return next(iter(self.gone.values()))
        failed = [f"rank {i}: {a.reason}" for i, a in sorted(self.arrivals.items()) if a.failed]
        if failed and not self.grew:
            return WorkerDiedError("a collective failed on every worker with none lost (" + "; ".join(failed)
                                   + "); re-forming the group", -1)
        return None


@dataclass(frozen=True)
class Health:
    """The group's hosts as last read (:meth:`RunGroup.health`).

    :ivar lost: a worker whose host was declared dead (the group must be restarted).
    :ivar draining: the draining hosts the group runs on, by node id.
    """

    lost: Optional[WorkerDiedError] = None
    draining: Dict[str, NodeInfo] = field(default_factory=dict)


HEALTHY = Health()


def report_round(results: List[Dict[str, Any]], checkpoint: Any = None) -> Round:
    """A report round as a group hands it to the controller: one metrics dict per worker, each
    with its ``_training_iteration``; ``checkpoint``: what rank 0 passed with its report
    (``sgd.report(metrics, checkpoint=...)``), as the backend encoded it."""
    items = [dict(r) for r in results]
    if checkpoint is not None and items:
        items[0][CHECKPOINT_KEY] = checkpoint
    return decode_round(REPORT, items)


def checkpoint_round(state: Any, num_workers: int) -> Round:
    """A checkpoint round (every worker called ``sgd.save_checkpoint``; rank 0's ``state`` kept)."""
    return decode_round(CHECKPOINT, [state] + [None] * (num_workers - 1))


__all__ = ["Arrival", "Barrier", "HEALTHY", "Health", "NodeInfo", "Poll", "PollKind", "Round", "checkpoint_round",
           "report_round"]
