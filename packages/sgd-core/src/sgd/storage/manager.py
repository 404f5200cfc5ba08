"""Driver side of checkpoints: register what the workers wrote, number it, commit it atomically,
keep the best K, mirror it to a storage URI.

Workers write every checkpoint into a temporary folder of the run's checkpoint folder
(:mod:`sgd.storage.staging`) and send its path; :meth:`CheckpointManager.register` is the one
entry point that takes it, whatever it holds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sgd import plugins
from sgd._common.json_values import finite, json_default
from sgd.checkpoint.encoded import EncodedState
from sgd.checkpoint.format import (
    METADATA_FILE,
    Checkpoint,
    CheckpointIntegrityError,
    CheckpointStrategy,
    write_files,
)
from sgd.checkpoint.integrity import checkpoint_dirs, checkpoint_files, complete_digests, is_disk_full
from sgd.checkpoint.preprocessor import PREPROCESSOR_FILE
from sgd.checkpoint.storage import storage_for
from sgd.redact import redact
from sgd.storage.reported import check_name, write_index
from sgd.storage.staging import TMP_PREFIX
from sgd.storage.validations import Validations, no_validation_config_error, spec_from_json, spec_to_json

logger = logging.getLogger("sgd")

_PREFIX = "checkpoint_"


def checkpoint_dir_name(checkpoint_id: int) -> str:
    return f"{_PREFIX}{checkpoint_id:06d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Kept:
    checkpoint_id: int
    score: float
    path: Path
    iteration: int = 0
    #: The file digests this driver recorded when it wrote the checkpoint (``None``: found on disk).
    files: Optional[Dict[str, Any]] = None
    #: The report it came with (JSON values), and its ``ReportedCheckpointStatus`` name
    #: (what ``sgd.get_all_reported_checkpoints`` reads, from :mod:`sgd.storage.reported`'s index).
    metrics: Optional[Dict[str, Any]] = None
    status: str = "COMMITTED"
    #: the report's ``validation=`` while its validation is pending (``False``: none asked for)
    spec: Any = False


class CheckpointManager:
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
            self._kept.append(_Kept(self.latest_id, score, path, iteration, _recorded_files(path),
                                    json_safe(metrics) if metrics is not None else None, status))
            self._upload(path)
            self._prune()
            self._write_index()
        if score_error is not None:
            raise score_error
        return path

    def latest(self) -> Optional[Dict[str, Any]]:
        """The latest checkpoint's state (read back from disk if rank 0 wrote it directly).

        A kept checkpoint that no longer verifies is skipped with a warning, and the newest
        one that does is used (:attr:`latest_iteration` then follows it).
        """
        return self._latest(decode=True)

    def _latest(self, decode: bool) -> Any:
        if self.latest_state is None and self.latest_id and self._kept:
            newest = max(self._kept, key=lambda c: c.checkpoint_id)
            if newest.checkpoint_id == self.latest_id:
                self._load_newest_verified(decode=decode)
        if decode and isinstance(self.latest_state, EncodedState):
            self.latest_state = self.latest_state.decode(self.hook)
        return self.latest_state

    def restorable(self, decode: bool = True) -> Any:
        """What a restart resumes from: :meth:`latest`, unless it is filed under a report not
        yet delivered (saved before that report, which the failure cut off); then the newest
        kept one filed under a delivered report, whose steps after it are redone and reported.
        :attr:`latest_state` and :attr:`latest_iteration` follow it.

        :param decode: ``False``: a dict checkpoint read from disk comes verified but encoded
            (:class:`~sgd.checkpoint.encoded.EncodedState`), for the workers to decode: the
            driver does not import the framework its codec needs (a restart sends it on).
        """
        done = self.delivered_iteration
        if done is None or self.latest_iteration <= done:
            return self._latest(decode)
        candidates = [c for c in self._kept if c.iteration <= done]
        if not candidates:  # none kept on disk (num_to_keep=0): its progress beats a redone report
            logger.warning("the newest checkpoint goes with report %d, which the failure cut off, and no earlier "
                           "one is kept: resuming from it; that report is not delivered", self.latest_iteration)
            return self._latest(decode)
        logger.info("the newest checkpoint goes with report %d, which the failure cut off; resuming from the one "
                    "before it and redoing the steps after that", self.latest_iteration)
        self.latest_state, self.latest_iteration = None, 0
        self._load_newest_verified(candidates, decode)
        return self._latest(decode)

    def _newest_restorable(self) -> Optional[_Kept]:
        done = self.delivered_iteration
        candidates = [c for c in self._kept if done is None or c.iteration <= done]
        return max(candidates, key=lambda c: c.checkpoint_id, default=None)

    def delivered(self, iteration: int) -> None:
        """Report ``iteration`` was delivered; a checkpoint filed under it is now restorable
        (and the one it replaces may leave the retention)."""
        waiting = self.delivered_iteration is not None and self.delivered_iteration < self.latest_iteration
        self.delivered_iteration = iteration
        if waiting and iteration >= self.latest_iteration:
            self._prune()

    def checkpoint_for(self, iteration: int) -> Optional[Path]:
        """The kept checkpoint filed under report ``iteration`` (the newest, if several), or ``None``."""
        found = [c for c in self._kept if c.iteration == iteration]
        return max(found, key=lambda c: c.checkpoint_id).path if found else None

    def _load_newest_verified(self, among: Optional[List[_Kept]] = None, decode: bool = True) -> None:
        """Read the newest kept checkpoint (of ``among``) that verifies into :attr:`latest_state`:
        decoded, or left encoded (``decode=False``)."""
        for kept in sorted(self._kept if among is None else among, key=lambda c: c.checkpoint_id, reverse=True):
            # What this driver wrote in this run is trusted as long as its files are
            # still the ones it recorded; checkpoints found on disk follow the caller's switch.
            ours = kept.files is not None and _recorded_files(kept.path) == kept.files
            try:
                with plugins.using(self.hook):
                    checkpoint = Checkpoint.from_directory(kept.path, trusted=True if ours else None)
                    state = checkpoint.to_dict() if decode else checkpoint.to_encoded()
            except (CheckpointIntegrityError, FileNotFoundError) as exc:
                logger.warning("skipping checkpoint %s, which does not verify: %s", kept.path, exc)
                continue
            self.latest_state = state
            if kept.checkpoint_id != self.latest_id:
                self.latest_iteration = kept.iteration
            return
        raise CheckpointIntegrityError(
            f"none of the checkpoints kept in {self.checkpoint_dir} verifies, so there is nothing to resume from; "
            "see the warnings above for each one.")

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

    # --- reading ----------------------------------------------------------------

    def _scan(self) -> List[_Kept]:
        kept = []
        for _, p in checkpoint_dirs(self.checkpoint_dir):  # numbered and named ones
            try:
                meta = json.loads((p / METADATA_FILE).read_text())
            except (OSError, ValueError):
                continue
            try:
                score = meta.get("score")
                metrics = meta.get("metrics")
                kept.append(_Kept(int(meta["id"]), -math.inf if score is None else float(score), p,
                                  int(meta.get("iteration") or 0), None,
                                  metrics if isinstance(metrics, dict) else None, _status(meta),
                                  spec_from_json(meta.get("validation_spec"))))
            except (TypeError, ValueError, KeyError):
                continue  # metadata altered: never ranked, never loaded
        return kept

    @property
    def best_path(self) -> Optional[Path]:
        if not self._kept:
            return None
        return max(self._kept, key=lambda c: (c.score, c.checkpoint_id)).path

    @property
    def kept_ids(self) -> List[int]:
        return sorted(c.checkpoint_id for c in self._kept)


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it (secrets dropped, like results.jsonl)."""

    return json.loads(json.dumps(finite(redact(value)), default=json_default))


def _recorded_files(path: Path) -> Optional[Dict[str, Any]]:
    try:
        files = json.loads((path / METADATA_FILE).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) else None


def _update_metadata(directory: Path, extra: Dict[str, Any]) -> None:
    """Add ``extra`` to the metadata of a checkpoint written elsewhere, and digests for
    files merged into it since (other ranks' shards)."""
    meta_file = directory / METADATA_FILE
    meta = json.loads(meta_file.read_text())
    meta.update(extra)
    complete_digests(directory, meta)
    with open(meta_file, "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())


def _status(meta: Dict[str, Any]) -> str:
    """A checkpoint's validation status as its metadata records it (``COMMITTED`` if none)."""
    status = meta.get("validation_status")
    return status if isinstance(status, str) else "COMMITTED"


def _format(directory: Path) -> Optional[str]:
    """The ``format`` its workers gave a checkpoint folder (``dict``, ``directory``, ``sharded``)."""
    try:
        meta = json.loads((directory / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta.get("format") if isinstance(meta, dict) else None
