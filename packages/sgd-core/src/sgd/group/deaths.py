"""Deaths of a group's actors, as the controller wants to see them: Ray's actor-death exceptions
as :class:`~sgd.errors.WorkerDiedError` naming the rank and what was being done, and which
workers survived a death (alive, their run ended when asked to stop)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, List, Optional

import ray
from ray.exceptions import RayActorError

from sgd._common.waits import wait
from sgd.errors import WorkerDiedError
from sgd.group.rounds import short_error
from sgd.worker_group import WorkerGroup

logger = logging.getLogger("sgd")


def idle_survivors(wg: WorkerGroup, patience_s: float, extend: bool = False) -> List[int]:
    """Indices of the workers that are alive and whose run ended within ``patience_s`` (each
    is asked to stop first); with ``extend``, within ``patience_s`` of the last run that
    ended. Dead workers answer at once, with an error."""
    from ray.exceptions import RayError

    stops = [w._sgd_stop.remote() for w in wg.workers]
    watches = {w._sgd_watch.remote(): i for i, w in enumerate(wg.workers)}
    waiting, alive = list(watches), []
    deadline = time.monotonic() + patience_s
    while waiting:
        # Every call that has returned, else the first to return within the time left.
        ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        if not ready:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, waiting = wait(waiting, num_returns=1, timeout=left)
            if not ready:
                break
        for ref in ready:
            try:
                ray.get(ref)
                alive.append(watches[ref])
            except RayError as exc:
                logger.debug("worker %d is not kept: its watch failed: %s", watches[ref], short_error(exc))
        if ready and extend:
            deadline = time.monotonic() + patience_s
    for ref in ray.wait(stops, num_returns=len(stops), timeout=0)[0]:  # read: no "unhandled error" logs
        try:
            ray.get(ref)
        except RayError:
            pass
    return sorted(alive)


@contextlib.contextmanager
def deaths_as_errors(group: Optional[WorkerGroup], doing: str) -> Iterator[None]:
    """Turn Ray's actor-death exceptions raised inside the block into :class:`WorkerDiedError`
    naming the rank (when ``group`` can tell it) and what was being done."""
    try:
        yield
    except RayActorError as exc:
        rank = -1
        actor_id = getattr(exc, "actor_id", None)
        if group is not None and actor_id is not None:
            for i, w in enumerate(group.workers):
                if w._actor_id.hex() == actor_id:
                    rank = i
                    break
        who = f"worker rank {rank}" if rank >= 0 else "a worker"
        raise WorkerDiedError(f"{who} died while {doing}: {short_error(exc)}", rank) from exc
