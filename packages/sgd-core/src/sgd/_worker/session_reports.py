"""What a worker session's training thread hands over: reports, checkpoints, the drain notice.

:class:`_SessionReports` is that part of :class:`sgd._worker.session.Session` (a mixin: the
session sets its state up): ``sgd.report`` with or without a checkpoint (uploaded as Ray 2.60's
report options say, :mod:`sgd._worker.uploads`; an ``ASYNC`` upload in the background, its report
sent once it landed), ``sgd.save_checkpoint`` and checkpoints the workers wrote themselves, the
checkpoint the run loads (``sgd.load_checkpoint`` / ``sgd.get_checkpoint``), and the drain notice
every worker shows from the same report on. The items go through the result buffer
(:mod:`sgd._worker.result_buffer`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional

from sgd._common.protocol import CHECKPOINT, CHECKPOINT_KEY, REPORT, CheckpointTarget, WrittenCheckpoint
from sgd._worker.checkpoint_payloads import materialize, reported_checkpoint, saved_checkpoint
from sgd._worker.resets import ResetLink
from sgd._worker.result_buffer import RunStopped, _Item, _ResultBuffer
from sgd._worker.uploads import AsyncUploads, CheckpointUploadError, ReportOptions, check_deletable, upload
from sgd.checkpoint import Checkpoint
from sgd.checkpoint.encoded import EncodedState
from sgd.report_config import CheckpointUploadMode


class _SessionReports(_ResultBuffer):
    """Reports, checkpoints and the drain notice of :class:`sgd._worker.session.Session` (a
    mixin: the session's ``__init__`` sets the state declared here)."""

    checkpoint_target: Optional[CheckpointTarget]
    _encode: Callable[[Any], Any]
    _hook: Optional[Any]
    _loaded_checkpoint: Optional[dict]
    latest_checkpoint_object: Any
    _materialized: Optional[str]
    _checkpoint_files: Any
    _finalizers: List[Callable[[], None]]
    _notice: Any
    _notice_from: Optional[int]
    _uploads: AsyncUploads
    _unacked_reports: List[_Item]
    _dir_names: set
    resets: ResetLink

    def set_iteration(self, iteration: int) -> None:
        """The reports delivered so far, after the group re-formed (the next is one more)."""
        with self._cv:
            self._fields.iteration = iteration
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
    def reports_made(self) -> int:
        """How many reports this worker has made in the run (its last one's ``_training_iteration``)."""
        return self._fields.iteration
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
