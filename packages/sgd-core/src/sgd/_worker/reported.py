"""``sgd.get_all_reported_checkpoints`` on a worker: wait for this worker's checkpoints to be
committed (and validated), then read the driver's index (:mod:`sgd.storage.reported`).

A rank's own checkpoint reports are acknowledged by the driver once committed. A rank that passed
no checkpoint in a round does not know whether another rank did: it waits until the driver has
delivered its last report's round (that round's line is in ``results.jsonl``) and the index says
no checkpoint is being committed (the driver says so there before it writes the line)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, List, Optional

from sgd._common.protocol import reported_only
from sgd.checkpoint import Checkpoint
from sgd.report_config import CheckpointConsistencyMode, ReportedCheckpoint, ReportedCheckpointStatus
from sgd.storage.reported import index_in_flight, index_path, read_index

#: The run directory's results file (:mod:`sgd.storage.run_dir`) and how much of its end is read.
RESULTS_FILE = "results.jsonl"
TAIL_BYTES = 1 << 16

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
    index = str(index_path(folder))
    _wait_delivered(session, index, deadline)
    entries = read_index(_read(session, index))
    if mode is CheckpointConsistencyMode.VALIDATED:
        pause = threading.Event()  # never set: a wait that a stopped run does not outlive
        while any(e.get("status") == ReportedCheckpointStatus.PENDING_VALIDATION.value for e in entries):
            if deadline is not None and time.monotonic() >= deadline:
                break
            pause.wait(RECHECK_S if deadline is None else max(0.0, min(RECHECK_S, deadline - time.monotonic())))
            entries = read_index(_read(session, index))
    return [ReportedCheckpoint(checkpoint=Checkpoint(path=os.path.join(folder, str(e["name"]))),
                               metrics=reported_only(e.get("metrics") or {}),
                               status=ReportedCheckpointStatus(e.get("status", "COMMITTED")))
            for e in entries]


def _wait_delivered(session: Any, index_path: str, deadline: Optional[float]) -> None:
    """Until the driver has delivered this worker's last report and committed its round's
    checkpoint, if any (or ``deadline`` passed)."""
    reports = session.reports_made()
    run_dir = session.context.get_trial_dir()
    if not reports or not run_dir:
        return
    results = os.path.join(run_dir, RESULTS_FILE)
    pause = threading.Event()  # never set
    while deadline is None or time.monotonic() < deadline:
        session.check_stopped()
        # The line first, the index after: the driver says a commit is in flight before the line.
        if _last_iteration(_tail(session, results)) >= reports and not index_in_flight(_read(session, index_path)):
            return
        pause.wait(RECHECK_S)


def _last_iteration(tail: Optional[bytes]) -> int:
    """``_training_iteration`` of the last complete line of a ``results.jsonl`` tail."""
    if not tail:
        return 0
    lines = tail.split(b"\n")
    for line in reversed(lines[:-1]):  # the part after the last newline is not complete
        try:
            row = json.loads(line)
            return int(row[0].get("_training_iteration", 0))
        except (ValueError, TypeError, IndexError, AttributeError):
            continue
    return 0


def _tail(session: Any, path: str) -> Optional[bytes]:
    """The last :data:`TAIL_BYTES` of the file at ``path`` on the driver's disk (``None``: none)."""
    if session.shares_driver_disk:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TAIL_BYTES))
                return f.read()
        except FileNotFoundError:
            return None
    files = session.driver_files
    size = files.size(path)
    return files.read(path, max(0, size - TAIL_BYTES), min(size, TAIL_BYTES))


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
