"""``sgd.get_all_reported_checkpoints`` on a worker: wait for this worker's checkpoints to be
committed (and validated), then read the driver's index (:mod:`sgd.storage.reported`)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, List, Optional

from sgd.checkpoint import Checkpoint
from sgd.report_config import CheckpointConsistencyMode, ReportedCheckpoint, ReportedCheckpointStatus
from sgd.storage.reported import INDEX_FILE, read_index

#: How often the index is read again while a validation is pending (VALIDATED mode).
RECHECK_S = 0.05


def read_reported(session: Any, mode: CheckpointConsistencyMode,
                  timeout_s: Optional[float]) -> List[ReportedCheckpoint]:
    """What :func:`sgd.get_all_reported_checkpoints` returns (see there)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    folder = session.checkpoint_dir
    if folder is None:
        return []
    session.wait_reported(timeout_s)
    entries = read_index(_read(session, os.path.join(folder, INDEX_FILE)))
    if mode is CheckpointConsistencyMode.VALIDATED:
        pause = threading.Event()  # never set: a wait that a stopped run does not outlive
        while any(e.get("status") == ReportedCheckpointStatus.PENDING_VALIDATION.value for e in entries):
            if deadline is not None and time.monotonic() >= deadline:
                break
            pause.wait(RECHECK_S if deadline is None else max(0.0, min(RECHECK_S, deadline - time.monotonic())))
            entries = read_index(_read(session, os.path.join(folder, INDEX_FILE)))
    return [ReportedCheckpoint(checkpoint=Checkpoint(path=os.path.join(folder, str(e["name"]))),
                               metrics=dict(e.get("metrics") or {}),
                               status=ReportedCheckpointStatus(e.get("status", "COMMITTED")))
            for e in entries]


def _read(session: Any, path: str) -> Optional[bytes]:
    """The file at ``path`` on the driver's disk, or ``None`` if it is not there."""
    if session.shares_driver_disk:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    files = session.driver_files
    try:
        size = files.size(path)
    except Exception as exc:  # the server's FileNotFoundError arrives wrapped by Ray
        if "FileNotFoundError" in type(exc).__name__ or "No such file" in str(exc):
            return None
        raise
    return files.read(path, 0, size)
