"""What the driver keeps in ``logdir/run_NNN`` so that a run survives its driver:

- ``trainer.json``: the trainer's settings (for :meth:`sgd.Trainer.restore`);
- ``results.jsonl``: one JSON line per delivered report round (a list of per-worker dicts),
  flushed as it arrives; values JSON cannot hold are written as strings;
- ``checkpoints/checkpoint_NNNNNN/``: see :mod:`sgd.storage.manager`;
- ``status.json``: ``RUNNING``, ``FINISHED``, ``ERRORED``, ``INTERRUPTED`` (Ctrl-C in the driver)
  or ``STOPPED`` (ended early on purpose: :meth:`sgd.TrainingIterator.stop`, a Tune scheduler).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any, Dict, Optional, Tuple

from sgd.checkpoint import newest_loadable
from sgd.checkpoint.integrity import checkpoint_dirs
from sgd.redact import redact
from sgd.storage.reading import RESULTS_FILE, SETTINGS_FILE, STATUS_FILE, last_iteration, read_settings

#: Bytes of ``results.jsonl`` the driver buffers between flushes (a burst of rounds).
RESULTS_BUFFER = 1 << 20


class RunDirectory:
    def __init__(self, path: Path):
        self.path = path
        self.checkpoint_dir = path / "checkpoints"
        self._results: Optional[IO[str]] = None
        #: Whether checkpoints of this run may be unpickled (``Trainer.restore(..., trusted=)``).
        self.trusted: Optional[bool] = None

    @classmethod
    def create(cls, path: Path) -> RunDirectory:
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run._write_status("RUNNING")
        return run

    @classmethod
    def open(cls, path: Path) -> RunDirectory:
        path = Path(path).expanduser().resolve()
        if not (path / SETTINGS_FILE).exists():
            raise FileNotFoundError(f"{path} is not an sgd run directory (no {SETTINGS_FILE})")
        run = cls(path)
        run._write_status("RUNNING")
        return run

    # --- settings and status -------------------------------------------------

    def write_settings(self, settings: Dict[str, Any]) -> None:
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
        partial.write_text(json.dumps({"status": status, "time": time.time(),
                                       "pid": os.getpid(), "host": socket.gethostname()}))
        os.replace(partial, self.path / STATUS_FILE)

    def close(self, error: bool, interrupted: bool = False, stopped: bool = False) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None
        self._write_status("INTERRUPTED" if interrupted else "ERRORED" if error
                           else "STOPPED" if stopped else "FINISHED")

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

    def last_checkpoint(self) -> Tuple[Optional[Dict[str, Any]], int]:
        """The state of the newest checkpoint that verifies and the iteration it was saved after
        (newer ones that do not verify are skipped with a warning naming each).

        Loading follows :attr:`trusted` (``None``: the ``SGD_TRUST_CHECKPOINTS`` switch).
        """

        state, iteration, _ = newest_loadable(self.checkpoint_dir, self.trusted, max_iteration=self.last_iteration())
        return state, iteration
