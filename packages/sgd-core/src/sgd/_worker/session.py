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
:mod:`sgd._worker.driver_disk`. The session's parts are mixins: the buffer and the driver's
poll in :mod:`sgd._worker.result_buffer`, reports, checkpoints (with their asynchronous uploads)
and the drain notice in :mod:`sgd._worker.session_reports`; this module holds the session's state,
its training thread and the process's :data:`STATE`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional

from sgd._common.protocol import CheckpointTarget, RemoteError
from sgd._common.run_hooks import run_end_hooks, run_error_hooks, run_in_contexts
from sgd._worker.context import PreemptionInfo as PreemptionInfo
from sgd._worker.context import WorkerContext
from sgd._worker.rank_logs import PendingOutput
from sgd._worker.report_fields import ReportFields
from sgd._worker.resets import ResetLink
from sgd._worker.result_buffer import DEFAULT_MAX_PENDING as DEFAULT_MAX_PENDING
from sgd._worker.result_buffer import RunStopped as RunStopped
from sgd._worker.result_buffer import _Item as _Item
from sgd._worker.session_reports import _SessionReports
from sgd._worker.uploads import AsyncUploads, CheckpointUploadError

#: Called with the session in its training thread once its function returned (and its finalizers
#: ran): sgd._worker.collective's, so that a rank still waiting in a collective this one never made
#: fails at once.
RETURN_HOOKS: List[Callable[[Session], None]] = []


class Session(_SessionReports):
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
