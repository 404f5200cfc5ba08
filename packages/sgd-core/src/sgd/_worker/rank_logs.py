"""Each worker's stdout and stderr, also in ``run_dir/logs/rank_N.log`` on the driver's disk.

While a run's training function runs, a worker's file descriptors 1 and 2 point into a pipe; a
thread reads it and writes every line twice: to where the descriptor pointed before (Ray's log
file for the worker, which Ray forwards to the driver's console), prefixed ``[rank N]``; and to
the rank's log file. At the level of file descriptors, so ``print``, ``logging`` handlers made
before the run, C extensions (gloo, NCCL) and subprocesses are all caught.

A worker on the driver's host appends to the file itself. A worker on a host with a disk of its
own hands what it wrote to its session (``sink``), which sends it to the driver with its poll
replies (a ``LOG`` item: no call of its own), at least every half second or 64 KB, and what is
left with the reply that ends the run; the driver appends it (:func:`append_rank_log`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, List, Optional

#: How often (seconds) and from how many bytes a worker elsewhere sends its log lines.
FLUSH_S = 0.5
FLUSH_BYTES = 64 * 1024


#: Most bytes of output a worker on another host keeps for the driver (while the driver does not
#: poll it); beyond, the oldest are dropped (and the log says how many).
MAX_LOG_BYTES = 16 * 1024 * 1024


class PendingOutput:
    """A worker's output waiting to travel to the driver with a poll reply (a worker on another
    host than the driver's). Not locked: its owner (the session) holds its condition."""

    def __init__(self) -> None:
        self._chunks: List[bytes] = []
        self._bytes = 0
        self._since = 0.0  # when the oldest chunk came
        self._dropped = 0

    def add(self, data: bytes) -> bool:
        """Keep ``data`` (dropping the oldest beyond :data:`MAX_LOG_BYTES`); whether enough
        waits (:data:`FLUSH_BYTES`) for it to be sent now."""
        if not self._chunks:
            self._since = time.monotonic()
        self._chunks.append(data)
        self._bytes += len(data)
        while self._bytes > MAX_LOG_BYTES and len(self._chunks) > 1:
            dropped = self._chunks.pop(0)
            self._bytes -= len(dropped)
            self._dropped += len(dropped)
        return self._bytes >= FLUSH_BYTES

    def due_in(self, now: float) -> Optional[float]:
        """Seconds until what waits must be sent (``<= 0``: now), ``None`` when nothing waits."""
        if not self._chunks:
            return None
        return 0.0 if self._bytes >= FLUSH_BYTES else self._since + FLUSH_S - now

    def take(self) -> Optional[bytes]:
        """Everything waiting, prefixed by a line saying what was dropped; ``None`` if nothing."""
        if not self._chunks:
            return None
        data = b"".join(self._chunks)
        if self._dropped:
            data = (f"[sgd: {self._dropped} bytes of output dropped: the driver did not take them in "
                    "time]\n").encode() + data
        self._chunks, self._bytes, self._dropped = [], 0, 0
        return data


class RankLog:
    """The tee of one run on one worker: :meth:`close` puts the descriptors back.

    :param sink: for a worker on another host than the driver's: called with each chunk of
        output instead of writing ``path`` (the session sends it to the driver).
    """

    def __init__(self, rank: int, path: str, sink: Optional[Callable[[bytes], None]] = None) -> None:
        self._rank = rank
        self._path = path
        self._sink = sink
        self._prefix = f"[rank {rank}] ".encode()
        self._file: Optional[Any] = None
        if sink is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._file = open(path, "ab", buffering=0)
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self._read_fd, write_fd = os.pipe()
        import sys

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        for fd in (1, 2):
            os.dup2(write_fd, fd)
        os.close(write_fd)
        self._reader = threading.Thread(target=self._read, name="sgd-rank-log", daemon=True)
        self._reader.start()
        self._log(f"=== rank {rank}: pid {os.getpid()} on {socket.gethostname()}, "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode())

    def _read(self) -> None:
        rest = b""
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if lines:
                text = b"".join(line + b"\n" for line in lines)
                self._console(b"".join(self._prefix + line + b"\n" for line in lines))
                self._log(text)
        if rest:
            self._console(self._prefix + rest + b"\n")
            self._log(rest + b"\n")

    def _console(self, data: bytes) -> None:
        try:
            os.write(self._saved[1], data)
        except OSError:
            pass

    def _log(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
            return
        if self._file is None:
            return
        try:
            self._file.write(data)
        except OSError as e:  # a full disk must not stop the reader: the pipe would fill and block the worker
            file, self._file = self._file, None
            try:
                file.close()
            except OSError:
                pass
            self._console(self._prefix + f"sgd: cannot write {self._path} any more ({e}); "
                          "this rank's output goes to the console only\n".encode(errors="replace"))

    def note(self, text: str) -> None:
        """Add ``text`` to the log only (the driver shows it on the console already)."""
        self._log(text.encode(errors="replace") + (b"" if text.endswith("\n") else b"\n"))

    def close(self) -> None:
        """Put descriptors 1 and 2 back; write (or hand to the sink) what is left."""
        import sys

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # the pipe's last writer is gone: the reader sees its end
        self._reader.join(timeout=5)
        os.close(self._read_fd)
        for saved in self._saved.values():
            os.close(saved)
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass


def rank_log_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "logs", f"rank_{rank}.log")


class RankLogFiles:
    """On the driver: what the workers on other hosts printed (``LOG`` items of their poll
    replies), appended to their ``run_dir/logs/rank_N.log`` (one ``open``/``write``/``close`` at
    the level of file descriptors per item; the folder made once)."""

    def __init__(self, run_dir: str) -> None:
        self._folder = os.path.join(run_dir, "logs")
        self._made = False

    def append(self, rank: int, data: bytes) -> None:
        """Raises ``OSError``."""
        if not self._made:
            os.makedirs(self._folder, exist_ok=True)
            self._made = True
        fd = os.open(os.path.join(self._folder, f"rank_{int(rank)}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
