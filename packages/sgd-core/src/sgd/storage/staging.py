"""A worker's checkpoint, written into the run's storage: the one way a checkpoint leaves a worker.

Whatever a worker checkpoints (``sgd.save_checkpoint`` state, a dict or a directory passed to
``sgd.report``, one rank's part of a sharded checkpoint), it writes it into a new temporary
folder ``.tmp_*`` of the run's checkpoint folder on the driver's disk, and only that folder's
path (a :class:`~sgd._common.protocol.WrittenCheckpoint`) travels to the driver with its
report, where :meth:`sgd.storage.manager.CheckpointManager.register` numbers it and renames it
into place. A worker on the driver's host writes there directly; one on a host with a disk of
its own writes a local copy and sends its files through the run's file server
(``files.upload(local, driver_path)``: :class:`sgd._worker.driver_files.DriverFiles`), sgd's
metadata file last, so a folder with that file is complete.

A write that fails leaves nothing behind and raises :class:`OSError` (the disk is full, ...):
the earlier checkpoints are intact.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, NoReturn, Optional

from sgd._common.protocol import CheckpointTarget, WrittenCheckpoint
from sgd.checkpoint.format import METADATA_FILE, write_dict_dir, write_directory_metadata
from sgd.checkpoint.integrity import checkpoint_files, digest_files, is_disk_full

#: How every temporary checkpoint folder's name starts (the driver removes the ones left by
#: workers that died mid-write, once no worker runs).
TMP_PREFIX = ".tmp_"


def new_folder(directory: str, kind: str) -> str:
    """A fresh temporary folder name in the checkpoint folder ``directory`` (not created)."""
    return os.path.join(directory, f"{TMP_PREFIX}{kind}_{uuid.uuid4().hex[:12]}")


def score_values(target: CheckpointTarget, state: Dict[str, Any]) -> Dict[str, Any]:
    """What the strategy scores a saved state by: its score attribute, when it holds it."""
    attr = target.score_attribute
    return {attr: state[attr]} if attr in state else {}


def stage_state(target: CheckpointTarget, state: Dict[str, Any], files: Any = None,
                hook: Optional[Any] = None) -> WrittenCheckpoint:
    """Write a dict checkpoint with the run's codec into a new temporary folder of the run's
    checkpoint folder (through ``files``, the run's file server, from a host of its own).

    :param state: the state as the backend encoded it (tensors on the CPU, ...).
    :param hook: the plugin manager whose codecs count (the driver's own in local mode).
    """
    return _stage(target, "state",
                  lambda folder: write_dict_dir(state, folder, target.codec, hook=hook, fsync=target.durable), files,
                  score_values(target, state))


def stage_directory(target: CheckpointTarget, source: str, files: Any = None) -> WrittenCheckpoint:
    """Copy a directory checkpoint into a new temporary folder of the run's checkpoint folder
    (its files as they are; sgd's metadata records their digests)."""
    if files is not None:
        # From a host of its own: its files go as they are, only the metadata is written here.
        return _upload_tree(Path(source), new_folder(target.directory, "dir"), files, {}, own_metadata=False)

    def copy(folder: Path) -> None:
        shutil.copytree(source, folder, dirs_exist_ok=True)
        write_directory_metadata(folder)

    return _stage(target, "dir", copy, None, {})


def _stage(target: CheckpointTarget, kind: str, write: Callable[[Path], None], files: Any,
           scores: Dict[str, Any]) -> WrittenCheckpoint:
    folder = new_folder(target.directory, kind)
    if files is None:  # on the driver's disk: written in place
        try:
            _make_folder(Path(folder))
            write(Path(folder))
        except BaseException as exc:
            shutil.rmtree(folder, ignore_errors=True)
            _raise_write_error(exc, target.directory)
        return WrittenCheckpoint(folder, scores)
    local = Path(tempfile.mkdtemp(prefix="sgd_checkpoint_"))  # on this host's disk, then sent
    try:
        try:
            write(local)
        except BaseException as exc:
            _raise_write_error(exc, target.directory)
        return _upload_tree(local, folder, files, scores, own_metadata=True)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _make_folder(folder: Path) -> None:
    # The driver removes an empty checkpoint folder when it keeps none (num_to_keep=0): if it
    # did between creating the parent and the folder, create both again.
    for attempt in range(3):
        try:
            folder.mkdir(parents=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def _upload_tree(local: Path, folder: str, files: Any, scores: Dict[str, Any],
                 own_metadata: bool) -> WrittenCheckpoint:
    """Send ``local``'s files to ``folder`` on the driver's disk, sgd's metadata file last.

    :param own_metadata: ``local`` holds the metadata to send (a state just written); else the
        folder is a directory checkpoint, whose metadata is made here from its files' digests
        (a metadata file it holds, of an earlier checkpoint, is left out)."""
    names = checkpoint_files(local)
    try:
        for name in names:
            files.upload(str(local / name), os.path.join(folder, name))
        if own_metadata:
            files.upload(str(local / METADATA_FILE), os.path.join(folder, METADATA_FILE))
        else:
            with tempfile.TemporaryDirectory(prefix="sgd_meta_") as tmp:
                # The digests of the files as they are (read where they lie, not copied).
                write_directory_metadata(Path(tmp), digests=digest_files(local, names))
                files.upload(os.path.join(tmp, METADATA_FILE), os.path.join(folder, METADATA_FILE))
    except BaseException as exc:
        _raise_write_error(exc, os.path.dirname(folder))
    return WrittenCheckpoint(folder, scores)


def _raise_write_error(exc: BaseException, directory: str) -> NoReturn:
    """Raise ``exc``, as :func:`write_error` says it when it is an error of the disk."""
    if isinstance(exc, OSError) or is_disk_full(exc):
        raise write_error(exc, directory) from exc
    raise exc


def write_error(exc: BaseException, directory: str) -> OSError:
    """The error a failed checkpoint write raises: where, why, and that nothing earlier is lost."""
    full = is_disk_full(exc)
    reason = "the disk is full" if full else str(exc)
    code = getattr(exc, "errno", None) or (errno.ENOSPC if full else errno.EIO)
    return OSError(code, f"could not write a checkpoint to {directory}: {reason}. Earlier checkpoints are "
                         "intact; free space or choose another logdir.")
