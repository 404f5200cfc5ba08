"""Failure injection for tests: kill a worker's process at a chosen point of a run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, Callable, Dict, Iterable, List, Union

import sgd
from sgd_testing.fixtures import wait_for


class KillWorker(sgd.TrainingCallback):
    """SIGKILLs one worker's process when a delivered round reaches a chosen value.

    The training function reports its process id under ``"pid"`` (``os.getpid()``).
    Each value in ``at`` kills once: a round replayed after the restart does not kill again.

    :param at: the value(s) of ``results[0][key]`` at which to kill.
    :param key: the reported metric to watch.
    :param rank: whose process to kill.

    ``rounds`` holds rank 0's result of every delivered round, ``killed`` the pids killed.
    """

    def __init__(self, at: Union[Any, Iterable[Any]], *, key: str = "epoch", rank: int = 1):
        self.at = set(at) if isinstance(at, (list, tuple, set, frozenset, range)) else {at}
        self.key = key
        self.rank = rank
        self.rounds: List[Dict[str, Any]] = []
        self.killed: List[int] = []

    def values(self, key: str) -> List[Any]:
        """``key`` of every delivered round, in order."""
        return [r[key] for r in self.rounds]

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        self.rounds.append(results[0])
        value = results[0][self.key]
        if value in self.at:
            self.at.discard(value)
            pid = int(results[self.rank]["pid"])
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


def sigkill_when(script: str, condition: Callable[[], Any], *, timeout: float = 120.0, message: str = "") -> None:
    """Run ``script`` in a Python process of its own and SIGKILL it once ``condition()``
    is true: a driver (or writer) dying at a chosen point, with no chance to clean up.

    :raises AssertionError: ``condition`` did not hold within ``timeout`` seconds (the
        process is killed all the same), or the process ended before the kill.
    """
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: condition() or proc.poll() is not None, timeout=timeout,
                 message=message or f"condition not met within {timeout}s")
        assert proc.poll() is None, f"the script ended with exit code {proc.returncode} before the kill"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
