"""Driver side of checkpoints: register what the workers wrote, number it, commit it atomically,
keep the best K, mirror it to a storage URI.

Workers write every checkpoint into a temporary folder of the run's checkpoint folder
(:mod:`sgd.storage.staging`) and send its path; :meth:`CheckpointManager.register` is the one
entry point that takes it, whatever it holds.

Reading kept checkpoints back (what a run resumes from) is :mod:`sgd.storage.restoring`; the
record of a kept checkpoint and its metadata file, :mod:`sgd.storage.kept`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sgd import plugins
from sgd.checkpoint.format import Checkpoint, CheckpointStrategy, write_files
from sgd.checkpoint.integrity import checkpoint_files, is_disk_full
from sgd.checkpoint.preprocessor import PREPROCESSOR_FILE
from sgd.checkpoint.storage import storage_for
from sgd.storage.kept import _format, _Kept, _recorded_files, _update_metadata
from sgd.storage.kept import checkpoint_dir_name as checkpoint_dir_name
from sgd.storage.kept import json_safe as json_safe
from sgd.storage.reported import check_name, write_index
from sgd.storage.restoring import _Restoring
from sgd.storage.staging import TMP_PREFIX
from sgd.storage.validations import Validations, no_validation_config_error, spec_to_json

logger = logging.getLogger("sgd")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

class CheckpointManager(_Restoring):
    """Registers the checkpoints a run's workers write into its checkpoint folder and keeps them.

    :param checkpoint_dir: ``run_dir/checkpoints``.
    :param strategy: what to keep.
    :param codec: module that encodes dict checkpoints.
    :param start_id: the id of the last checkpoint already in ``checkpoint_dir`` (resume).
    :param mirror: where each kept checkpoint is also copied (``s3://…``, any storage URI).
    :param hook: the plugin manager (or its ``.hook``) whose codecs and storage it uses: the
        trainer's own (``trainer.plugin_manager``); by default the process-wide one.
    """

    def __init__(self, checkpoint_dir: Path, strategy: CheckpointStrategy, codec: str, start_id: int = 0,
                 mirror: Optional[str] = None, hook: Optional[Any] = None):
        self.checkpoint_dir = checkpoint_dir
        #: The hook relay codecs and storage are looked up through (``None``: the process-wide one).
        self.hook = None if hook is None else getattr(hook, "hook", hook)
        #: A storage URI (or path) every kept checkpoint is copied to, through the storage hook.
        self.mirror = mirror.rstrip("/") if mirror else None
        self.strategy = strategy
        self.codec = codec
        #: A preprocessor (encoded by :func:`sgd.checkpoint.preprocessor.encode_preprocessor`) kept
        #: in every checkpoint written from now on, unless the checkpoint has one already.
        self.preprocessor: Optional[bytes] = None
        self.latest_id = start_id
        #: The latest checkpoint's state: a dict, or its bytes not yet decoded (an
        #: :class:`~sgd.checkpoint.encoded.EncodedState`, read for a restart; :meth:`latest` decodes it).
        self.latest_state: Any = None
        self.latest_iteration = 0
        #: The last report the driver delivered: a checkpoint filed under a later report (saved
        #: before it, "save then report") is not restored from, nor does it push out of the
        #: retention the newest one that is, until that report is delivered.
        self.delivered_iteration: Optional[int] = None
        self._kept: List[_Kept] = []
        self.loaded_from: Optional[Path] = None
        #: the run's event log (:class:`sgd.storage.events.EventLog`): checkpoints persisted,
        #: deleted and passed over are written to it; ``None``: not recorded
        self.events: Optional[Any] = None
        #: the kept checkpoints change in the controller's thread and in the validations' one
        self._lock = threading.RLock()
        #: the run's asynchronous validations (:meth:`set_validation_config`), else ``None``
        self.validations: Optional[Validations] = None
        # The report whose checkpoint is being committed now, and the last one committed (in the
        # index: a worker's get_all_reported_checkpoints waits for the one it may miss).
        self._intent: Optional[int] = None
        self._through = 0
        self.remove_temporary()
        if start_id:
            self._kept = self._scan()

    def remove_temporary(self) -> None:
        """Drop temporary folders: writes a crash cut short, never valid. Call it only when
        no write can be in flight (no workers running)."""
        for stale in self.checkpoint_dir.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)

    # --- writing -------------------------------------------------------------

    def register(self, path: Path, score_values: Dict[str, Any], iteration: int,
                 metrics: Optional[Dict[str, Any]] = None, shards: Sequence[Path] = (), name: Optional[str] = None,
                 validation: Any = False) -> Optional[Path]:
        """Take a checkpoint the workers wrote into ``path``, a temporary folder of
        :attr:`checkpoint_dir` (:mod:`sgd.storage.staging`), filed under report ``iteration``:
        give it its number and metadata and rename it into place; only then is it the latest.
        The one way a checkpoint is registered, whatever it holds (a saved state, a directory,
        every rank's shard of a sharded checkpoint).

        :param score_values: what the strategy scores it by (the report passed with it, or the
            score attribute of a saved state).
        :param metrics: the report it was passed with, stored in its metadata.
        :param shards: other ranks' folders passed with the same report: their files are added
            to ``path`` (a file already there is kept), then the folders go.
        :param name: the folder name to commit it under (``sgd.report(checkpoint_dir_name=)``);
            ``None``: ``checkpoint_NNNNNN``. It still gets its number (in its metadata).
        :param validation: the report asked for a validation (its status is then pending).
        :returns: where it was committed, or ``None`` if the strategy keeps none.
        :raises FileNotFoundError: ``path`` is not a temporary folder of :attr:`checkpoint_dir`
            on this driver's disk; earlier checkpoints stay the latest.
        :raises OSError: the commit failed (nothing earlier is lost).
        :raises ValueError: the score attribute is missing or not a number (raised after the
            checkpoint is written, so it is not lost), a dict checkpoint would be merged
            with directories, or ``name`` is an earlier checkpoint's of this run.
        """
        tmp = self._confined(path)
        try:
            if validation is not False and self.validations is None:
                raise no_validation_config_error()
            check_name(name, iteration, self._kept)
            for shard in shards:
                self._merge(tmp, self._confined(shard))
        except BaseException:
            self.discard([tmp, *shards])
            raise
        previous = (self.latest_id, self.latest_state, self.latest_iteration)
        self.latest_id += 1
        self.latest_state = None  # read from disk when asked for
        self.latest_iteration = iteration
        if self.strategy.num_to_keep == 0:
            self._hold(tmp)
            self._intent = None
            return None
        self._intent, self._through = None, max(self._through, iteration)  # written with the index below
        final = self._persist_or_roll_back(previous, score_values, iteration, tmp, metrics=metrics, name=name,
                                           status="PENDING_VALIDATION" if validation is not False else "COMMITTED")
        if validation is not False and self.validations is not None:
            kept = next(c for c in self._kept if c.checkpoint_id == self.latest_id)
            kept.spec = validation
            # Kept with it, so that a run resumed by name validates it if this one does not.
            _update_metadata(kept.path, {"validation_status": kept.status, "validation_spec": spec_to_json(validation)})
            self.validations.submit(kept, validation)
        return final

    def registering(self, iteration: int) -> None:
        """The checkpoint of report ``iteration`` is about to be committed (said in the index
        before the report's ``results.jsonl`` line is written, so that a worker that sees the
        line waits for the checkpoint: :mod:`sgd._worker.reported`)."""
        with self._lock:
            self._intent = iteration
            self._write_index()

    def _tell(self, kind: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.write(kind, **fields)

    def _write_index(self) -> None:
        write_index(self.checkpoint_dir, self._kept, intent=self._intent, through=self._through)

    def set_validation_config(self, config: Any) -> None:
        """Validate the checkpoints reported with ``validation=`` by ``config`` (an
        :class:`sgd.ValidationConfig`; ``None``: such a report is an error)."""
        validations = self.validations = None if config is None else Validations(config, self.validated, self._lock)
        pending = sorted((c for c in self._kept if c.status == "PENDING_VALIDATION"), key=lambda c: c.checkpoint_id)
        if validations is None:
            if pending:
                logger.warning("%d checkpoints of this run wait for a validation, but the trainer has no "
                               "validation_config; they stay PENDING_VALIDATION", len(pending))
            return
        for c in pending:
            logger.info("validating checkpoint %s, whose validation an earlier attempt did not finish", c.path)
            validations.submit(c, c.spec)

    def validated(self, kept: _Kept, metrics: Dict[str, Any], status: str) -> None:
        """A validation ended (:mod:`sgd.storage.validations`): its status, and once validated its
        metrics merged into the checkpoint's (re-scored when they hold the score attribute),
        recorded in its metadata and the index; then the retention policy runs again."""
        with self._lock:
            kept.status = status
            extra: Dict[str, Any] = {"validation_status": status}
            if status == "VALIDATED":
                kept.metrics = json_safe({**(kept.metrics or {}), **metrics})
                extra["metrics"] = kept.metrics
                if self.strategy.checkpoint_score_attribute in metrics:
                    try:
                        kept.score = self._score(kept.metrics, kept.iteration)
                        extra["score"] = kept.score if math.isfinite(kept.score) else None
                    except ValueError as exc:
                        logger.warning("checkpoint %s keeps its score: %s", kept.path, exc)
            if kept in self._kept and kept.path.is_dir():
                _update_metadata(kept.path, extra)
            self._prune()
            self._write_index()

    def _confined(self, path: Any) -> Path:
        """``path`` if it is a temporary folder of :attr:`checkpoint_dir` on this disk."""
        tmp = Path(path)
        if (not tmp.name.startswith(TMP_PREFIX) or tmp.is_symlink() or not tmp.is_dir()
                or tmp.parent.resolve() != self.checkpoint_dir.resolve()):
            raise FileNotFoundError(
                f"a worker reported a checkpoint in {path}, which is not a temporary folder of {self.checkpoint_dir} "
                "on the driver's disk; checkpoints are written there, directly or through the run's file server.")
        return tmp

    def discard(self, paths: Sequence[Any]) -> None:
        """Remove checkpoint folders the workers wrote that will not be registered (a report
        replayed after a restart); paths outside :attr:`checkpoint_dir` are left alone."""
        for path in paths:
            try:
                tmp = self._confined(path)
            except FileNotFoundError:
                continue
            shutil.rmtree(tmp, ignore_errors=True)

    def _merge(self, into: Path, shard: Path) -> None:
        """Add another rank's folder to ``into`` (a file already there is kept)."""
        if _format(shard) == "dict":  # only the lowest rank's dict checkpoint counts
            shutil.rmtree(shard, ignore_errors=True)
            return
        if _format(into) == "dict":
            raise ValueError("a dict checkpoint cannot be merged with other ranks' directory checkpoints; "
                             "pass directory checkpoints (Checkpoint.from_directory) on every rank")
        for name in checkpoint_files(shard):
            source, target = shard / name, into / name
            if target.exists() or target.is_symlink():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
        shutil.rmtree(shard, ignore_errors=True)

    def _hold(self, tmp: Path) -> None:
        """Keep nothing on disk (``num_to_keep=0``) but the state in memory, so a restart still
        resumes from it: read back (written by this run's workers: trusted), then removed."""
        try:
            if _format(tmp) != "sharded":  # a sharded one is its files: nothing to hold
                with plugins.using(self.hook):
                    self.latest_state = Checkpoint.from_directory(tmp, trusted=True).to_dict()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.checkpoint_dir.rmdir()  # only when empty: nothing is kept

    def _score(self, state: Dict[str, Any], iteration: int) -> float:
        # The recency attributes rank sgd.save_checkpoint states too, which do not hold them
        # (``_training_iteration`` is the AIR default): the report the checkpoint followed.
        attr = self.strategy.checkpoint_score_attribute
        if attr not in state and attr in ("_timestamp", "_training_iteration"):
            return self.strategy.score({attr: time.time() if attr == "_timestamp" else iteration})
        return self.strategy.score(state)

    def _persist_or_roll_back(self, previous: Tuple[int, Any, int], *args: Any, **kwargs: Any) -> Path:
        """:meth:`_persist`; interrupted (Ctrl-C mid-write), the previous checkpoint stays the
        latest and the half-written folder goes."""
        try:
            return self._persist(*args, **kwargs)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self.latest_id, self.latest_state, self.latest_iteration = previous
            raise

    def _persist(self, score_values: Dict[str, Any], iteration: int, written: Path,
                 metrics: Optional[Dict[str, Any]] = None, name: Optional[str] = None,
                 status: str = "COMMITTED") -> Path:
        """Score, write (or finish ``written``), keep, mirror and prune the latest checkpoint.
        A bad score attribute is raised only after the checkpoint is safely written."""
        score_error: Optional[ValueError] = None
        try:
            score = self._score(score_values, iteration)
        except ValueError as exc:
            score, score_error = -math.inf, exc
        path = self._write(self.latest_id, written, score, iteration, metrics=metrics, name=name)
        with self._lock:
            files = _recorded_files(path)
            self._kept.append(_Kept(self.latest_id, score, path, iteration, files,
                                    json_safe(metrics) if metrics is not None else None, status))
            self._tell("checkpoint_persisted", checkpoint=path.name, iteration=iteration,
                       score=score if math.isfinite(score) else None, bytes=_size(files))
            self._upload(path)
            self._prune()
            self._write_index()
        if score_error is not None:
            raise score_error
        return path

    def delivered(self, iteration: int) -> None:
        """Report ``iteration`` was delivered; a checkpoint filed under it is now restorable
        (and the one it replaces may leave the retention)."""
        waiting = self.delivered_iteration is not None and self.delivered_iteration < self.latest_iteration
        self.delivered_iteration = iteration
        if waiting and iteration >= self.latest_iteration:
            self._prune()
    def _write(self, checkpoint_id: int, tmp: Path, score: float, iteration: int,
               metrics: Optional[Dict[str, Any]] = None, name: Optional[str] = None) -> Path:
        """Finish the folder ``tmp`` the workers wrote: its metadata (number, score, report, the
        digests of merged files), the preprocessor; fsynced, renamed to its final name
        (``name``, else ``checkpoint_NNNNNN``)."""
        final = self.checkpoint_dir / (name or checkpoint_dir_name(checkpoint_id))
        try:
            meta = dict(id=checkpoint_id, score=score if math.isfinite(score) else None,
                        iteration=iteration, timestamp=time.time())
            if metrics is not None:
                meta["metrics"] = json_safe(metrics)
            if self.preprocessor is not None:
                write_files({PREPROCESSOR_FILE: self.preprocessor}, tmp, overwrite=False)
            _update_metadata(tmp, meta)
            _fsync_dir(tmp)
            if final.exists():  # left by an earlier attempt of a resumed run (see check_name)
                shutil.rmtree(final)
                self._kept = [c for c in self._kept if c.path != final]
            os.rename(tmp, final)
            _fsync_dir(self.checkpoint_dir)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(exc, OSError):
                raise  # Ctrl-C mid-write: nothing half-written stays
            reason = "the disk is full" if is_disk_full(exc) else str(exc)
            raise OSError(
                exc.errno,
                f"could not write checkpoint {checkpoint_id} to {final}: {reason}. Earlier checkpoints are intact; "
                "free space or choose another logdir.",
            ) from exc
        return final

    def _prune(self) -> None:
        with self._lock:
            self._prune_locked()

    def _prune_locked(self) -> None:
        k = self.strategy.num_to_keep
        if k is None or len(self._kept) <= k:
            return
        ranked = sorted(self._kept, key=lambda c: (c.score, c.checkpoint_id), reverse=True)
        keep = {c.checkpoint_id for c in ranked[:k]} | {self.latest_id}
        keep |= {c.checkpoint_id for c in self._kept if c.status == "PENDING_VALIDATION"}  # until it ends
        restorable = self._newest_restorable()
        if restorable is not None:
            keep.add(restorable.checkpoint_id)
        removed = False
        for c in list(self._kept):
            if c.checkpoint_id not in keep:
                shutil.rmtree(c.path, ignore_errors=True)
                self._kept.remove(c)
                removed = True
                self._tell("checkpoint_deleted", checkpoint=c.path.name, iteration=c.iteration)
                if self.mirror:
                    self._mirror_storage().delete_dir(self.mirror_uri(c.path.name))
        if removed:
            self._write_index()

    # --- mirror ----------------------------------------------------------------------

    def mirror_uri(self, name: str) -> str:
        assert self.mirror is not None
        return f"{self.mirror}/{name}"

    def _mirror_storage(self) -> Any:

        assert self.mirror is not None
        return storage_for(self.mirror, hook=self.hook)

    def _upload(self, path: Path) -> None:
        """Copy a finished checkpoint to the mirror (synchronously: when ``save_checkpoint``
        returns, the copy is complete)."""
        if self.mirror:
            self._mirror_storage().upload_dir(str(path), self.mirror_uri(path.name))


def _size(files: Optional[Dict[str, Any]]) -> Optional[int]:
    """The bytes of a checkpoint's recorded files (``None``: not recorded)."""
    if not files:
        return None
    sizes = [entry.get("size") for entry in files.values() if isinstance(entry, dict)]
    return sum(size for size in sizes if isinstance(size, int)) if sizes else None
