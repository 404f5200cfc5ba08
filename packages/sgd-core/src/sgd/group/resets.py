"""The reset barrier of a run in ``sgd.elastic.run``, as the round collector keeps it.

:class:`ResetBarrier` is mixed into :class:`~sgd.group.rounds.RoundCollector`: it tracks which
workers wait at the barrier (their ``ELASTIC`` item) and which are gone (dead, on a lost host,
or stopped for not answering), interrupts the others, delivers the rounds only some workers
finished, and yields a :class:`~sgd.group.status.Barrier` once every worker left waits. The
collector calls :meth:`ResetBarrier._next_in_reset` while a reset is on and reports deaths to
:meth:`ResetBarrier._lose` instead of failing the run.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from sgd._common.protocol import CHECKPOINT, ELASTIC, Item, decode_items
from sgd.errors import WorkerDiedError
from sgd.group.status import Barrier

logger = logging.getLogger("sgd")

#: In-place recovery (sgd.elastic): once a reset began, how long the workers still in the group
#: get to come to the barrier (a long step ends first; a hard interrupt fails a blocked
#: collective at once), and how long one gets to answer the interrupt at all (a process that
#: stopped answering, e.g. a silent host). Past either, the worker is stopped and left out.
RESET_TIMEOUT_S = float(os.environ.get("SGD_ELASTIC_RESET_TIMEOUT_S", "60"))
ANSWER_TIMEOUT_S = float(os.environ.get("SGD_ELASTIC_ANSWER_TIMEOUT_S", "5"))
#: While a reset waits, how often the hosts of the workers not yet there are checked.
RESET_CHECK_S = 0.25


class ResetBarrier:
    """The reset state of one run's workers (see the module docstring). The collector provides
    ``_workers``, ``_pending``, ``_done``, ``_polling``, the open calls (``_inflight``,
    ``_watches``, ``_starting``), ``_poll`` and ``_mismatch_kinds``."""

    _workers: List[Any]
    _pending: List[Any]
    _done: List[bool]
    _polling: set
    _inflight: Dict[Any, int]
    _watches: Dict[Any, int]
    _starting: Dict[Any, int]

    def _poll(self, i: int) -> None: ...

    def _mismatch_kinds(self, items: List[Item]) -> None: ...

    def _init_resets(self, lost_hosts: Optional[Callable[[List[int]], List[int]]]) -> None:
        # In-place recovery (sgd.elastic): whether the run announced it; the workers waiting at
        # the reset barrier (index -> Arrival) and the ones out of the group (index -> why);
        # the interrupts sent (call -> (index, when)); when the reset's time is up.
        self.elastic = False
        self._arrived: Dict[int, Any] = {}
        self._gone: Dict[int, BaseException] = {}
        self._interrupts: Dict[ray.ObjectRef, Tuple[int, float]] = {}
        self._interrupted_hard = False
        self._reset_deadline: Optional[float] = None
        self._growing = False
        # Which of the given workers run on a host that is gone (its raylet refuses connections):
        # Ray itself takes seconds to fail the calls to them. Asked while a reset waits.
        self._lost_hosts = lost_hosts
        self._next_host_check = 0.0

    def _next_in_reset(self) -> Any:
        """While the group waits to re-form: a round from the items that workers out of the
        stream (gone, or waiting) left, or the :class:`Barrier` once every live worker waits
        and its items are all delivered; ``None``: wait for more."""
        n = len(self._workers)
        out = set(self._gone) | set(self._arrived)
        if any(self._done[i] for i in range(n) if i not in self._gone):
            # A run that already returned cannot re-form: the group restarts from the checkpoint.
            raise next(iter(self._gone.values()), None) or WorkerDiedError(
                "a worker's run ended while its group re-formed", -1)
        live_items = [i for i in range(n) if i not in self._gone and self._pending[i]]
        if live_items and all(self._pending[i] or i in out for i in range(n)):
            # A round only some finished: delivered with what the others sent (the workers that
            # are gone may have sent theirs; items only they sent are redone by the survivors).
            taken = [i for i in range(n) if self._pending[i]]
            items = [self._pending[i].popleft() for i in taken]
            kind = items[0][0]
            if any(item[0] != kind for item in items):
                self._mismatch_kinds(items)
            if kind == CHECKPOINT and taken[0] != 0:
                return self._next_in_reset()  # rank 0's state is lost with it: no checkpoint to keep
            return decode_items(items)
        if all(i in out for i in range(n)) and not live_items:
            if not self._arrived:  # every worker is gone: nothing to re-form
                first = next(iter(self._gone.values()))
                lost = WorkerDiedError(f"every worker of the group was lost (the first: {first})", -1)
                lost.lost_every_worker = True  # type: ignore[attr-defined]
                lost.__cause__ = first
                raise lost
            for i in self._gone:
                self._pending[i].clear()
            return Barrier(dict(self._arrived), dict(self._gone), grew=self._growing)
        return None

    def _poll_live(self) -> None:
        for i in range(len(self._workers)):
            if not self._pending[i] and not self._done[i] and i not in self._gone and i not in self._arrived:
                self._poll(i)

    def _reset_time_left(self) -> float:
        return self._reset_deadline if self._reset_deadline is not None else float("inf")

    def _begin_reset(self, hard: bool) -> None:
        """Ask every worker still running to come to the barrier (hard: a peer died, fail the
        collectives it is blocked in)."""
        now = time.monotonic()
        if self._reset_deadline is None:
            logger.info("the group re-forms in place: %s", "new workers join" if self._growing else
                        next((f"rank {i}: {a.reason}" for i, a in self._arrived.items() if a.failed), None)
                        or next((str(e) for e in self._gone.values()), "asked"))
            self._reset_deadline = now + RESET_TIMEOUT_S
        elif not hard or self._interrupted_hard:
            return
        self._interrupted_hard = self._interrupted_hard or hard
        for i, w in enumerate(self._workers):
            if i not in self._gone and i not in self._arrived and not self._done[i]:
                self._interrupts[w._sgd_elastic_interrupt.remote(hard)] = (i, now)

    def request_reset(self) -> None:
        """Ask every worker to come to the barrier at its next commit or report (new workers
        are waiting to join: not a failure)."""
        self._growing = True
        self._begin_reset(hard=False)

    def _lose(self, i: int, error: BaseException) -> None:
        """Worker ``i`` is out of the group (dead, or stopped for not answering)."""
        self._gone.setdefault(i, error)
        self._arrived.pop(i, None)
        self._polling.discard(i)
        for calls in (self._inflight, self._watches, self._starting):
            for ref in [r for r, j in calls.items() if j == i]:
                del calls[ref]
        for ref in [r for r, (j, _) in self._interrupts.items() if j == i]:
            del self._interrupts[ref]
        self._begin_reset(hard=True)

    def _check_reset_time(self) -> None:
        """Stop the workers that did not answer the interrupt, or did not come in time; leave
        out at once the ones whose host is gone."""
        now = time.monotonic()
        if self._reset_deadline is not None and self._lost_hosts is not None and now >= self._next_host_check:
            self._next_host_check = now + RESET_CHECK_S
            waiting = [i for i in range(len(self._workers))
                       if i not in self._gone and i not in self._arrived and not self._done[i]]
            for i in self._lost_hosts(waiting) if waiting else []:
                self._lose(i, WorkerDiedError(f"worker rank {i} is gone: its host does not answer", i))
            now = time.monotonic()
        late = [(i, f"did not answer within {ANSWER_TIMEOUT_S:.3g}s (its process or host stopped responding)")
                for (i, sent) in self._interrupts.values() if now - sent >= ANSWER_TIMEOUT_S]
        if self._reset_deadline is not None and now >= self._reset_deadline:
            late += [(i, f"did not come to the reset within {RESET_TIMEOUT_S:.3g}s (SGD_ELASTIC_RESET_TIMEOUT_S)")
                     for i in range(len(self._workers)) if i not in self._gone and i not in self._arrived]
        for i, why in late:
            if i in self._gone:
                continue
            try:
                ray.kill(self._workers[i], no_restart=True)
            except Exception:
                pass
            self._lose(i, WorkerDiedError(f"worker rank {i} {why}; stopped and left out of the group", i))

    def _take_elastic(self, i: int, arrival: Any) -> None:
        self.elastic = True
        if not arrival.waits:
            return
        self._arrived[i] = arrival
        self._polling.discard(i)
        for ref in [r for r, (j, _) in self._interrupts.items() if j == i]:
            del self._interrupts[ref]
        if arrival.failed or self._growing:
            # After a failure, or once the first worker waits for new ones to join: the others
            # may be blocked in a collective the waiting ones will not join; fail it now.
            self._begin_reset(hard=True)
        elif self._reset_deadline is None:
            self._reset_deadline = time.monotonic() + RESET_TIMEOUT_S  # a sync: everyone comes by itself


__all__ = ["ANSWER_TIMEOUT_S", "ELASTIC", "RESET_CHECK_S", "RESET_TIMEOUT_S", "ResetBarrier"]
