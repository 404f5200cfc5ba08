"""Collecting report rounds: one item from every worker, in order, decoded.

:class:`RoundCollector` keeps one open poll per worker (each returns a batch of items) and
one *watch* call per worker that fails as soon as its process dies, and lines the items up
into rounds. The calls that start the training function are part of the same wait: the driver
never blocks on one worker's start while another worker's run has already failed (a worker
whose peer raised at once can be stuck in a collective before its own start call returns).
:meth:`RoundCollector.poll` returns what happened as a :class:`~sgd.group.status.Poll`: a
round, the end, a death (:class:`~sgd.errors.WorkerDiedError`), a worker's own exception
(after the rounds every worker had already reported were handed out), or idle.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import ray
from ray.exceptions import RayActorError

from sgd._common.peers import reads_like_peer_failure
from sgd._common.protocol import CHECKPOINT, CHECKPOINT_KEY, REPORT, RemoteError, decode_round
from sgd._common.waits import wait
from sgd._worker.unsendable import recover_poll
from sgd.errors import WorkerDiedError, WorkerError
from sgd.group.status import Barrier, Poll

#: Most items one poll returns.
POLL_BATCH = 4096
#: A worker's next poll is sent as soon as its batch arrives (while the driver works through the
#: batch, the worker encodes the next one) unless the driver already holds this many of its items.
PREFETCH_BELOW = 4096
#: After a worker error, the reports the other workers had made before it are still collected
#: (every round they complete is delivered) while they keep sending some: the driver gives up
#: once none came for this long (a worker blocked in a collective with the failed one).
ERROR_DRAIN_S = float(os.environ.get("SGD_ERROR_DRAIN_S", "5"))
#: In-place recovery (sgd.elastic): once a reset began, how long the workers still in the group
#: get to come to the barrier (a long step ends first; a hard interrupt fails a blocked
#: collective at once), and how long one gets to answer the interrupt at all (a process that
#: stopped answering, e.g. a silent host). Past either, the worker is stopped and left out.
RESET_TIMEOUT_S = float(os.environ.get("SGD_ELASTIC_RESET_TIMEOUT_S", "60"))
ANSWER_TIMEOUT_S = float(os.environ.get("SGD_ELASTIC_ANSWER_TIMEOUT_S", "5"))
#: While a reset waits, how often the hosts of the workers not yet there are checked.
RESET_CHECK_S = 0.25
ELASTIC = "elastic"

#: An error that reads like a peer's death (its collective lost the connection) is held this
#: long while the driver watches for the death itself, which restarts the group instead.
PEER_FAILURE_GRACE_S = float(os.environ.get("SGD_PEER_FAILURE_GRACE_S", "10"))
def looks_like_peer_failure(err: RemoteError) -> bool:
    """Whether a worker's error is what a collective raises when another worker died: a
    :class:`~sgd.errors.PeerFailureError` (flagged on the worker), or an error whose message
    reads like one of the collectives sgd knows (gloo, NCCL, torch.distributed)."""
    return err.peer_failure or reads_like_peer_failure(err.type_name, err.message)


def remote_exception(err: RemoteError) -> BaseException:
    """The exception a worker raised, rebuilt on the driver with its own type (its pickled
    self when it unpickles here), chained to a :class:`~sgd.errors.WorkerError` that carries
    the remote traceback."""
    head = f"worker rank {err.world_rank} (pid {err.pid} on {err.hostname}) raised {err.type_name}: {err.message}"
    cause = WorkerError(f"{head}\n\nRemote traceback:\n{err.traceback}", err.world_rank, err.traceback)
    exc: Optional[BaseException] = None
    if err.exc_bytes is not None:
        import ray.cloudpickle as cloudpickle

        try:
            exc = cloudpickle.loads(err.exc_bytes)
        except Exception:
            exc = None
    if exc is None:
        return cause
    if hasattr(exc, "add_note"):
        exc.add_note(f"[sgd] raised on {head.split(' raised ')[0]}; remote traceback above")
    exc.sgd_world_rank = err.world_rank  # type: ignore[attr-defined]
    exc.__cause__ = cause
    return exc


class _Failed(Exception):
    """Inside this module only: unwinds to :meth:`RoundCollector.poll`, which returns ``error``."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def _awaits_ack(batch: List[Tuple[str, Any]]) -> bool:
    """Whether the batch ends with an item its worker waits on (a checkpoint): the worker's next
    poll tells it the driver persisted that item, so it is sent only once the driver has."""
    if not batch:
        return False
    kind, data = batch[-1]
    return kind == CHECKPOINT or (kind == REPORT and isinstance(data, dict) and CHECKPOINT_KEY in data)


class RoundCollector:
    """Collects per-worker batches into rounds (one item per worker), in order."""

    def __init__(self, workers: List[Any], starts: Optional[List[Optional[ray.ObjectRef]]] = None,
                 lost_hosts: Optional[Callable[[List[int]], List[int]]] = None):
        n = len(workers)
        self._workers = workers
        self._pending: List[Deque[Tuple[str, Any]]] = [deque() for _ in range(n)]
        self._done = [False] * n
        self._kind_counts: List[Dict[str, int]] = [{} for _ in range(n)]
        self.returns: List[Any] = [None] * n
        self._error: Optional[RemoteError] = None
        self._drain_deadline = 0.0
        self._inflight: Dict[ray.ObjectRef, int] = {}  # open poll → worker index
        self._polling: set = set()  # indices of the workers with an open poll
        # One open call per worker that errors as soon as its process dies, so a
        # death is seen even while the driver waits on another worker's poll. A worker
        # whose start call has not returned yet is watched through that call instead.
        self._watches: Dict[ray.ObjectRef, int] = {}
        self._starting: Dict[ray.ObjectRef, int] = {}
        for i, w in enumerate(workers):
            start = starts[i] if starts is not None else None
            if start is not None:
                self._starting[start] = i
            else:
                self._watches[w._sgd_watch.remote()] = i
        self._started = [starts is None or starts[i] is None for i in range(n)]
        #: when (monotonic) a worker last sent an item, ended or started its run
        self.last_progress = time.monotonic()
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

    def poll(self, timeout_s: float) -> Poll:
        """The next round, the end, a failure, or idle when nothing came within ``timeout_s``.

        When a worker raised, the rounds every worker had already reported are returned
        first (callbacks see them), then the error.
        """
        try:
            got = self._next(time.monotonic() + timeout_s)
        except WorkerDiedError as exc:
            return Poll.failed(exc)
        except _Failed as failed:
            return Poll.failed(failed.error)
        if got is None:
            return Poll.finished(self.returns)
        if got is _IDLE:
            return Poll.idle([sum(c.values()) for c in self._kind_counts], self.last_progress)
        if isinstance(got, Barrier):
            return Poll.reset(got)
        return Poll.of_round(got)

    def _next(self, deadline: float) -> Any:
        """A round, ``None`` (every worker finished) or ``_IDLE`` (nothing by ``deadline``)."""
        while True:
            if self._arrived or self._gone:
                got = self._next_in_reset()
                if got is not None:
                    return got
                if self._error is None:
                    self._poll_live()
                    until = min(deadline, self._reset_time_left(), time.monotonic() + RESET_CHECK_S)
                    ready = self._wait(until - time.monotonic())
                    self._receive(ready)
                    self._check_reset_time()
                    if not ready and time.monotonic() >= deadline:
                        return _IDLE
                    continue
            if all(self._pending):
                items = [p.popleft() for p in self._pending]
                kinds = {k for k, _ in items}
                if len(kinds) > 1 and self._error is None:
                    self._mismatch_kinds(items)
                return decode_round(items[0][0], [d for _, d in items])
            if self._error is not None:
                self._drain_or_raise()
                continue
            if all(self._done):
                if any(self._pending):
                    self._mismatch()
                return None
            if any(self._done[i] and not self._pending[i] for i in range(len(self._pending))) and any(
                self._pending
            ):
                self._mismatch()
            for i in range(len(self._workers)):
                if not self._pending[i] and not self._done[i]:
                    self._poll(i)
            ready = self._wait(deadline - time.monotonic())
            if not ready:
                return _IDLE
            self._receive(ready)

    # --- in-place recovery (sgd.elastic) ---------------------------------------------------------

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
            if any(k != kind for k, _ in items):
                self._mismatch_kinds(items)
            if kind == CHECKPOINT and taken[0] != 0:
                return self._next_in_reset()  # rank 0's state is lost with it: no checkpoint to keep
            return decode_round(kind, [d for _, d in items])
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

    def _wait(self, timeout: float) -> List[Any]:
        """The calls that returned: every one that has (one ``ray.wait`` for all of them, so
        the driver's waits per round do not grow with the workers), or else the first one
        to return within ``timeout`` (none if it passed). The controller polls in short
        slices, so a signal (Ctrl-C) is handled between them."""
        waiting = [*self._inflight, *self._watches, *self._starting, *self._interrupts]
        if not waiting:
            return []
        ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        if not ready and timeout > 0:
            ready, _ = ray.wait(waiting, num_returns=1, timeout=timeout)
        return ready

    def _receive(self, ready: List[Any]) -> None:
        """Take in the calls that returned: a watch (a death, or the run's end) or a poll's batch."""
        for ref in ready:
            if ref in self._interrupts:
                i, _ = self._interrupts.pop(ref)
                try:
                    ray.get(ref)
                except RayActorError as exc:
                    self._lose(i, WorkerDiedError(f"worker rank {i} died: {short_error(exc)}", i))
                continue
            if ref not in self._watches and ref not in self._starting and ref not in self._inflight:
                continue  # a call of a worker that is gone
            try:
                if ref in self._watches or ref in self._starting:
                    self._check_watch(ref)
                    continue
                i = self._inflight.pop(ref)
                self._polling.discard(i)
                batch, finished, value, error = self._get_poll(ref, i)
            except WorkerDiedError as death:
                if not self.elastic:
                    raise
                self._lose(death.world_rank, death)
                continue
            if any(kind == ELASTIC for kind, _ in batch):
                for kind, data in batch:
                    if kind == ELASTIC:
                        self._take_elastic(i, data)
                batch = [item for item in batch if item[0] != ELASTIC]
            if batch or finished or error is not None:
                self.last_progress = time.monotonic()
            if error is not None:
                if self._error is None:
                    self._error = error
                    self._drain_deadline = time.monotonic() + ERROR_DRAIN_S
                elif looks_like_peer_failure(self._error) and not looks_like_peer_failure(error):
                    # The cause beats its echo: a worker that raised releases its process
                    # group (sgd-torch), and its peers' collectives fail with "connection
                    # closed"; one of those can reach the driver first.
                    self._error = error
            counts = self._kind_counts[i]
            for kind, _ in batch:
                counts[kind] = counts.get(kind, 0) + 1
            self._pending[i].extend(batch)
            if finished:
                self._done[i] = True
                self.returns[i] = value
            elif (error is None and len(self._pending[i]) < PREFETCH_BELOW and not _awaits_ack(batch)
                  and i not in self._arrived):
                self._poll(i)

    def _poll(self, i: int) -> None:
        """Open a poll on worker ``i`` unless one is open (or its run has not started yet, or
        it waits at the reset barrier, or is gone)."""
        if i not in self._polling and self._started[i] and i not in self._arrived and i not in self._gone:
            self._polling.add(i)
            self._inflight[self._workers[i]._sgd_poll.remote(POLL_BATCH)] = i

    @staticmethod
    def _get(ref: Any, i: int) -> Any:
        try:
            return ray.get(ref)
        except RayActorError as exc:
            raise WorkerDiedError(f"worker rank {i} died: {short_error(exc)}", i) from exc

    def _get_poll(self, ref: Any, i: int) -> Any:
        try:
            return self._get(ref, i)
        except TypeError as exc:  # a reported value that cannot be pickled: say which one
            return recover_poll(self._workers[i], exc)

    def _drain_or_raise(self) -> None:
        """After a worker error: collect reports the others had already made (briefly: a
        worker blocked in a collective will make none), or raise the error."""
        assert self._error is not None
        waiting = [i for i, p in enumerate(self._pending) if not p]
        if any(self._done[i] for i in waiting):
            self._raise_error()  # a finished worker has nothing more: no round can form
        for i in waiting:
            self._poll(i)
        timeout = self._drain_deadline - time.monotonic()
        ready: List[Any] = []
        if timeout > 0:
            ready = self._wait(timeout)
        if not ready:
            self._raise_error()
        before = sum(map(len, self._pending))
        self._receive(ready)
        if sum(map(len, self._pending)) > before:  # progress: a slow peer is still reporting
            self._drain_deadline = time.monotonic() + ERROR_DRAIN_S

    def _check_watch(self, ref: Any) -> None:
        """A watch call returned: fine if the worker's run ended, a death otherwise. A start
        call returned: the worker's run started (watch it from now on), or it died first."""
        if ref in self._starting:
            i = self._starting.pop(ref)
            try:
                ray.get(ref)
            except RayActorError as exc:
                raise WorkerDiedError(
                    f"worker rank {i} died while its training function started: {short_error(exc)}", i
                ) from exc
            self._started[i] = True
            self.last_progress = time.monotonic()
            self._watches[self._workers[i]._sgd_watch.remote()] = i
            return
        self._get(ref, self._watches.pop(ref))

    def _raise_error(self) -> None:
        """Raise the worker's error, unless a worker died: a peer's death makes the others'
        collectives fail ("Connection reset by peer"), and that error can reach the driver
        before the death does. Such an error waits up to ``PEER_FAILURE_GRACE_S`` for it."""
        assert self._error is not None
        grace = PEER_FAILURE_GRACE_S if looks_like_peer_failure(self._error) else 0.0
        deadline = time.monotonic() + grace
        while self._watches or self._starting or (looks_like_peer_failure(self._error) and not all(self._done)):
            # While the error may be an echo, a worker whose run ended is not yet heard from
            # until its poll returns: its end can reach the driver before its error does.
            if looks_like_peer_failure(self._error):
                # Take in what the other workers return meanwhile: a death (raised), or
                # the error that caused this one (raised instead of it).
                for i in range(len(self._workers)):
                    if not self._done[i]:
                        self._poll(i)
            else:
                deadline = min(deadline, time.monotonic())
            waiting = [*self._watches, *self._starting, *self._inflight]
            # In slices (sgd._common.waits): Ctrl-C is handled between them.
            ready, _ = wait(waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                if ref in self._watches or ref in self._starting:
                    self._check_watch(ref)
                else:
                    self._receive([ref])
            if time.monotonic() >= deadline:
                break
        raise _Failed(remote_exception(self._error))

    def _describe(self) -> str:
        parts = []
        for i, counts in enumerate(self._kind_counts):
            reports = counts.get("report", 0)
            ckpts = counts.get(CHECKPOINT, 0)
            state = "finished" if self._done[i] else "running"
            parts.append(f"rank {i}: {reports} report(s), {ckpts} checkpoint(s) so far, {state}")
        return "; ".join(parts)

    def _mismatch(self) -> None:
        raise _Failed(RuntimeError(
            "workers called sgd.report / sgd.save_checkpoint a different number of times "
            f"({self._describe()}). Every worker must report and checkpoint the same number of times."
        ))

    def _mismatch_kinds(self, items: List[Tuple[str, Any]]) -> None:
        detail = ", ".join(
            f"rank {i} called {'save_checkpoint' if k == CHECKPOINT else 'report'}" for i, (k, _) in enumerate(items)
        )
        raise _Failed(RuntimeError(
            f"workers are out of step: {detail} at the same point. Every worker must call "
            "sgd.report and sgd.save_checkpoint in the same order."
        ))


_IDLE = object()
logger = logging.getLogger("sgd")


def short_error(exc: BaseException) -> str:
    """The first line of Ray's (long) actor-death message."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
