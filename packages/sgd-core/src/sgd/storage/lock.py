"""The run folder's lock: one driver at a time writes a run.

The driver holds an OS lock (``fcntl.flock``) on ``<run folder>/.driver.lock`` while its run is
open. The OS drops it when the driver's process ends, however it ends (SIGKILL, a lost
machine's process gone), so a driver that crashed never blocks the one that resumes its run. A
second driver that opens the same run while the first is alive is refused before it writes
anything, with the first's pid and host (which the lock file holds) in the message.

``flock`` locks are per open file: a second open of the same run in the same process (a
thread, a second ``fit()`` on the same name) is refused as well. On a network filesystem whose
``flock`` is local to each machine (some NFS setups), drivers on two machines are not kept apart.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any, Dict, Optional

from sgd.storage.errors import RunInUseError

#: The lock file in every run folder.
LOCK_FILE = ".driver.lock"


class RunLock:
    """An acquired lock on one run folder; :meth:`release` (or the process's end) lets it go."""

    def __init__(self, path: Path, handle: IO[str]):
        self.path = path
        self._handle: Optional[IO[str]] = handle

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        """Take the lock of ``run_dir`` (made if missing), or raise at once.

        :raises RunInUseError: another driver holds it; the message names its pid, host and
            when it started, and what to do.
        """
        import fcntl

        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(handle)
            handle.close()
            raise RunInUseError(
                f"another driver is running in {run_dir} now ({_describe(holder)}), and two drivers writing "
                "one run would mix their results and checkpoints: nothing was written. Wait for it to end "
                "(or stop it) and run again to resume the run, or give this run another name "
                "(RunConfig(name=...)).") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}))
        handle.flush()
        return cls(path, handle)

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        """Let the lock go (closing the file drops it); the file stays, for the next driver."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()


def check_free(run_dir: Path) -> None:
    """Raise now if another driver holds ``run_dir`` (a check before workers start; the lock
    itself is taken when the run opens, which refuses a driver that came in between).

    :raises RunInUseError: as :meth:`RunLock.acquire`.
    """
    if (run_dir / LOCK_FILE).exists():
        RunLock.acquire(run_dir).release()


def holder_of(run_dir: Path) -> Optional[Dict[str, Any]]:
    """What the last driver to take ``run_dir``'s lock wrote in it (pid, host, time), or ``None``."""
    try:
        with open(run_dir / LOCK_FILE, encoding="utf-8") as f:
            return _holder(f)
    except OSError:
        return None


def _holder(handle: IO[str]) -> Optional[Dict[str, Any]]:
    try:
        handle.seek(0)
        value = json.loads(handle.read() or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _describe(holder: Optional[Dict[str, Any]]) -> str:
    if not holder:
        return "its pid is not known yet"
    started = holder.get("time")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, since {when}"
