"""Collecting report rounds: one item from every worker, in order, decoded.

:class:`RoundCollector` keeps one open call per running worker that fails as soon as its
process dies: its poll (which returns a batch of items), or, while the driver does not poll it
(it holds many of its items, or the worker waits for a checkpoint to be acknowledged or at the
reset barrier), a *watch* call, opened once per run and only then. It lines the items up into
rounds. The calls that start the training function are part of the same wait: the driver
never blocks on one worker's start while another worker's run has already failed (a worker
whose peer raised at once can be stuck in a collective before its own start call returns).

A run therefore costs each worker one start call and its polls (two for a run with one report:
the report, then the end); a worker's output (a ``LOG`` item, from a worker on another host)
comes with its poll replies and goes to ``on_log``.
:meth:`RoundCollector.poll` returns what happened as a :class:`~sgd.group.status.Poll`: a
round, the end, a death (:class:`~sgd.errors.WorkerDiedError`), a worker's own exception
(after the rounds every worker had already reported were handed out), or idle.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from operator import itemgetter
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import ray
from ray.exceptions import RayActorError

from sgd._common.peers import reads_like_peer_failure
from sgd._common.protocol import CHECKPOINT, CHECKPOINT_KEY, LOG, NOTE, REPORT, Item, RemoteError, Round, decode_items
from sgd._common.waits import wait
from sgd._worker.unsendable import recover_poll
from sgd.errors import WorkerDiedError, WorkerError
from sgd.group.resets import ELASTIC, RESET_CHECK_S, ResetBarrier
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


def _awaits_ack(batch: List[Item]) -> bool:
    """Whether the batch ends with an item its worker waits on (a checkpoint): the worker's next
    poll tells it the driver persisted that item, so it is sent only once the driver has."""
    if not batch:
        return False
    last = batch[-1]
    if len(last) == 3:
        return False  # a plain report: (REPORT, metrics, text)
    kind, data = last
    return kind == CHECKPOINT or (kind == REPORT and isinstance(data, dict) and CHECKPOINT_KEY in data)


class RoundCollector(ResetBarrier):
    """Collects per-worker batches into rounds (one item per worker), in order; the reset
    barrier of a run in ``sgd.elastic.run`` is :class:`~sgd.group.resets.ResetBarrier`'s."""

    def __init__(self, workers: List[Any], starts: Optional[List[Optional[ray.ObjectRef]]] = None,
                 lost_hosts: Optional[Callable[[List[int]], List[int]]] = None,
                 on_log: Optional[Callable[[int, bytes], None]] = None):
        n = len(workers)
        self._workers = workers
        self._pending: List[Deque[Item]] = [deque() for _ in range(n)]
        self._done = [False] * n
        self._kind_counts: List[Dict[str, int]] = [{} for _ in range(n)]
        self.returns: List[Any] = [None] * n
        self._error: Optional[RemoteError] = None
        self._drain_deadline = 0.0
        self._inflight: Dict[ray.ObjectRef, int] = {}  # open poll → worker index
        self._polling: set = set()  # indices of the workers with an open poll
        # A death is seen even while the driver waits on another worker's poll: every running
        # worker has a call open that errors as soon as its process dies. A worker whose start
        # call has not returned yet is watched through that call, one with a poll open through
        # the poll, one the driver does not poll now through a watch (opened once, see _watch).
        self._watches: Dict[ray.ObjectRef, int] = {}
        self._watched: set = set()  # indices of the workers with a watch open
        self._starting: Dict[ray.ObjectRef, int] = {}
        for i in range(n):
            start = starts[i] if starts is not None else None
            if start is not None:
                self._starting[start] = i
        self._started = [starts is None or starts[i] is None for i in range(n)]
        self._on_log = on_log
        self._log_failed = False  # a rank log could not be written (said once)
        #: what each worker's run-end hooks said when its run returned (sgd.backend.on_worker_run_end)
        self.notes: List[Optional[Dict[str, Any]]] = [None] * n
        #: when (monotonic) a worker last sent an item, ended or started its run
        self.last_progress = time.monotonic()
        self._init_resets(lost_hosts)

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
        return Poll.of_round(got, self._burst())

    def _burst(self) -> Tuple[Round, ...]:
        """The rounds of plain reports already complete (up to :data:`BURST_ROUNDS`), taken now:
        one poll answer for a burst instead of one per round."""
        pending = self._pending
        if self._arrived or self._gone or self._error is not None or not all(pending):
            return ()
        burst: List[Round] = []
        # Each step in C: only plain reports have three parts (a round of them needs no look inside).
        while len(burst) < BURST_ROUNDS and all(pending) and min(map(len, map(_FIRST, pending))) == 3:
            burst.append(decode_items(list(map(deque.popleft, pending))))
        return tuple(burst)

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
                items = list(map(deque.popleft, self._pending))
                if self._error is None and len(set(map(itemgetter(0), items))) > 1:
                    self._mismatch_kinds(items)
                return decode_items(items)
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
            ready = self._wait(deadline - time.monotonic(), gather=True)
            if not ready:
                return _IDLE
            self._receive(ready)

    def _wait(self, timeout: float, gather: bool = False) -> List[Any]:
        """The calls that returned: every one that has (one ``ray.wait`` for all of them, so
        the driver's waits per round do not grow with the workers), or else the first one
        to return within ``timeout`` (none if it passed). The controller polls in short
        slices, so a signal (Ctrl-C) is handled between them.

        ``gather`` (waiting for a round): first up to :data:`GATHER_S` for every reply the
        round needs (the workers that have no item for it yet), then for the first of any."""
        waiting = [*self._inflight, *self._watches, *self._starting, *self._interrupts]
        if not waiting:
            return []
        ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        if ready or timeout <= 0:
            return ready
        if gather:
            pending = self._pending
            needed = [ref for calls in (self._inflight, self._starting) for ref, i in calls.items() if not pending[i]]
            if needed:
                gather_s = min(timeout, GATHER_S)
                ready, _ = ray.wait(needed, num_returns=len(needed), timeout=gather_s)
                if ready:
                    return ready
                timeout -= gather_s
        if timeout > 0:
            ready, _ = ray.wait(waiting, num_returns=1, timeout=timeout)
        return ready

    def _receive(self, ready: List[Any]) -> None:
        """Take in the calls that returned: a watch (a death, or the run's end) or a poll's batch."""
        replies = self._get_replies([ref for ref in ready if ref in self._inflight or ref in self._starting])
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
                if ref in self._watches:
                    self._check_watch(ref)
                    continue
                if ref in self._starting:
                    i = self._starting[ref]
                    reply = self._start_returned(ref, replies)
                    if reply is None:
                        continue  # a start that did not wait for the first items
                else:
                    i = self._inflight.pop(ref)
                    self._polling.discard(i)
                    reply = replies.get(ref)
                    if reply is None:
                        reply = self._get_poll(ref, i)
                batch, finished, value, error = reply
            except WorkerDiedError as death:
                if not self.elastic:
                    raise
                self._lose(death.world_rank, death)
                continue
            if batch and batch[-1][0] == LOG:
                self._take_log(batch.pop()[1])
            if batch and batch[-1][0] == NOTE:
                self.notes[i] = batch.pop()[1]
            kinds = Counter(map(itemgetter(0), batch))  # one pass in C over every item
            if ELASTIC in kinds:
                for item in batch:
                    if item[0] == ELASTIC:
                        self._take_elastic(i, item[1])
                batch = [item for item in batch if item[0] != ELASTIC]
                del kinds[ELASTIC]
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
            for kind, n in kinds.items():
                counts[kind] = counts.get(kind, 0) + n
            self._pending[i].extend(batch)
            if finished:
                self._done[i] = True
                self.returns[i] = value
            elif (error is None and len(self._pending[i]) < PREFETCH_BELOW and not _awaits_ack(batch)
                  and i not in self._arrived):
                self._poll(i)
            else:
                self._watch(i)  # not polled for now: its death must still be seen

    def _get_replies(self, refs: List[Any]) -> Dict[Any, Any]:
        """The replies of polls (and start calls) that returned, with one ``ray.get`` for all of
        them; empty when one of them failed (each is then read on its own, and the failure said
        for its worker)."""
        if len(refs) < 2:
            return {}
        try:
            return dict(zip(refs, ray.get(refs)))
        except Exception:
            return {}

    def _take_log(self, log: Any) -> None:
        """A worker's output (a ``LOG`` item) to its rank log on the driver's disk."""
        if self._on_log is None:
            return
        rank, data = log
        try:
            self._on_log(rank, data)
        except OSError as exc:
            if not self._log_failed:
                self._log_failed = True
                logger.warning("cannot write rank %s's log on the driver's disk (%s); its output goes to the "
                               "console only", rank, exc)

    def _watch(self, i: int) -> None:
        """Open a watch on worker ``i`` (one per run) unless it has one, or its run is over."""
        if i not in self._watched and not self._done[i] and i not in self._gone:
            self._watched.add(i)
            self._watches[self._workers[i]._sgd_watch.remote()] = i

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
        """A watch call returned: fine if the worker's run ended, a death otherwise."""
        i = self._watches.pop(ref)
        self._get(ref, i)

    def _start_returned(self, ref: Any, replies: Dict[Any, Any]) -> Any:
        """A start call returned: the worker's run started, or it died first. Its reply is the
        run's first poll reply (the worker waited briefly for its first items: one call fewer
        per worker and run), or ``None``: the worker is then polled (or watched) from now on."""
        i = self._starting.pop(ref)
        if ref in replies:
            reply = replies[ref]
        else:
            try:
                reply = ray.get(ref)
            except RayActorError as exc:
                raise WorkerDiedError(
                    f"worker rank {i} died while its training function started: {short_error(exc)}", i
                ) from exc
            except TypeError as exc:  # a reported value that cannot be pickled: say which one
                reply = recover_poll(self._workers[i], exc)
        self._started[i] = True
        self.last_progress = time.monotonic()
        if reply is None:
            if i in self._arrived or self._pending[i] or self._done[i]:
                self._watch(i)
            else:
                self._poll(i)  # its poll is its watch from now on
        return reply

    def _raise_error(self) -> None:
        """Raise the worker's error, unless a worker died: a peer's death makes the others'
        collectives fail ("Connection reset by peer"), and that error can reach the driver
        before the death does. Such an error waits up to ``PEER_FAILURE_GRACE_S`` for it."""
        assert self._error is not None
        grace = PEER_FAILURE_GRACE_S if looks_like_peer_failure(self._error) else 0.0
        deadline = time.monotonic() + grace
        while (self._watches or self._starting or self._inflight
               or (looks_like_peer_failure(self._error) and not all(self._done))):
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
                if ref in self._watches:
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

    def _mismatch_kinds(self, items: List[Item]) -> None:
        detail = ", ".join(
            f"rank {i} called {'save_checkpoint' if item[0] == CHECKPOINT else 'report'}"
            for i, item in enumerate(items)
        )
        raise _Failed(RuntimeError(
            f"workers are out of step: {detail} at the same point. Every worker must call "
            "sgd.report and sgd.save_checkpoint in the same order."
        ))


#: While a round waits for several workers, the driver takes their replies in together, those
#: that came within this long (seconds), instead of waking for each: at N = 32 on two cores a
#: run's replies come over tens of milliseconds, and each wake costs the driver CPU time the
#: workers need. A worker's error or death reaches the controller at most this much later.
GATHER_S = 0.01
_IDLE = object()
_FIRST = itemgetter(0)
#: At most this many rounds in one poll answer's burst (:attr:`Poll.more`).
BURST_ROUNDS = 256
logger = logging.getLogger("sgd")


def short_error(exc: BaseException) -> str:
    """The first line of Ray's (long) actor-death message."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
