"""Each worker's stdout and stderr, also in ``run_dir/logs/rank_N.log`` on the driver's disk.

While a run's training function runs, a worker's file descriptors 1 and 2 point into a pipe; a
thread reads it and writes every line twice: to where the descriptor pointed before (Ray's log
file for the worker, which Ray forwards to the driver's console), prefixed ``[rank N]``; and to
the rank's log file. At the level of file descriptors, so ``print``, ``logging`` handlers made
before the run, C extensions (gloo, NCCL) and subprocesses are all caught. The pipe and its
thread are made once per process and kept across runs (:class:`_Tee`); a run only points the
descriptors at it and back.

A log begins with a header line (rank, pid, host, when the run began), written with the run's
first output: a run that printed nothing has no file. A worker on the driver's host appends to
the file itself. A worker on a host with a disk of its own hands what it wrote to its session
(``sink``), which sends it to the driver with its poll replies (a ``LOG`` item: no call of its
own), at least every half second or 64 KB, and what is left with the reply that ends the run;
the driver appends it (:meth:`RankLogFiles.append`).
"""

from __future__ import annotations

import os
import select
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


class _Tee:
    """Descriptors 1 and 2 of this process, while a run is attached, into one pipe that one
    thread reads. Made at the process's first run and kept for the next ones: a run costs four
    ``dup2`` calls, not a pipe, a thread and a join (issue 35: the workers' per-run setup).

    The reader takes what the pipe holds only under the lock, so :meth:`detach` (descriptors
    put back, then under the lock the pipe drained) knows that every byte the run wrote is in
    its log when it returns, without waiting for the reader thread."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._console = {fd: os.dup(fd) for fd in (1, 2)}  # where 1 and 2 point between runs
        self._lock = threading.Lock()
        self._log: Optional[RankLog] = None
        self._rest = b""  # a line not yet ended
        self._reader = threading.Thread(target=self._read, name="sgd-rank-log", daemon=True)
        self._reader.start()

    def attach(self, log: RankLog) -> None:
        _flush_streams()
        with self._lock:
            if self._log is not None:
                raise RuntimeError("a rank log is already attached in this process")
            for fd, saved in self._console.items():
                os.dup2(fd, saved)  # 1 and 2 as they are now (a test's capture may have moved them)
            self._log = log
        for fd in (1, 2):
            os.dup2(self._write_fd, fd)

    def detach(self, log: RankLog) -> None:
        """Put 1 and 2 back and hand everything the run wrote to ``log``."""
        _flush_streams()
        with self._lock:
            if self._log is not log:
                return
            for fd, saved in self._console.items():
                os.dup2(saved, fd)
            self._drain()
            if self._rest:
                rest, self._rest = self._rest, b""
                self._console_write(log.prefix + rest + b"\n")
                log.write(rest + b"\n")
            self._log = None

    def _read(self) -> None:
        while True:
            try:
                select.select([self._read_fd], [], [])
            except (OSError, ValueError):
                return
            with self._lock:
                self._drain()

    def _drain(self) -> None:
        """What the pipe holds, to the attached log and the console (the lock held)."""
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except OSError:  # nothing more to read now (BlockingIOError), or the pipe is gone
                return
            if not chunk:
                return
            lines = (self._rest + chunk).split(b"\n")
            self._rest = lines.pop()
            if not lines:
                continue
            log = self._log
            if log is None:  # after a run: a subprocess it left behind
                self._console_write(b"".join(line + b"\n" for line in lines))
                continue
            self._console_write(b"".join(log.prefix + line + b"\n" for line in lines))
            log.write(b"".join(line + b"\n" for line in lines))

    def _console_write(self, data: bytes) -> None:
        try:
            os.write(self._console[1], data)
        except OSError:
            pass


def _flush_streams() -> None:
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


_TEE: Optional[_Tee] = None
_TEE_LOCK = threading.Lock()


def _tee() -> _Tee:
    global _TEE
    with _TEE_LOCK:
        if _TEE is None:
            _TEE = _Tee()
        return _TEE


class RankLog:
    """The tee of one run on one worker, from its making to :meth:`close` (which puts the
    descriptors back). The file (or the first item for the sink) begins with a header line
    (rank, pid, host, when the run began), written with the run's first output: a run that
    printed nothing leaves no file and sends the driver nothing.

    :param sink: for a worker on another host than the driver's: called with each chunk of
        output instead of writing ``path`` (the session sends it to the driver).
    """

    def __init__(self, rank: int, path: str, sink: Optional[Callable[[bytes], None]] = None) -> None:
        self._rank = rank
        self._path = path
        self._sink = sink
        self.prefix = f"[rank {rank}] ".encode()
        self._file: Optional[Any] = None
        self._began = time.time()
        self._written = False  # the header is out
        self._broken = False  # the file could not be written: console only
        self._closed = False
        self._tee = _tee()
        self._tee.attach(self)

    def write(self, data: bytes) -> None:
        """Append ``data`` to the log (the tee's lock held, or the run's thread at its end)."""
        if not self._written:
            self._written = True
            data = (f"=== rank {self._rank}: pid {os.getpid()} on {socket.gethostname()}, "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self._began))} ===\n").encode() + data
        if self._sink is not None:
            self._sink(data)
            return
        if self._broken:
            return
        try:
            if self._file is None:
                os.makedirs(os.path.dirname(self._path), exist_ok=True)
                self._file = open(self._path, "ab", buffering=0)
            self._file.write(data)
        except OSError as e:  # a full disk must not stop the reader: the pipe would fill and block the worker
            self._broken = True
            file, self._file = self._file, None
            if file is not None:
                try:
                    file.close()
                except OSError:
                    pass
            self._tee._console_write(self.prefix + f"sgd: cannot write {self._path} any more ({e}); "
                                     "this rank's output goes to the console only\n".encode(errors="replace"))

    def note(self, text: str) -> None:
        """Add ``text`` to the log only (the driver shows it on the console already)."""
        data = text.encode(errors="replace") + (b"" if text.endswith("\n") else b"\n")
        with self._tee._lock:
            self.write(data)

    def close(self) -> None:
        """Put descriptors 1 and 2 back; write (or hand to the sink) what is left."""
        if self._closed:
            return
        self._closed = True
        self._tee.detach(self)
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
