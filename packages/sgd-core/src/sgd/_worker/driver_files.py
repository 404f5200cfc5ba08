"""Files between a worker on a host of its own and the driver's disk.

On a real cluster a worker's host has a disk of its own: a file it writes into the run directory
path lands on that host, not on the driver's, and a checkpoint folder on the driver's disk is not
there to read. Ray moves the bytes instead. One small actor per run, :class:`DriverFileServer`,
runs on the driver's host (0 CPUs, pinned to its node) and reads and writes there, inside the
folders the driver allowed; workers reach it through :class:`DriverFiles`:

- :meth:`DriverFiles.upload` copies a local file to a path on the driver's disk in chunks of
  :data:`CHUNK_BYTES` (a few in flight at once), and the file appears under its name only once
  every byte is there (written as ``<name>.sgd-part``, then renamed);
- :meth:`DriverFiles.read` returns a byte range of a file on the driver's disk.

Neither side holds more than a few chunks at once, whatever the file's size. Workers on the
driver's host do not need it: they share the disk (:attr:`Session.shares_driver_disk`).

The driver tells the server of each run's folders (:meth:`DriverFileServer.allow`) without
waiting for it before the run starts: each telling has a number, the run's workers send the
number their run was told with every request, and a request outside the folders served so far
waits for that telling (:data:`ALLOW_WAIT_S` at most) before it is refused. A request outside
every folder it may use is refused at once.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Sequence

import ray

#: Bytes per transfer: large enough that Ray's per-call cost is small against the copy.
CHUNK_BYTES = 16 * 1024 * 1024
#: Chunks of one upload in flight at once.
WINDOW = 4
#: How long a request waits for the telling of the folders its run may use (sent by the driver
#: before the run's start calls, so it comes within milliseconds), seconds.
ALLOW_WAIT_S = 60.0
_PART = ".sgd-part"


def _inside(path: str, roots: Sequence[str]) -> Optional[str]:
    """``path`` resolved, when it lies inside one of ``roots`` (also resolved); else ``None``."""
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return real
    return None


class DriverFileServer:
    """Reads and writes files on the driver's host for workers elsewhere (a Ray actor).

    :param writable: the folders workers may write into (the run directory).
    :param readable: the folders workers may also read from (a checkpoint the run started from).
    """

    def __init__(self, writable: Sequence[str], readable: Sequence[str] = ()) -> None:
        self._writable = [str(p) for p in writable]
        self._readable = self._writable + [str(p) for p in readable]
        self._received: Dict[str, int] = {}  # bytes written per partial file (chunks arrive in any order)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # a telling arrived (see allow)
        self._allowed = 0  # the number of the last telling of folders that arrived (see allow)

    def allow(self, writable: Sequence[str], readable: Sequence[str] = (), number: int = 0) -> None:
        """Serve more folders: a later run of the same group (its own run directory, the
        checkpoint it starts from). The server lives as long as the group. ``number``: this
        telling's (the driver counts them): requests of the run told with it wait for it."""
        with self._lock:
            for p in map(str, writable):
                if p not in self._writable:
                    self._writable.append(p)
                    self._readable.append(p)
            for p in map(str, readable):
                if p not in self._readable:
                    self._readable.append(p)
            self._allowed = max(self._allowed, number)
            self._arrived.notify_all()

    def _check(self, path: str, roots: List[str], what: str, told: int = 0) -> str:
        """``path`` resolved, inside ``roots``; a path outside them waits until the telling
        number ``told`` (the requesting run's) arrived, then is refused if still outside."""
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ValueError(f"{what}: {path!r} is not an absolute path on the driver's host")
        real = _inside(path, roots)
        if real is None and told > self._allowed:
            with self._lock:
                self._arrived.wait_for(lambda: self._allowed >= told, ALLOW_WAIT_S)
            real = _inside(path, roots)
        if real is None:
            raise PermissionError(f"{what}: {path} is outside the folders this run may use on the driver's host "
                                  f"({', '.join(roots)})")
        return real

    def write(self, path: str, offset: int, data: bytes, told: int = 0) -> int:
        """Write ``data`` at ``offset`` of ``path``'s partial file; return how many bytes."""
        real = self._check(path, self._writable, "write", told)
        os.makedirs(os.path.dirname(real), exist_ok=True)
        fd = os.open(real + _PART, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            written = os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        with self._lock:
            self._received[real] = self._received.get(real, 0) + written
        return written

    def append(self, path: str, data: bytes, told: int = 0) -> None:
        """Append ``data`` to ``path`` (a log: visible as it grows)."""
        real = self._check(path, self._writable, "append", told)
        os.makedirs(os.path.dirname(real), exist_ok=True)
        with open(real, "ab") as f:
            f.write(data)

    def commit(self, path: str, size: int, told: int = 0) -> None:
        """Give ``path`` its content, once every byte of ``size`` arrived (an empty file too)."""
        real = self._check(path, self._writable, "commit", told)
        part = real + _PART
        if size == 0 and not os.path.exists(part):
            os.makedirs(os.path.dirname(real), exist_ok=True)
            open(part, "wb").close()
        with self._lock:
            got = self._received.pop(real, 0)
        if got != size or os.path.getsize(part) != size:
            raise OSError(f"{path}: {got} of {size} bytes arrived on the driver's host; not committed")
        with open(part, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(part, real)

    def read(self, path: str, offset: int, length: int, told: int = 0) -> bytes:
        """``length`` bytes of ``path`` from ``offset`` (fewer at the end of the file)."""
        real = self._check(path, self._readable, "read", told)
        with open(real, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def size(self, path: str, told: int = 0) -> int:
        return os.path.getsize(self._check(path, self._readable, "size", told))


def start_server(driver_node_id: str, writable: Sequence[str], readable: Sequence[str] = ()) -> Any:
    """Start a :class:`DriverFileServer` on the driver's node; return its handle."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(num_cpus=0, max_concurrency=8)(DriverFileServer)  # type: ignore[call-overload]
    return actor.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=driver_node_id, soft=False),
        name=None,
    ).remote(list(writable), list(readable))


class DriverFiles:
    """A worker's way to files on the driver's disk (see the module docstring)."""

    def __init__(self, server: Any, told: int = 0) -> None:
        self._server = server
        self._told = told  # the number of the telling of this run's folders (see the module's docstring)

    def upload(self, local_path: str, driver_path: str) -> int:
        """Copy the local file ``local_path`` to ``driver_path`` on the driver's host; return its
        size. The file is there under its name only once complete."""
        size = os.path.getsize(local_path)
        pending: List[Any] = []
        with open(local_path, "rb") as f:
            offset = 0
            while offset < size:
                data = f.read(CHUNK_BYTES)
                pending.append(self._server.write.remote(driver_path, offset, data, self._told))
                offset += len(data)
                del data
                if len(pending) >= WINDOW:
                    done, pending = ray.wait(pending, num_returns=1)
                    ray.get(done)
        ray.get(pending)
        ray.get(self._server.commit.remote(driver_path, size, self._told))
        return size

    def append(self, driver_path: str, data: bytes) -> None:
        """Append ``data`` to ``driver_path`` on the driver's host."""
        ray.get(self._server.append.remote(driver_path, data, self._told))

    def read(self, driver_path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``driver_path`` on the driver's host from ``offset``."""
        refs = [self._server.read.remote(driver_path, start, min(CHUNK_BYTES, offset + length - start), self._told)
                for start in range(offset, offset + length, CHUNK_BYTES)]
        if len(refs) == 1:
            return ray.get(refs[0])
        return b"".join(ray.get(refs))

    def size(self, driver_path: str) -> int:
        """The size of ``driver_path`` on the driver's host."""
        return ray.get(self._server.size.remote(driver_path, self._told))
