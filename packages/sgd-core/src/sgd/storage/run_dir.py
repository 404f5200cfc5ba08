"""What the driver keeps in a run folder (``logdir/run_NNN``; an AIR trainer's
``storage_path/name``) so that a run survives its driver:

- ``trainer.json``: the trainer's settings (for :meth:`sgd.Trainer.restore`), with the run
  format's version (``format_version``, :data:`~sgd.storage.reading.RUN_FORMAT_VERSION`) and the
  ``sgd_version`` that wrote it;
- ``results.jsonl``: one JSON line per delivered report round (a list of per-worker dicts),
  flushed as it arrives; values JSON cannot hold are written as strings;
- ``checkpoints/checkpoint_NNNNNN/``: see :mod:`sgd.storage.manager`;
- ``status.json``: ``RUNNING``, ``FINISHED``, ``ERRORED``, ``INTERRUPTED`` (Ctrl-C in the driver, or
  its thread made to exit: a Ray Tune trial stopped while its ``fit()`` ran)
  or ``STOPPED`` (ended early on purpose: :meth:`sgd.TrainingIterator.stop`, a Tune scheduler),
  with the driver's pid and host and the ``attempt`` (1, then one more for each driver that
  resumed the run);
- ``events.jsonl``: one JSON line per thing that happened to the run (started, a worker failed,
  restarted from which checkpoint, resized, ended...): :mod:`sgd.storage.events`;
- ``.driver.lock``: held by the driver while the run is open (:mod:`sgd.storage.lock`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any, Dict, Optional, Tuple

from sgd.checkpoint import newest_loadable
from sgd.checkpoint.integrity import checkpoint_dirs
from sgd.redact import redact
from sgd.storage.errors import RunNotFoundError
from sgd.storage.events import EventLog
from sgd.storage.lock import RunLock
from sgd.storage.reading import (
    RESULTS_FILE,
    RUN_FOLDER_FILES,
    RUN_FORMAT_VERSION,
    SETTINGS_FILE,
    STATUS_FILE,
    check_format,
    last_iteration,
    read_settings,
    run_status,
    sgd_version,
)

#: Bytes of ``results.jsonl`` the driver buffers between flushes (a burst of rounds).
RESULTS_BUFFER = 1 << 20


class RunDirectory:
    def __init__(self, path: Path):
        self.path = path
        self.checkpoint_dir = path / "checkpoints"
        self._results: Optional[IO[str]] = None
        #: the run's event log (``events.jsonl``), written by the run's controller
        self.events = EventLog(path)
        #: Whether checkpoints of this run may be unpickled (``Trainer.restore(..., trusted=)``).
        self.trusted: Optional[bool] = None
        #: This driver's lock on the folder while the run is open (:meth:`take`).
        self.lock: Optional[RunLock] = None
        #: Which driver of the run this is: 1, then one more for each that resumed it.
        self.attempt = 1
        #: ``status.json`` as the previous driver of a resumed run left it (``None``: a new run).
        self.previous: Optional[Dict[str, Any]] = None
        #: A named run folder (``storage_path/name``), not a numbered ``run_NNN``: kept in
        #: ``trainer.json`` as ``layout``.
        self.named = False

    @classmethod
    def create(cls, path: Path) -> RunDirectory:
        """A new run in ``path`` (made if missing), taken (:meth:`take`)."""
        run = cls(path)
        run.take()
        return run

    @classmethod
    def open(cls, path: Path) -> RunDirectory:
        """The run in ``path``, to continue; taken when it starts (:meth:`take`).

        :raises sgd.RunNotFoundError: ``path`` holds no run that can be continued.
        :raises sgd.RunFormatError: it was written by a newer sgd.
        """

        path = Path(path).expanduser().resolve()
        if not (path / SETTINGS_FILE).exists():
            raise RunNotFoundError(f"{path} is not an sgd run directory (no {SETTINGS_FILE}; a run folder holds "
                                   f"{RUN_FOLDER_FILES})")
        return cls(check_format(path))

    def take(self) -> None:
        """Lock the folder for this driver (:class:`~sgd.storage.lock.RunLock`), then mark the run
        ``RUNNING`` under the next attempt's number; nothing is written when the lock is refused.

        :raises sgd.RunInUseError: another driver holds the run.
        :raises sgd.RunFormatError: the run in the folder was written by a newer sgd.
        """
        if self.lock is None:
            self.lock = RunLock.acquire(self.path)
        try:
            if (self.path / SETTINGS_FILE).exists():  # a run to continue
                check_format(self.path)
                previous = _read_status(self.path) or {}
                # DRIVER_DIED for a RUNNING run whose driver on this host is gone (read before ours).
                self.previous = dict(previous, status=run_status(self.path))
                attempt = previous.get("attempt", 1)
                self.attempt = (attempt if isinstance(attempt, int) else 1) + 1
            self._write_status("RUNNING")
        except BaseException:
            self.lock.release()
            self.lock = None
            raise

    # --- settings and status -------------------------------------------------

    def write_settings(self, settings: Dict[str, Any]) -> None:
        settings = dict(settings, format_version=RUN_FORMAT_VERSION, sgd_version=sgd_version(),
                        layout="named" if self.named else "numbered")
        (self.path / SETTINGS_FILE).write_text(json.dumps(redact(settings), indent=2, default=repr))

    def read_settings(self) -> Dict[str, Any]:
        return read_settings(self.path)

    def _write_status(self, status: str) -> None:
        import os
        import socket

        # The driver's pid and host tell a reader whether a RUNNING run's driver is still alive.
        # Written under another name and renamed: a driver killed mid-write (a Tune trial's actor
        # taken down with its job) leaves the previous status, never an empty file (UNKNOWN).
        partial = self.path / f".{STATUS_FILE}.{os.getpid()}"
        partial.write_text(json.dumps({"status": status, "time": time.time(), "pid": os.getpid(),
                                       "host": socket.gethostname(), "attempt": self.attempt}))
        os.replace(partial, self.path / STATUS_FILE)

    def close(self, error: bool, interrupted: bool = False, stopped: bool = False) -> None:
        """End the run: its results flushed, its status written, the folder's lock released."""
        if self._results is not None:
            self._results.close()
            self._results = None
        self.events.close()
        try:
            self._write_status("INTERRUPTED" if interrupted else "ERRORED" if error
                               else "STOPPED" if stopped else "FINISHED")
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    # --- results ------------------------------------------------------------------

    def append_line(self, line: str, flush: bool = True) -> None:
        """Append one round's line, already JSON (:meth:`sgd._common.protocol.Round.json_line`).

        :param flush: hand it to the OS now (it survives a killed driver). ``False`` for a round
            of a burst that is not its last: the burst's last round flushes them all.
        """
        if self._results is None:
            # A buffer that holds a burst: one write to the OS for it, not one per round.
            self._results = open(self.path / RESULTS_FILE, "a", encoding="utf-8", buffering=RESULTS_BUFFER)
        self._results.write(line + "\n")
        if flush:
            self._results.flush()

    def last_iteration(self) -> int:
        """``_training_iteration`` of the last complete line of ``results.jsonl`` (0 if none)."""
        if self._results is not None:
            self._results.flush()
        return last_iteration(self.path)

    # --- checkpoints ------------------------------------------------------------------

    def last_checkpoint_id(self) -> int:
        """The highest checkpoint number in the run (new checkpoints are numbered after it,
        whether or not it verifies)."""

        found = checkpoint_dirs(self.checkpoint_dir)
        return found[-1][0] if found else 0

    def last_checkpoint(self) -> Tuple[Optional[Dict[str, Any]], int, Optional[Path]]:
        """The state of the newest checkpoint that verifies, the iteration it was saved after and
        its folder (newer ones that do not verify are skipped with a warning naming each).

        Loading follows :attr:`trusted` (``None``: the ``SGD_TRUST_CHECKPOINTS`` switch).
        """

        return newest_loadable(self.checkpoint_dir, self.trusted, max_iteration=self.last_iteration())


def _read_status(path: Path) -> Optional[Dict[str, Any]]:
    try:
        value = json.loads((path / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
