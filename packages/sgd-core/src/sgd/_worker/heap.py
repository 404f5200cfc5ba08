"""A worker process's heap, kept out of the garbage collector's full passes.

A worker imports its framework (torch alone leaves about 220,000 objects the collector tracks)
and then runs many short runs whose reports allocate steadily. CPython's oldest-generation
collection walks every tracked object, about 90 ms of CPU here, and since the workers of a group
allocate in lock-step they reach it in the same round: at N = 32 on two cores a 200-round run took
1.5 s instead of 0.15 s once every 20–40 runs (measured for issue 35, ``docs/scaling.md``).
Before its first run starts, each worker process collects its young generations and moves what
survives (modules, the framework, the process group) into the permanent generation
(:func:`gc.freeze`): later passes walk only what the runs made. Garbage cycles made later are
collected as always. The old generation is not collected first: that pass is itself the cost
this avoids (every worker at once, on the first run), and what it would free after the imports
is a few dozen objects (26 after importing torch, Ray and sgd).

``SGD_GC_FREEZE=0`` turns it off.
"""

from __future__ import annotations

import gc
import os
import threading

_lock = threading.Lock()
_settled = False


def settle() -> bool:
    """Collect the young generations, then freeze the heap, once per process (before its first
    run); whether this call did it. Off with ``SGD_GC_FREEZE=0``."""
    global _settled
    if _settled or os.environ.get("SGD_GC_FREEZE", "1") == "0":
        return False
    with _lock:
        if _settled:
            return False
        _settled = True
        gc.collect(1)
        gc.freeze()
        return True
