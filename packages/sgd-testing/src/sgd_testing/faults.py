"""Failure injection for tests: kill a worker's process at a chosen point of a run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, Callable, Dict, Iterable, List, Tuple, Union

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


class RoomFreedAt(sgd.TrainingCallback):
    """Room that appears mid-run, for an elastic group to grow into: once every CPU of the
    cluster is free, a Ray actor takes ``cpus`` of them (so a group started next gets fewer
    workers than its max), and it is killed, giving them back, when the round whose
    ``results[0][key]`` is ``at`` arrives. ``rounds`` holds every delivered round.

    :param cpus: how many CPUs to hold until then.
    """

    def __init__(self, cpus: float, at: Any, *, key: str = "step", timeout: float = 30.0):
        import ray

        wait_for(lambda: ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0),
                 timeout=timeout, message="the cluster's CPUs were not all free")
        self.at, self.key = at, key
        self.rounds: List[List[Dict[str, Any]]] = []
        holder: Any = ray.remote(num_cpus=cpus)(_Holder).remote()
        ray.get(holder.ready.remote())
        self._holder: Any = holder

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:

        self.rounds.append(results)
        if results[0][self.key] == self.at:
            self.release()

    def release(self) -> None:
        """Give the held CPUs back now (also what a test that failed before round ``at`` must do:
        a failed test's traceback keeps this object, and so the holder, alive)."""
        import ray

        holder, self._holder = self._holder, None
        if holder is not None:
            ray.kill(holder)


class _Holder:
    def ready(self) -> bool:
        return True


def grow_during_run(backend: Any, train_func: Callable[[Dict[str, Any]], Any], config: Dict[str, Any], *,
                    num_workers: Tuple[int, int] = (2, 3), cpus: float = 2, at: Any = 3,
                    key: str = "step") -> Tuple[List[List[Dict[str, Any]]], Any]:
    """Run ``train_func`` on an elastic ``sgd.Trainer(backend=..., num_workers=...)`` started
    while ``cpus`` of the cluster are held (:class:`RoomFreedAt`), freed when round ``at``
    arrives: the group starts below its max and may grow mid-run (make the controller check
    for room often: ``sgd.run.controller.GROW_CHECK_INTERVAL_S``). Every delivered round and
    the run's return values.
    """
    free = RoomFreedAt(cpus=cpus, at=at, key=key)
    trainer = sgd.Trainer(backend=backend, num_workers=num_workers, max_retries=0)
    trainer.start()
    try:
        out = trainer.run(train_func, config=config, callbacks=[free])
    finally:
        trainer.shutdown()
        free.release()
    return free.rounds, out


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
