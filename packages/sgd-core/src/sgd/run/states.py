"""The states of a run (:class:`sgd.run.controller.ActiveRun`), each an object carrying its data:
the failure being retried and its attempt, the resize decided, the error the run ends with."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

from sgd.group.status import Barrier
from sgd.run.policies import Failure, Resize


class RunState(enum.Enum):
    """Where an :class:`ActiveRun` is; :attr:`ActiveRun.transitions` records each change."""

    STARTING = "starting"  # the training functions are being started (a failure is pending)
    RUNNING = "running"  # rounds are being collected
    RESTARTING = "restarting"  # after a failure the policy retries: new workers, latest checkpoint
    RESIZING = "resizing"  # a scaling decision: the group is placed anew (not a failure)
    REFORMING = "reforming"  # every worker left waits at the reset barrier: re-formed in place (sgd.elastic)
    FAILING = "failing"  # the policy gave up: the run ends as errored with ``error``
    FINISHED = "finished"
    ERRORED = "errored"
    STOPPED = "stopped"


# --- the states, each with its data ----------------------------------------------------------


@dataclass(frozen=True)
class Starting:
    """The run's start was tried; ``error``: how it failed (decided at the first step)."""

    error: Optional[BaseException] = None
    kind = RunState.STARTING


@dataclass(frozen=True)
class Running:
    kind = RunState.RUNNING


@dataclass(frozen=True)
class Restarting:
    """After ``failure``, the policy's ``attempt``-th retry: new workers, latest checkpoint."""

    failure: Failure
    attempt: int
    kind = RunState.RESTARTING


@dataclass(frozen=True)
class Resizing:
    """The scaling policy's ``resize``: the group placed anew (not a failure)."""

    resize: Resize
    kind = RunState.RESIZING


@dataclass(frozen=True)
class Reforming:
    """The run recovers in place (:mod:`sgd.elastic`): the group re-forms around the workers
    at ``barrier``; ``attempt``: the policy's count when it follows a failure (``0`` for a sync)."""

    barrier: Barrier
    attempt: int
    kind = RunState.REFORMING


@dataclass(frozen=True)
class Failing:
    """The policy gave up: ``error`` is what the user gets."""

    error: BaseException
    kind = RunState.FAILING


@dataclass(frozen=True)
class Ended:
    """Finished, errored or stopped (``kind`` says which)."""

    kind: RunState
    error: Optional[BaseException] = None


State = Union[Starting, Running, Restarting, Resizing, Reforming, Failing, Ended]
_ENDED = (RunState.FINISHED, RunState.ERRORED, RunState.STOPPED)


__all__ = ["Ended", "Failing", "Reforming", "Resizing", "Restarting", "RunState", "Running", "Starting", "State"]
