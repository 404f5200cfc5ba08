"""The collective actor: where the ranks of a run meet for ``sgd.collective``.

One small asyncio actor (0 CPUs, on the driver's node, as Ray Train 2.60's synchronization
actor) serves every worker group of a driver process: it is started with the first group and
reused by the later ones (a new process per trainer would cost each ``trainer.start()`` about a
CPU-second), each group's collectives kept apart by the group's key. Owned by the driver's
process, it ends with it. Its state per group is a :class:`~sgd._common.rendezvous.Rendezvous`;
each rank's call waits in the actor until its collective is decided. A broadcast's data never
passes through it: rank 0 puts the object in Ray's object store and the actor hands the reference
on, so no size limit applies beyond the object store's. The driver does nothing per collective:
it tells each run its group key, token and settings with the run information
(:func:`collective_run`).

Timeouts and warnings are the waiting ranks' (:mod:`sgd._worker.collective`): the actor has no
timer.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import ray

from sgd._common.rendezvous import Collective, Outcome, Rendezvous

#: How long a collective call may wait for every rank (seconds; unset, empty or ``none``: no
#: limit, as in Ray). Ray Train 2.60's name is read when sgd's is not set.
TIMEOUT_ENV = ("SGD_COLLECTIVE_TIMEOUT_S", "RAY_TRAIN_COLLECTIVE_TIMEOUT_S")
#: How often a waiting collective logs which ranks it waits for (seconds, default 60).
WARN_ENV = ("SGD_COLLECTIVE_WARN_INTERVAL_S", "RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S")
DEFAULT_WARN_INTERVAL_S = 60.0

#: What a run's workers are told: ``(group key, token, timeout_s, warn_interval_s)``.
CollectiveRun = Tuple[str, int, Optional[float], float]


class CollectiveActor:
    """Holds a :class:`Rendezvous` per worker group and wakes the calls it decides (a Ray actor)."""

    def __init__(self) -> None:
        self._groups: Dict[str, Rendezvous] = {}

    def _rendezvous(self, group: str) -> Rendezvous:
        rendezvous = self._groups.get(group)
        if rendezvous is None:
            rendezvous = self._groups[group] = Rendezvous()
        return rendezvous

    @staticmethod
    def _wake(decided: List[Collective]) -> None:
        for collective in decided:
            if collective.event is not None:
                collective.event.set()

    async def arrive(self, group: str, token: int, generation: Any, number: int, rank: int, world_size: int,
                     call: str, payload: Any = None) -> Outcome:
        """Rank ``rank`` makes call ``number``; returns once the call is decided: ``("ok", rank
        0's payload)`` or ``("error", exception)``."""
        collective, decided = self._rendezvous(group).arrive(token, generation, number, rank, world_size, call,
                                                             payload)
        self._wake(decided)
        if collective.outcome is None:
            if collective.event is None:
                collective.event = asyncio.Event()
            await collective.event.wait()
        assert collective.outcome is not None
        return collective.outcome

    async def leave(self, group: str, token: int, generation: Any, rank: int, calls: int) -> None:
        """Rank ``rank``'s training function returned after ``calls`` collective calls."""
        self._wake(self._rendezvous(group).leave(token, generation, rank, calls))

    async def abort(self, group: str, token: int, generation: Any, number: int, timeout_s: float) -> None:
        """A rank waited ``timeout_s`` in call ``number``: fail it for every rank."""
        self._wake(self._rendezvous(group).abort(token, generation, number, timeout_s))

    async def status(self, group: str, token: int, generation: Any,
                     number: int) -> Optional[Tuple[str, List[int], List[int], float]]:
        """Who is in call ``number`` and who is missing (see :meth:`Rendezvous.status`)."""
        return self._rendezvous(group).status(token, generation, number)

    async def forget(self, group: str) -> None:
        """The group shut down: fail what it left open and drop its state."""
        rendezvous = self._groups.pop(group, None)
        if rendezvous is not None:
            self._wake(rendezvous.close())

    async def groups(self) -> int:
        """How many groups it holds state for (for tests)."""
        return len(self._groups)


_LOCK = threading.Lock()
# (the Ray cluster's driver node id, this process's job id) -> the actor's handle
_SHARED: Dict[Tuple[str, str], Any] = {}


def collective_actor() -> Any:
    """This driver process's collective actor, started on its node on first use (not waited for)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    context = ray.get_runtime_context()
    node = context.get_node_id()
    key = (node, context.get_job_id())  # a new cluster (ray.shutdown, ray.init) is a new node
    with _LOCK:
        actor = _SHARED.get(key)
        if actor is None:
            _SHARED.clear()  # handles of an earlier cluster
            # An asyncio actor: a waiting call costs a coroutine, not a thread, however many ranks
            # wait. Restarted if its process dies (the runs waiting in it then fail over).
            remote = ray.remote(num_cpus=0, max_concurrency=100_000, max_restarts=-1)(  # type: ignore[call-overload]
                CollectiveActor)
            # Pinned explicitly: inside a Tune trial the trial's placement group would capture it otherwise.
            actor = _SHARED[key] = remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False), name=None).remote()
        return actor


def _env_seconds(names: Tuple[str, ...], default: Optional[float]) -> Optional[float]:
    for name in names:
        value = os.environ.get(name)
        if value is None:
            continue
        text = value.strip()
        if text.lower() in ("", "none"):
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(f"{name} must be a number of seconds > 0, or 'none' for no limit; got {value!r}")
        return seconds
    return default


def collective_run(group: str, token: int) -> CollectiveRun:
    """What a run's workers are told for ``sgd.collective``: the group's key, the run's token, and
    the settings read from the driver's environment now (:data:`TIMEOUT_ENV`, :data:`WARN_ENV`)."""
    warn = _env_seconds(WARN_ENV, DEFAULT_WARN_INTERVAL_S)
    return group, token, _env_seconds(TIMEOUT_ENV, None), DEFAULT_WARN_INTERVAL_S if warn is None else warn


__all__ = ["CollectiveActor", "CollectiveRun", "collective_actor", "collective_run"]
