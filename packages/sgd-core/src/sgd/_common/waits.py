"""The driver's waits on Ray, in slices, so that Ctrl-C ends them whatever Ray does.

A signal's Python handler (``KeyboardInterrupt`` for Ctrl-C, a test's timeout) runs only when the
waiting thread is back in Python. Ray 2.60's ``ray.wait`` checks for signals while it blocks (a
SIGINT ended a 60 s wait after 0.15 s, and after 0.03 s through Ray Client; measured 2026-11-26),
but that is how Ray is built, not what it promises. Waits of at most :data:`WAIT_SLICE_S` bound
how long a signal waits either way, as the round collector's waits do.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

import ray

#: The longest single ``ray.wait`` the driver makes.
WAIT_SLICE_S = 1.0


def wait(refs: Sequence[Any], num_returns: Optional[int] = None,
         timeout: Optional[float] = None) -> Tuple[List[Any], List[Any]]:
    """``ray.wait(refs, num_returns=..., timeout=...)`` made of waits of at most :data:`WAIT_SLICE_S`.

    :param num_returns: how many to wait for (default: all of them).
    :param timeout: seconds in all; ``None`` waits until ``num_returns`` are ready.
    :returns: ``(ready, not_ready)``, as ``ray.wait``: ``ready`` holds ``num_returns`` of
        them unless the timeout passed first.
    """
    pending = list(refs)
    want = len(pending) if num_returns is None else min(num_returns, len(pending))
    deadline = None if timeout is None else time.monotonic() + timeout
    ready: List[Any] = []
    while len(ready) < want:
        left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
        done, pending = ray.wait(pending, num_returns=want - len(ready), timeout=left)
        ready += done
        if deadline is not None and time.monotonic() >= deadline:
            break
    return ready, pending
