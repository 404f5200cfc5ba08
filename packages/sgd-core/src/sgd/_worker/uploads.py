"""How a worker uploads a checkpoint passed to ``sgd.report``, with Ray 2.60's options.

"Upload" is writing the checkpoint into a temporary folder of the run's checkpoint folder
(:mod:`sgd._worker.checkpoint_payloads`), or the user's ``checkpoint_upload_fn``; the driver
then commits it under ``checkpoint_dir_name`` (or ``checkpoint_NNNNNN``). ``ASYNC`` uploads run
here, one at a time in report order, in one background thread per run (:class:`AsyncUploads`),
while the report they belong to waits in the worker's buffer (the reports after it behind it).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

from sgd._common.protocol import CheckpointTarget, WrittenCheckpoint
from sgd.checkpoint import Checkpoint
from sgd.checkpoint.format import METADATA_FILE, write_directory_metadata
from sgd.errors import PicklableError
from sgd.report_config import CheckpointUploadMode, ValidationSpec, ValidationTaskConfig
from sgd.storage.staging import TMP_PREFIX, new_folder

#: sgd's own numbered names: a ``checkpoint_dir_name`` may not look like one.
_NUMBERED = re.compile(r"checkpoint_\d+")


class CheckpointUploadError(PicklableError, RuntimeError):
    """An ``ASYNC`` checkpoint upload failed: the run fails with it (as in Ray 2.60), and the
    checkpoint is not committed (the previous one stays the latest)."""


@dataclass
class ReportOptions:
    """Ray 2.60's ``report`` options, checked (see :func:`sgd.report`)."""

    mode: CheckpointUploadMode = CheckpointUploadMode.SYNC
    dir_name: Optional[str] = None
    delete_local: bool = False
    upload_fn: Optional[Callable[[Any, str], Any]] = None
    validation: ValidationSpec = False


def check_dir_name(name: Any) -> Optional[str]:
    """``checkpoint_dir_name`` if it is a plain folder name sgd may commit a checkpoint under.

    :raises TypeError: not a string.
    :raises ValueError: empty, a path (``/``, ``\\``), ``.``/``..``, hidden (sgd's temporary
        folders start with a dot), or one of sgd's numbered names (``checkpoint_000003``).
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"sgd.report(checkpoint_dir_name=...) takes a folder name (str), got {type(name).__name__}")
    problem = None
    if not name.strip():
        problem = "is empty"
    elif "/" in name or "\\" in name or os.sep in name:
        problem = "is a path, not a folder name"
    elif name in (".", ".."):
        problem = "is not a folder name"
    elif name.startswith("."):
        problem = "starts with a dot (sgd's temporary folders do)"
    elif _NUMBERED.fullmatch(name):
        problem = "is one of the names sgd numbers its checkpoints with"
    elif "\x00" in name or len(name.encode()) > 255:
        problem = "is not a valid folder name"
    if problem is not None:
        raise ValueError(f"sgd.report(checkpoint_dir_name={name!r}) {problem}: pass a plain folder name, unique in "
                         "the run, such as f'epoch_{epoch}'")
    return name


def default_name() -> str:
    """The name ``checkpoint_upload_fn`` gets when the report names no folder (Ray's form)."""
    return time.strftime("checkpoint_%Y-%m-%d_%H-%M-%S") + f".{int(time.time() * 1e6) % 1_000_000:06d}"


def upload(checkpoint: Any, options: ReportOptions, target: CheckpointTarget,
           stage: Callable[[Any], WrittenCheckpoint], shares_driver_disk: bool) -> WrittenCheckpoint:
    """Upload ``checkpoint`` as ``options`` say; what travels to the driver for it.

    :param stage: writes a checkpoint into a temporary folder of the run's checkpoint folder
        (the default upload).
    :raises TypeError: ``checkpoint_upload_fn`` returned something else than an ``sgd.Checkpoint``.
    """
    name = options.dir_name
    if options.upload_fn is None:
        written = None
        if options.mode is CheckpointUploadMode.NO_UPLOAD and shares_driver_disk:
            written = _adopt(checkpoint, None, target)  # already in the run's storage: taken in place
            if written is not None and name is None:
                name = _own_name(checkpoint.path)  # it stays where it is, as in Ray
        if written is None:
            written = stage(checkpoint)
    else:
        persisted = options.upload_fn(checkpoint, options.dir_name or default_name())
        if not isinstance(persisted, Checkpoint):
            t = type(persisted)
            raise TypeError(f"checkpoint_upload_fn must return an sgd.Checkpoint (the uploaded checkpoint), got "
                            f"{t.__module__}.{t.__qualname__}")
        written = _adopt(persisted, checkpoint, target) if shares_driver_disk else None
        if written is None:
            written = stage(persisted)
    written.name = name
    written.validation = options.validation
    if options.delete_local:
        _delete_local(checkpoint, target)
    return written


def _own_name(path: str) -> Optional[str]:
    """The folder name a checkpoint written in place keeps, if sgd may commit it under it."""
    try:
        return check_dir_name(os.path.basename(os.path.normpath(path)))
    except (TypeError, ValueError):
        return None  # e.g. one of sgd's numbered names: it gets its own number's


def _adopt(persisted: Checkpoint, given: Any, target: CheckpointTarget) -> Optional[WrittenCheckpoint]:
    """A checkpoint ``checkpoint_upload_fn`` (or the user, with ``NO_UPLOAD``) wrote into the
    run's checkpoint folder itself, moved to a temporary folder there (no copy) for the driver to
    commit; ``None`` if it lies elsewhere (then it is copied in)."""
    path = persisted.path
    if path is None or persisted is given or (getattr(given, "path", None) == path):
        return None
    folder, root = Path(path), Path(target.directory)
    try:
        inside = folder.resolve().parent == root.resolve() and folder.is_dir() and not folder.is_symlink()
    except OSError:
        return None
    if not inside or folder.name.startswith(TMP_PREFIX):
        return None
    if (folder / METADATA_FILE).exists():
        raise ValueError(f"checkpoint_upload_fn returned {path}, a checkpoint the run has already committed; "
                         "upload the reported checkpoint to a new folder and return that")
    tmp = new_folder(target.directory, "dir")
    os.rename(folder, tmp)
    write_directory_metadata(Path(tmp))
    return WrittenCheckpoint(tmp, {})


def _delete_local(checkpoint: Any, target: CheckpointTarget) -> None:
    path = getattr(checkpoint, "path", None)
    if path is not None and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def check_deletable(checkpoint: Any, target: Optional[CheckpointTarget]) -> None:
    """``delete_local_checkpoint_after_upload`` must not delete the run's own folder.

    :raises ValueError: the run's checkpoint folder lies inside the reported checkpoint's folder.
    """
    path = getattr(checkpoint, "path", None)
    if path is None or target is None or not os.path.isdir(path):
        return
    run_folder, local = Path(target.directory).resolve(), Path(path).resolve()
    if run_folder == local or local in run_folder.parents:
        raise ValueError(f"the run's checkpoint folder ({target.directory}) is inside the reported checkpoint "
                         f"({path}) and delete_local_checkpoint_after_upload is on (the default with ASYNC), which "
                         "would delete the run: write the checkpoint to a temporary folder (tempfile.mkdtemp()) or "
                         "pass delete_local_checkpoint_after_upload=False")


def validation_spec(validation: Any) -> ValidationSpec:
    """``validation=`` checked: a bool or a :class:`~sgd.ValidationTaskConfig`."""
    if isinstance(validation, (bool, ValidationTaskConfig)):
        return validation
    if hasattr(validation, "fn_kwargs") and hasattr(validation, "timeout_s"):  # Ray's own ValidationTaskConfig
        return ValidationTaskConfig.of(validation)
    raise TypeError(f"sgd.report(validation=...) takes True, False or a sgd.ValidationTaskConfig, "
                    f"got {type(validation).__name__}")


class AsyncUploads:
    """A run's ``ASYNC`` uploads: one background thread, in report order. ``wait()`` blocks until
    every upload submitted has ended and raises the first failure as
    :class:`CheckpointUploadError`."""

    def __init__(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None
        self._futures: List[Future] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sgd-upload")
            self._futures = [f for f in self._futures if not f.done() or f.exception() is not None]
            self._futures.append(self._pool.submit(fn))

    def wait(self) -> None:
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            exc = future.exception()
            if exc is not None:
                raise CheckpointUploadError(f"an asynchronous checkpoint upload failed: {type(exc).__name__}: {exc}; "
                                            "the checkpoint was not committed (the previous one is the latest)"
                                            ) from exc

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
