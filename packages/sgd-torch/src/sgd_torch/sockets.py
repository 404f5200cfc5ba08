"""The connections a communicator opened in this process, kept so that an interrupt can make a
collective blocked on a lost peer fail at once (:func:`sgd.backend.on_worker_interrupt`).

sgd-torch records what ``init_process_group`` opens; sgd-horovod what ``hvd.init()`` opens
(Horovod's Gloo context). Shutting a connection down (not closing it: the communicator still
owns the descriptor) makes every pending and later operation on it fail, here and on the peer
at the other end. Listening sockets are left alone (gloo's listener thread aborts on one).
Linux only (``/proc/self/fd``); elsewhere nothing is recorded and a blocked collective ends at
its timeout.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any, Callable, Dict, List, Tuple


def socket_inodes() -> Dict[int, str]:
    """Every socket descriptor of this process: ``{fd: "socket:[inode]"}``."""
    out: Dict[int, str] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(fd)] = link
    return out


class OpenedSockets:
    """The sockets the last call of a recorded function opened (see the module docstring)."""

    def __init__(self) -> None:
        self._sockets: List[Tuple[int, str]] = []

    def recording(self, init: Callable[..., Any]) -> Callable[..., Any]:
        """``init`` that records the sockets each call opens (replacing the previous record).
        The wrapper has ``_sgd_tracked = True``, so that it is not wrapped twice."""

        @functools.wraps(init)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            before = socket_inodes()
            out = init(*args, **kwargs)
            self._sockets[:] = [(fd, link) for fd, link in socket_inodes().items() if before.get(fd) != link]
            return out

        recorded._sgd_tracked = True  # type: ignore[attr-defined]
        return recorded

    def shut_down(self) -> None:
        """Shut down every recorded connection that is still open (a descriptor closed since,
        and its number reused, is left alone)."""
        for fd, link in list(self._sockets):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != link:
                    continue
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.close()


__all__ = ["OpenedSockets", "socket_inodes"]
