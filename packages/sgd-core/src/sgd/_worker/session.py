"""Worker side of a run: the training thread and the bounded result buffer.

One :class:`Session` per ``Trainer.run`` per worker process. The training
function runs in a daemon thread; ``report`` and ``save_checkpoint`` append
items to a bounded buffer that the driver drains in batches with
:meth:`Session.poll` (one actor call returns every item available, so a
report costs the worker a dict copy and an append, not a round trip).

A checkpoint is a synchronisation point: ``save_checkpoint`` returns only once
the driver has processed the round that holds it, which the driver signals by
polling again (it polls a worker only after every item it got from that worker
went through a round).

What a worker is told (:class:`WorkerContext`, :class:`PreemptionInfo`) is defined in
:mod:`sgd._worker.context`, how a checkpoint is written into the run's storage (the only thing
that travels for it is the path of the folder written) in :mod:`sgd._worker.checkpoint_payloads`
and :mod:`sgd.storage.staging`, and how a session reaches the driver's disk in
:mod:`sgd._worker.driver_disk`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from collections import deque
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from sgd._common.protocol import (
    CHECKPOINT,
    CHECKPOINT_KEY,
    DETAIL_KEY,
    ELASTIC,
    LINE_KEY,
    LOG,
    NOTE,
    REPORT,
    CheckpointTarget,
    Item,
    RemoteError,
    WrittenCheckpoint,
    encode_line,
    plain_report,
)
from sgd._common.run_hooks import run_end_hooks, run_error_hooks, run_in_contexts
from sgd._worker.checkpoint_payloads import materialize, reported_checkpoint, saved_checkpoint
from sgd._worker.context import PreemptionInfo as PreemptionInfo
from sgd._worker.context import WorkerContext
from sgd._worker.driver_disk import _DriverDisk
from sgd._worker.rank_logs import PendingOutput
from sgd._worker.report_fields import ReportFields
from sgd._worker.resets import ResetLink
from sgd._worker.uploads import AsyncUploads, CheckpointUploadError, ReportOptions, check_deletable, upload
from sgd.checkpoint import Checkpoint
from sgd.checkpoint.encoded import EncodedState
from sgd.errors import PeerFailureError, PicklableError
from sgd.report_config import CheckpointUploadMode

_METRICS = itemgetter(1)

#: How many items a worker may buffer ahead of the driver before ``report`` blocks.
DEFAULT_MAX_PENDING = int(os.environ.get("SGD_MAX_PENDING_RESULTS", "1024"))


#: Called with the session in its training thread once its function returned (and its finalizers
#: ran): sgd._worker.collective's, so that a rank still waiting in a collective this one never made
#: fails at once.
RETURN_HOOKS: List[Callable[[Session], None]] = []


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


class RunStopped(PicklableError, BaseException):
    """Raised in the training thread by its next ``sgd.report`` / ``sgd.save_checkpoint`` once
    the driver stopped the run (:meth:`sgd.TrainingIterator.stop`). A ``BaseException`` so
    that a training function's ``except Exception`` does not swallow it; the run ends cleanly."""


class Session(_DriverDisk):
    """State of one training run inside one worker process."""

    def __init__(
        self,
        train_func: Callable[[], Any],
        context: WorkerContext,
        encode: Callable[[Any], Any],
        checkpoint: Optional[dict] = None,
        dataset_shard: Any = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        start_iteration: int = 0,
        checkpoint_target: Optional[CheckpointTarget] = None,
        reforms: bool = False,
        hook: Optional[Any] = None,
    ):
        self._train_func = train_func
        self.context = context
        self._encode = encode
        #: where this run's checkpoints are written (``None``: a run without a directory)
        self.checkpoint_target = checkpoint_target
        # the plugin hooks whose codecs write and decode checkpoints (local mode: the trainer's own)
        self._hook = hook
        # the checkpoint the run starts from: a dict, or a restart's EncodedState (decoded when asked for)
        self._loaded_checkpoint = checkpoint
        #: The ``sgd.Checkpoint`` this worker last passed to ``sgd.report`` (for ``get_checkpoint``).
        self.latest_checkpoint_object: Any = None
        self._materialized: Optional[str] = None
        self._checkpoint_files: Any = False  # not looked up yet (see _files_for_checkpoints)
        self.dataset_shard = dataset_shard
        self._max_pending = max(1, max_pending)

        # The condition's own lock, for the report path: ``with self._lock`` is what ``with
        # self._cv`` does, without two Python calls (every report takes it).
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._items: Deque[Any] = deque()  # _Item, or a plain report as it travels: (REPORT, metrics)
        # Polls waiting for an item: a report wakes only those (a poll that lingers for the run's
        # end is woken by the end, not by each of the reports made meanwhile).
        self._polls_waiting = 0
        # A poll that lingers for the run's end (the start call's) stops at an item the driver
        # must see now: a checkpoint the worker waits on, or a reset-barrier item (sgd.elastic).
        self._lingering = False
        self._urgent = False
        self._delivered_checkpoints: List[_Item] = []
        self._finished = False
        self._result: Any = None
        self._error: Optional[RemoteError] = None
        self._stopping = False
        self._finalizers: List[Callable[[], None]] = []
        # What the backend's run-end hooks said (sgd.backend.on_worker_run_end): with the last reply.
        self._notes: Optional[Dict[str, Any]] = None
        #: The tee of stdout/stderr into ``run_dir/logs/rank_N.log`` (set by the worker actor).
        self.rank_log: Any = None
        # Output for the driver to write into that log (a worker on another host, see send_log).
        self._output = PendingOutput()

        self._fields = ReportFields(start_iteration)  # the report count and the fields sgd adds
        # A drain notice for one of the group's hosts (PreemptionInfo), and the report count
        # from which every worker of the group shows it (see notice / notice_from).
        self._notice: Any = None
        self._notice_from: Optional[int] = None
        self._thread = threading.Thread(target=self._run, name="sgd-train", daemon=True)
        # Set once the thread is started (under the lock): the driver's watch (another of the
        # actor's threads) may join a session the start call made but has not started yet (a peer
        # failed at once).
        self._started = False
        # ASYNC checkpoint uploads (sgd.report(checkpoint_upload_mode=ASYNC)): their thread, the
        # first failure (the run's error, handed to the driver at once), the checkpoint reports
        # not yet acknowledged (what get_all_reported_checkpoints waits for), the names used.
        self._uploads = AsyncUploads()
        self._upload_failure: Optional[RemoteError] = None
        self._unacked_reports: List[_Item] = []
        self._dir_names: set = set()
        #: in-place recovery (:mod:`sgd.elastic`): the reset barrier and the keys of the items
        #: sent; ``reforms``: whether the run's backend can re-form the group in place.
        self.resets = ResetLink(self._cv, lambda kind, data: self._put(_Item(kind, data)), reforms)

    # --- training thread -----------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        with self._lock:
            self._started = True
            self._cv.notify_all()

    def _run(self) -> None:
        result, error = None, None
        try:
            result = run_in_contexts(self._train_func)
            self._uploads.wait()  # the run does not end before its uploads landed
            for finalizer in self._finalizers:
                finalizer()
            for hook in RETURN_HOOKS:
                hook(self)
            result = self._encode(result)
            self._notes = run_end_hooks()
        except RunStopped:
            result = None
            try:
                self._uploads.wait()
            except CheckpointUploadError:
                logging.getLogger("sgd").warning("a checkpoint upload of a stopped run failed", exc_info=True)
            # Stopped on purpose: still let a background checkpoint write end (nothing of it
            # must outlive the run), but its failure is not the run's.
            for finalizer in self._finalizers:
                try:
                    finalizer()
                except Exception:
                    logging.getLogger("sgd").warning("a finalizer of a stopped run failed", exc_info=True)
        except SystemExit as exc:
            # As in a script: exit status 0 ends the function; any other ends the
            # process, which the driver treats as a worker failure (and retries).
            if exc.code not in (None, 0):
                os._exit(exc.code if isinstance(exc.code, int) else 1)
        except BaseException as exc:
            error = self._capture(exc)
        finally:
            if self._materialized is not None:
                import shutil

                shutil.rmtree(self._materialized, ignore_errors=True)
        if self.rank_log is not None:  # all of its output in the rank's log before the run shows as ended
            if error is not None:
                self.rank_log.note(error.traceback)
            self.rank_log.close()
        if error is not None:
            # Before the run shows as ended (the driver may set the framework up again then);
            # after the except block, whose exception holds the failed call's frames (and
            # what they hold: a process group is only closed once nothing refers to it).
            run_error_hooks()
        self._uploads.close()
        with self._cv:
            if error is not None:  # uploads not done are abandoned: their reports are not sent
                self._drop_from_first_unready()
            self._result, self._error, self._finished = result, error, True
            self._cv.notify_all()

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

    def set_iteration(self, iteration: int) -> None:
        """The reports delivered so far, after the group re-formed (the next is one more)."""
        with self._cv:
            self._fields.iteration = iteration

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

    # --- drain notices: every worker sees one from the same report on --------------------

    def notice(self, info: Any) -> int:
        """A host of the group is draining (called from the driver). Until :meth:`notice_from`
        arrives, the next report waits; returns how many reports this worker has made."""
        with self._cv:
            if self._notice is None:
                self._notice = info
            return self._fields.iteration

    def notice_from(self, iteration: int) -> None:
        """From which report count on the notice shows: one more than the most any worker
        had made when asked, so no worker has passed it and every one shows it after the same
        report."""
        with self._cv:
            self._notice_from = iteration
            self._cv.notify_all()

    def _await_notice_from(self) -> None:
        with self._cv:
            while self._notice_from is None:
                self._wait()

    def preemption_info(self) -> Any:
        if self._notice is None or self._notice_from is None or self._fields.iteration < self._notice_from:
            return None
        return self._notice

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

    def report(self, metrics: Dict[str, Any], checkpoint: Any = None,
               options: Optional[ReportOptions] = None) -> None:
        """One report; with a checkpoint, uploaded as ``options`` say (:mod:`sgd._worker.uploads`)."""
        if self._notice is not None and self._notice_from is None:
            self._await_notice_from()
        if self.resets.skips():
            return  # delivered before the group re-formed (sgd.elastic): a step redone
        data = self._fields.stamp(self._encode(metrics))  # sgd.report hands over a dict of its own: no copy
        if checkpoint is None:
            self._put((REPORT, data))
            self.resets.check()
            return
        options = options or ReportOptions()
        target = self._target()
        if options.delete_local:
            check_deletable(checkpoint, target)
        if options.dir_name is not None:
            if options.dir_name in self._dir_names:
                raise ValueError(f"sgd.report(checkpoint_dir_name={options.dir_name!r}): this run already reported a "
                                 "checkpoint under that name; give each checkpoint its own (f'epoch_{epoch}')")
            self._dir_names.add(options.dir_name)
        files, shares = self._files_for_checkpoints(), self.shares_driver_disk

        def stage(c: Any) -> Any:
            return reported_checkpoint(c, target, self._encode, files, self._hook)

        if options.mode is CheckpointUploadMode.ASYNC:
            # Queued now, in order; sent (with everything reported after it) once uploaded.
            item = _Item(REPORT, data, sync=True, ready=False)
            self._put(item)
            with self._cv:
                self._unacked_reports.append(item)
            self._uploads.submit(lambda: self._upload_in_background(item, checkpoint, options, target, stage, shares))
            self.latest_checkpoint_object = checkpoint
            self.resets.check()
            return
        # The checkpoint's content is taken now: the caller may delete its folder
        # as soon as report returns (``with tempfile.TemporaryDirectory()``).
        data[CHECKPOINT_KEY] = upload(checkpoint, options, target, stage, shares)
        item = _Item(REPORT, data, sync=True)
        self._put(item)
        with self._cv:
            while not item.acked:
                self._wait()
        self.latest_checkpoint_object = checkpoint
        self.resets.check()

    def _upload_in_background(self, item: _Item, checkpoint: Any, options: ReportOptions, target: Any,
                              stage: Callable[[Any], Any], shares: bool) -> None:
        """An ASYNC report's upload (the upload thread): the item goes out once it is done; a
        failure is the run's error at once (the driver gets it with its next poll)."""
        if self._upload_failure is not None:
            return  # an earlier one failed: the run is over, this report is never sent
        try:
            written = upload(checkpoint, options, target, stage, shares)
        except BaseException as exc:
            try:
                raise CheckpointUploadError(f"an asynchronous checkpoint upload failed: {type(exc).__name__}: {exc}; "
                                            "the checkpoint was not committed (the previous one is the latest)"
                                            ) from exc
            except CheckpointUploadError as wrapped:
                failure = self._capture(wrapped)
            logging.getLogger("sgd").error("rank %d: an asynchronous checkpoint upload failed; the run fails (the "
                                           "previous checkpoint stays the latest):\n%s", self.context.world_rank,
                                           failure.traceback)
            with self._cv:
                if self._upload_failure is None:
                    self._upload_failure = failure
                self._cv.notify_all()
            raise
        with self._cv:
            item.data[CHECKPOINT_KEY] = written
            item.ready = True
            if self._polls_waiting or self._lingering:
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

    def reports_made(self) -> int:
        """How many reports this worker has made in the run (its last one's ``_training_iteration``)."""
        return self._fields.iteration

    def check_stopped(self) -> None:
        """Raise :class:`RunStopped` once the driver stopped the run (a wait in the training
        thread that is not on the session's condition calls it)."""
        if self._stopping:
            raise RunStopped()

    def wait_reported(self, timeout_s: Optional[float]) -> bool:
        """Wait until every checkpoint this worker reported is uploaded and committed by the
        driver (for ``sgd.get_all_reported_checkpoints``); whether it was within ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while True:
                if self._upload_failure is not None:
                    raise CheckpointUploadError(f"an asynchronous checkpoint upload failed: "
                                                f"{self._upload_failure.message}")
                self._unacked_reports = [i for i in self._unacked_reports if not i.acked]
                if not self._unacked_reports:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if self._stopping:
                    raise RunStopped()
                self._cv.wait(left)

    def save_checkpoint(self, state: Dict[str, Any]) -> None:
        # Only rank 0's state is kept; the other ranks send a marker so that
        # the driver can still check that every rank took part.
        if self.resets.skips():
            return
        data = None
        if self.context.world_rank == 0:
            data = saved_checkpoint(state, self._target(), self._encode, self._files_for_checkpoints(), self._hook)
        item = _Item(CHECKPOINT, data)
        self._put(item)
        with self._cv:
            while not item.acked:
                self._wait()
        self.loaded_checkpoint = state
        self.latest_checkpoint_object = None

    def commit_written_checkpoint(self, directory: Optional[str], score_values: Optional[Dict[str, Any]] = None,
                                  wait: bool = True) -> None:
        """Hand the driver a checkpoint the workers wrote themselves, in place, and wait until
        it is committed (for framework helpers such as ``sgd_torch.save_sharded_checkpoint``).

        Every rank calls it, as ``sgd.save_checkpoint``: rank 0 with ``directory`` (a
        ``.tmp_*`` folder inside :attr:`checkpoint_dir` that every rank has finished writing,
        holding sgd's metadata file), the others with ``None``. The driver numbers it, renames
        it into place atomically and applies the retention policy; until then it is not the
        latest checkpoint, and a failure leaves the previous one as latest.

        :param score_values: what the checkpoint strategy scores it by, if it holds that attribute.
        :param wait: ``False`` for a checkpoint still being written in the background: return at
            once; the driver commits it once sgd's metadata file appears in ``directory`` (write
            it last, atomically), and the run does not end before that (see :meth:`add_finalizer`).
        """
        if self.resets.skips():
            return
        data = None
        if self.context.world_rank == 0:
            if directory is None:
                raise ValueError("rank 0 must pass the directory it wrote the checkpoint into")
            data = WrittenCheckpoint(directory, score_values, pending=not wait)
        item = _Item(CHECKPOINT, data)
        self._put(item)
        if wait:
            with self._cv:
                while not item.acked:
                    self._wait()
        self.latest_checkpoint_object = None

    def _target(self) -> CheckpointTarget:
        if self.checkpoint_target is None:
            raise RuntimeError("this run has no checkpoint folder to write a checkpoint into")
        return self.checkpoint_target

    def _files_for_checkpoints(self) -> Any:
        """``None`` where this worker writes the run's checkpoint folder directly (the driver's
        host), else the run's file server that it writes it through."""
        if self._checkpoint_files is False:
            self._checkpoint_files = None if self.shares_driver_disk else self.driver_files
        return self._checkpoint_files

    def add_finalizer(self, finalizer: Callable[[], None]) -> None:
        """Run ``finalizer()`` in the training thread after the training function returned,
        before the run counts as ended (an asynchronous checkpoint waits for its write there).
        An exception it raises is the run's error. Also run, its errors only logged, when the
        run was stopped (``TrainingIterator.stop``); not run when the function raised."""
        self._finalizers.append(finalizer)

    @property
    def loaded_checkpoint(self) -> Optional[Dict[str, Any]]:
        """The state ``sgd.load_checkpoint()`` returns: the latest saved in this run, else the
        one it started from. A restart's checkpoint arrives encoded and is decoded here, once,
        when it is first asked for (the codec looked up among this process's registered ones)."""
        state = self._loaded_checkpoint
        if isinstance(state, EncodedState):
            state = self._loaded_checkpoint = state.decode(self._hook)
        return state

    @loaded_checkpoint.setter
    def loaded_checkpoint(self, state: Optional[Dict[str, Any]]) -> None:
        self._loaded_checkpoint = state

    def get_checkpoint(self) -> Any:
        """The latest checkpoint as an ``sgd.Checkpoint`` (see ``sgd.get_checkpoint``)."""

        if self.latest_checkpoint_object is not None:
            return self.latest_checkpoint_object
        state = self.loaded_checkpoint
        if state is None:
            return None
        files = state.get("_directory_files") if len(state) == 1 else None
        if files is None:
            return Checkpoint.from_dict(state)
        if self._materialized is None:
            self._materialized = materialize(files)
        return Checkpoint.from_directory(self._materialized)

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

    @property
    def finished(self) -> bool:
        return self._finished

    def join(self) -> None:
        """Wait for the training thread to start (the start call is on its way) and to end."""
        with self._lock:
            self._cv.wait_for(lambda: self._started)
        self._thread.join()

    def join_for(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the training thread to start and end; whether it did."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if not self._cv.wait_for(lambda: self._started, timeout_s):
                return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()


class WorkerState:
    """Per-process state of an sgd worker actor (one per process)."""

    context: Optional[WorkerContext] = None
    session: Optional[Session] = None

    def __init__(self) -> None:
        #: run info the driver sent once and leaves out of later runs' start calls (see actor.py)
        self.sent_once: Dict[str, Any] = {}


STATE = WorkerState()
