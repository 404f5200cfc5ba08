"""Where a worker is: the Python stack of each of its threads, taken from another thread.

Used by ``Trainer.stacks()``, ``sgd stacks`` and the hang watchdog. The training thread
(``sgd-train``) comes first; Ray's own threads are left out unless asked for, since they are
the same in every worker and say nothing about the training function.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from typing import Dict, List, Optional

#: The training function's thread (see sgd._worker.session).
TRAIN_THREAD = "sgd-train"
_RAY_INTERNAL = ("/ray/", "concurrent/futures/thread.py", "/threading.py", "/queue.py", "/selectors.py", "/asyncio/")


def thread_stacks(rank: int, include_idle: bool = False) -> str:
    """Every thread's stack in this process as text, under a header naming the rank, pid and host."""
    frames = sys._current_frames()
    names: Dict[int, str] = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
    me = threading.get_ident()
    parts: List[str] = []
    order = sorted(frames, key=lambda ident: (names.get(ident) != TRAIN_THREAD, names.get(ident, "")))
    for ident in order:
        if ident == me:
            continue  # the thread answering this question
        stack = "".join(traceback.format_stack(frames[ident]))
        name = names.get(ident, f"thread {ident}")
        if not include_idle and name != TRAIN_THREAD and _only_waiting(stack):
            continue
        parts.append(f"--- thread {name!r} ---\n{stack}")
    header = f"=== rank {rank} (pid {os.getpid()} on {socket.gethostname()}) ==="
    return header + "\n" + ("\n".join(parts) if parts else "(no thread of the training function is running)\n")


def _only_waiting(stack: str) -> bool:
    """A thread of Ray's or the standard library's, idle in a wait: the same in every worker."""
    user = [line for line in stack.splitlines() if line.lstrip().startswith("File ")]
    return all(any(mark in line for mark in _RAY_INTERNAL) for line in user)


def innermost_user_frame(stacks: str) -> Optional[str]:
    """The innermost ``File "...", line N, in f`` of the training thread in ``thread_stacks``'
    text: where the training function is (compared across ranks to find stragglers)."""
    section = stacks.split(f"--- thread {TRAIN_THREAD!r} ---", 1)
    if len(section) < 2:
        return None
    lines = [ln.strip() for ln in section[1].split("--- thread ", 1)[0].splitlines() if ln.strip().startswith("File ")]
    return lines[-1] if lines else None
