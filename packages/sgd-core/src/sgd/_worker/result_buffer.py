"""A worker session's result buffer: the items the training thread queues and the driver polls.

:class:`_ResultBuffer` is the buffer part of :class:`sgd._worker.session.Session` (a mixin: the
session sets its state up): ``_put`` queues an item for the driver (a report, a checkpoint, a
reset-barrier item), blocking while the buffer is full; :meth:`_ResultBuffer.poll` hands the
driver every item available in one actor call (see :mod:`sgd._worker.session`), with the run's
end, its value or its error (:meth:`_ResultBuffer._capture`). :class:`RunStopped` is what the
training thread's next buffer call raises once the driver stopped the run.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from itertools import repeat
from operator import itemgetter
from typing import Any, Deque, Dict, List, Optional, Tuple

from sgd._common.protocol import (
    CHECKPOINT,
    DETAIL_KEY,
    ELASTIC,
    LINE_KEY,
    LOG,
    NOTE,
    REPORT,
    Item,
    RemoteError,
    encode_line,
    plain_report,
)
from sgd._common.public import public_module
from sgd._worker.driver_disk import _DriverDisk
from sgd._worker.rank_logs import PendingOutput
from sgd._worker.report_fields import ReportFields
from sgd._worker.uploads import CheckpointUploadError
from sgd.errors import PeerFailureError, PicklableError

_METRICS = itemgetter(1)

#: How many items a worker may buffer ahead of the driver before ``report`` blocks.
DEFAULT_MAX_PENDING = int(os.environ.get("SGD_MAX_PENDING_RESULTS", "1024"))


class _Item:
    __slots__ = ("kind", "data", "acked", "sync", "ready")

    def __init__(self, kind: str, data: Any, sync: bool = False, ready: bool = True):
        self.kind = kind
        self.data = data
        self.acked = False
        # False while its checkpoint uploads in the background (ASYNC): it and what follows wait.
        self.ready = ready
        # The worker waits until the driver has processed it (checkpoints).
        self.sync = sync or kind == CHECKPOINT


@public_module("sgd._worker.session")
class RunStopped(PicklableError, BaseException):
    """Raised in the training thread by its next ``sgd.report`` / ``sgd.save_checkpoint`` once
    the driver stopped the run (:meth:`sgd.TrainingIterator.stop`). A ``BaseException`` so
    that a training function's ``except Exception`` does not swallow it; the run ends cleanly."""


class _ResultBuffer(_DriverDisk):
    """The result buffer of :class:`sgd._worker.session.Session` (a mixin: the session's
    ``__init__`` sets the state declared here)."""

    _lock: threading.RLock
    _cv: threading.Condition
    _items: Deque[Any]
    _polls_waiting: int
    _lingering: bool
    _urgent: bool
    _delivered_checkpoints: List[_Item]
    _finished: bool
    _result: Any
    _error: Optional[RemoteError]
    _stopping: bool
    _max_pending: int
    _notes: Optional[Dict[str, Any]]
    _output: PendingOutput
    _fields: ReportFields
    _upload_failure: Optional[RemoteError]

    def _capture(self, exc: BaseException) -> RemoteError:
        import ray.cloudpickle as cloudpickle

        tb = traceback.format_exc()
        exc_bytes: Optional[bytes]
        try:
            exc_bytes = cloudpickle.dumps(exc)
            cloudpickle.loads(exc_bytes)
        except Exception:  # an exception that does not survive pickling
            exc_bytes = None
        return RemoteError(
            exc_bytes,
            f"{type(exc).__module__}.{type(exc).__qualname__}",
            str(exc),
            tb,
            self.context.world_rank,
            os.getpid(),
            socket.gethostname(),
            peer_failure=isinstance(exc, PeerFailureError),
        )

    # --- called from the training thread ------------------------------------
    def request_stop(self) -> None:
        """Make the training thread's next (or current, blocked) report or checkpoint raise
        :class:`RunStopped`. Called from the driver through the actor."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def _wait(self) -> None:
        """Wait on the condition (held by the caller); raise once the run is stopped."""
        if self._stopping:
            raise RunStopped()
        self._cv.wait()
        if self._stopping:
            raise RunStopped()

    def _put(self, item: Any) -> None:
        """Queue an :class:`_Item`, or a plain report as it travels, ``(REPORT, metrics)``: no
        item object, as it is never waited on and never urgent (the common report)."""
        with self._lock:
            if self._stopping:
                raise RunStopped()
            if self._upload_failure is not None:
                raise CheckpointUploadError(f"an asynchronous checkpoint upload failed: "
                                            f"{self._upload_failure.message}; the checkpoint was not committed (the "
                                            "previous one is the latest)")
            while len(self._items) >= self._max_pending:
                self._wait()
            self._items.append(item)
            urgent = type(item) is not tuple and (item.sync or item.kind == ELASTIC)
            self._urgent = self._urgent or urgent
            # Only a poll waiting for an item wakes for a report (a lingering one waits for the end).
            if self._polls_waiting or (urgent and self._lingering):
                self._cv.notify_all()
    def _drop_from_first_unready(self) -> None:
        """Forget the first report whose upload has not landed and every item after it (the
        run failed: they are never sent). Called with the lock held."""
        for index, item in enumerate(self._items):
            if type(item) is _Item and not item.ready:
                for _ in range(len(self._items) - index):
                    self._items.pop()
                return

    def _sendable(self) -> bool:
        """Whether an item can go out now (the first is not waiting for its upload)."""
        items = self._items
        return bool(items) and (type(items[0]) is tuple or items[0].ready)
    def check_stopped(self) -> None:
        """Raise :class:`RunStopped` once the driver stopped the run (a wait in the training
        thread that is not on the session's condition calls it)."""
        if self._stopping:
            raise RunStopped()
    # --- called by the driver through the actor -------------------------------

    def poll(self, max_items: int, timeout_s: Optional[float] = None,
             linger_s: float = 0.0) -> Tuple[List[Item], bool, Any, Optional[RemoteError]]:
        """Block until items are available or the run ended (or ``timeout_s`` passed: then
        the batch may be empty); return a batch. ``linger_s``: once items are there, wait up to
        that much longer for the run to end, so that a short run's end comes with them.

        :returns: ``(items, finished, return_value, error)``; ``finished`` is
            only true once every item has been handed out.
        """
        with self._cv:
            # This call means the driver processed everything it got before.
            if self._delivered_checkpoints:
                for item in self._delivered_checkpoints:
                    item.acked = True
                self._delivered_checkpoints.clear()
                self._cv.notify_all()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while not self._sendable() and not self._finished and self._upload_failure is None:
                now = time.monotonic()
                due = self._output.due_in(now)
                if due is not None and due <= 0:
                    break  # output waited long enough: sent alone
                left = None if deadline is None else deadline - now
                if left is not None and left <= 0:
                    break
                if due is not None:
                    left = due if left is None else min(left, due)
                self._polls_waiting += 1
                try:
                    self._cv.wait(left)
                finally:
                    self._polls_waiting -= 1
            if linger_s and self._items and not self._finished:
                until = time.monotonic() + linger_s
                self._lingering = True
                try:
                    while not self._finished and not self._urgent and (left := until - time.monotonic()) > 0:
                        self._cv.wait(left)
                finally:
                    self._lingering = False
            self._urgent = False
            items = self._items
            plain: List[Dict[str, Any]] = []  # the batch's metrics when it holds only plain reports
            batch: List[Any] = []
            if len(items) <= max_items and _Item not in map(type, items):
                plain = list(map(_METRICS, items))  # the common batch: every report queued
                items.clear()
            while items and len(batch) < max_items:
                if type(items[0]) is not tuple and not items[0].ready:
                    break  # its upload is running: it, and what follows, go out once it landed
                item = items.popleft()
                batch.append(item)
                if type(item) is not tuple and item.sync:  # a tuple: a plain report (see report)
                    self._delivered_checkpoints.append(item)
                    break
            self._cv.notify_all()
            finished = self._finished and not self._items
            failure = self._upload_failure
            if failure is not None and not self._sendable():
                # An ASYNC upload failed: the run's error now (as in Ray), what came before it sent.
                self._drop_from_first_unready()
                finished = True
            log = self._output.take()
        # Each report's results.jsonl text is encoded here, in the worker (outside the lock, so
        # the training thread goes on reporting), so that the driver's work per round does not
        # grow with the values every worker reports (issue 20); a batch of plain reports with one
        # encoder call (ReportFields.lines).
        # The detailed values are in that text; they travel on their own only with a checkpoint
        # (the manager files them with it): the driver reads them back from the text when asked.
        # A plain report travels as (REPORT, metrics, text) (sgd._common.protocol): the driver
        # lines a round up without touching its dicts. One with a checkpoint keeps its parts in it.
        if plain:
            sent: List[Item] = list(zip(repeat(REPORT), plain, self._fields.lines(plain)))
        else:
            sent = []
            texts = iter(self._fields.lines([entry[1] for entry in batch if type(entry) is tuple]))
            for entry in batch:
                if type(entry) is tuple:
                    sent.append(plain_report(entry[1], next(texts)))
                    continue
                kind, data = entry.kind, entry.data
                if kind == REPORT and isinstance(data, dict) and LINE_KEY not in data:
                    when = data.get(DETAIL_KEY)
                    if when is not None:
                        data[DETAIL_KEY] = self._fields.detail(when)
                    data[LINE_KEY] = encode_line(data)
                sent.append((kind, data))
        batch = self._last_batch = sent  # kept until the next poll: see sgd._worker.unsendable
        if finished and self._notes is not None:
            batch = batch + [(NOTE, self._notes)]
        if log is not None:
            batch = batch + [(LOG, (self.context.world_rank, log))]
        error = (self._error or failure) if finished else None
        return batch, finished, self._result if finished and error is None else None, error

    def send_log(self, data: bytes) -> None:
        """Output of this worker's run for the driver's copy of its rank log (a worker on
        another host than the driver's: :class:`~sgd._worker.rank_logs.RankLog`'s sink). It
        travels with the next poll reply, which comes at the latest :data:`FLUSH_S` seconds
        (or :data:`FLUSH_BYTES`) later, with the run's last reply for what is left at its end."""
        with self._cv:
            first = self._output.due_in(time.monotonic()) is None
            # A waiting poll learns when this output is due (it came first) or that it is due now.
            if self._output.add(data) or first:
                self._cv.notify_all()
