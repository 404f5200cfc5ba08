"""A worker's side of in-place recovery (:mod:`sgd.elastic`): the reset barrier, the commit
count that keys each report, and the interrupt the driver sends.

One :class:`ResetLink` per run per worker (``Session.resets``). The training thread:

- counts commits (:meth:`committed`) and the items sent since the last one: every report and
  checkpoint is keyed ``(commits, items since)``. After a reset the driver says which key it
  delivered last, and the thread sends nothing up to it again (:meth:`skips`): a step redone
  after the last commit is not reported twice, and none is skipped;
- waits at the barrier (:meth:`barrier`): it sends an ``ELASTIC`` item (its commit count, the
  last key it sent, why) and blocks until the driver answers with a :class:`Resume` (the new
  world, where the state comes from, the counters to go on from).

The driver (through the actor, from a control thread) interrupts a run (:meth:`interrupt`):
the thread raises :class:`ResetInterrupt` at its next commit or report; a *hard* interrupt
(after a death) also runs the backend's interrupt hooks (sgd-torch shuts its process group's
connections), so a thread blocked in a collective with a peer that will never answer fails
at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from sgd._common.protocol import ELASTIC
from sgd._common.run_hooks import run_interrupt_hooks
from sgd.errors import PicklableError

Key = Tuple[int, int]


class ResetInterrupt(PicklableError, BaseException):
    """Raised in the training thread at its next ``commit()`` or report once the driver asked
    the group to re-form (a worker was lost, or new ones joined): :func:`sgd.elastic.run`
    catches it. A ``BaseException`` so that a training function's ``except Exception`` does
    not swallow it."""


@dataclass
class Resume:
    """The driver's answer at the barrier.

    :ivar context: this worker's place in the new world (ranks, size), or ``None``: unchanged.
    :ivar load: whether to load the root's snapshot (given beside this) rather than restore
        this worker's own last commit.
    :ivar commits: the commit count to go on from (the root's).
    :ivar iteration: the reports delivered so far (the next report is one more).
    :ivar delivered: the last key delivered: items up to it are not sent again.
    :ivar shard: the dataset shard for the new world (``None``: unchanged).
    :ivar reason: why the group re-formed (for logs).
    """

    context: Any = None
    load: bool = False
    commits: int = 0
    iteration: int = 0
    delivered: Key = (0, 0)
    shard: Any = None
    reason: str = ""


@dataclass(frozen=True)
class Arrival:
    """What a worker tells the driver at the barrier (an ``ELASTIC`` item's data).

    :ivar commits: its commit count; :ivar sent: the last key it sent;
    :ivar reason: why it is here (``"sync"``, or the failure it caught);
    :ivar failed: whether it is here after a failure (not a sync or an interrupt).
    :ivar waits: ``False`` for the note a worker sends when it enters ``sgd.elastic.run``
        (the driver learns the run recovers in place); ``True`` at the barrier.
    """

    commits: int
    sent: Key
    reason: str
    failed: bool
    waits: bool = True


class ResetLink:
    """The reset barrier and counters of one run on one worker (see the module docstring)."""

    def __init__(self, cv: threading.Condition, put: Callable[[str, Any], None], capable: bool = True):
        self._cv = cv
        self._put = put
        #: whether the run's backend can re-form its group in place (told by the driver)
        self.capable = capable
        self.commits = 0
        self._since = 0
        self._skip_through: Key = (0, 0)
        self._requested = False
        self._hard = False
        self._resume: Optional[Tuple[Resume, Any]] = None
        self._waiting = False
        #: the plan a new worker joins with (set when it is started into a re-formed group)
        self.joined: Optional[Tuple[Resume, Any]] = None
        #: whether this worker entered ``sgd.elastic.run`` in this run
        self.entered = False
        #: the run's :class:`sgd.elastic.State` (its last commit is what peers load from it)
        self.state: Any = None
        #: the plan the run last went on from (``None`` before any re-form): which world it is in
        self.plan_key: Any = None

    # --- the training thread -------------------------------------------------------------------

    def skips(self) -> bool:
        """Count the item about to be sent; whether it was delivered before a reset (skip it)."""
        self._since += 1
        # (called at every report: no key is made while nothing was delivered before a reset)
        return self._skip_through != (0, 0) and (self.commits, self._since) <= self._skip_through

    @property
    def sent(self) -> Key:
        return (self.commits, self._since)

    def committed(self) -> None:
        self.commits += 1
        self._since = 0

    def check(self) -> None:
        """Raise :class:`ResetInterrupt` when the driver asked for a reset (only inside
        ``sgd.elastic.run``, which catches it)."""
        if self._requested and self.entered:
            raise ResetInterrupt("the group re-forms")

    def announce(self) -> None:
        """Tell the driver this run recovers in place (no wait)."""
        self._put(ELASTIC, Arrival(self.commits, self.sent, "enter", failed=False, waits=False))

    def barrier(self, reason: str, failed: bool) -> Tuple[Resume, Any]:
        """Tell the driver this worker waits to re-form, and wait for its answer."""
        with self._cv:
            self._requested = False
            self._waiting = True
        self._put(ELASTIC, Arrival(self.commits, self.sent, reason, failed))
        with self._cv:
            while self._resume is None:
                self._cv.wait()
            resume, self._resume = self._resume, None
            self._waiting, self._hard = False, False
        self._go_on(resume[0])
        return resume

    def _go_on(self, plan: Resume) -> None:
        # The same on every worker of the re-formed world: sgd.collective counts its calls afresh in it.
        self.plan_key = (plan.commits, plan.iteration, plan.delivered)
        self.commits = plan.commits
        self._since = 0
        self._skip_through = plan.delivered

    def join(self) -> Tuple[Resume, Any]:
        assert self.joined is not None
        plan, self.joined = self.joined, None
        self._go_on(plan[0])
        return plan

    @property
    def requested(self) -> bool:
        """Whether the driver asked this run to come to the barrier and it has not come yet
        (for a framework's own elastic loop, which checks it at its own sync points: see
        :func:`sgd.elastic.reset_link`)."""
        return self._requested

    @property
    def hard(self) -> bool:
        """Whether the driver interrupted this run hard (a peer died): any failure of the
        training function until the barrier is the interrupt's."""
        return self._hard

    # --- the driver, through the actor ---------------------------------------------------------------

    def interrupt(self, hard: bool) -> bool:
        """Ask the training thread to come to the barrier; whether it is in ``sgd.elastic.run``."""
        with self._cv:
            if self._waiting:
                return True
            self._requested = True
            self._hard = self._hard or hard
            self._cv.notify_all()
        if hard:
            run_interrupt_hooks()
        return self.entered

    def resume(self, plan: Resume, snapshot: Any) -> None:
        with self._cv:
            self._resume = (plan, snapshot)
            self._cv.notify_all()
