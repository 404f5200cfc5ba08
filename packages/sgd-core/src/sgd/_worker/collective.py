"""A worker's side of ``sgd.collective``: numbering its calls, waiting in the group's collective
actor (:mod:`sgd.group.collective_actor`), the warnings and the timeout.

What the worker needs comes with its run information (``WorkerContext.collective``: the actor's
handle, sent once per process; ``WorkerContext.collective_run``: the run's token and settings).
A wait is made of short waits, so that a run the driver stops (a peer failed or died) leaves the
collective at once (:class:`~sgd._worker.session.RunStopped`), as does a run asked to re-form in
place (:mod:`sgd.elastic`). A run whose function returns tells the actor how many calls it made
(:func:`run_returned`), so that a rank left waiting for it fails at once, instead of hanging.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Optional, Tuple

from sgd._common.rendezvous import BROADCAST, CollectiveTimeoutError
from sgd._worker.session import RETURN_HOOKS, STATE, RunStopped, Session

logger = logging.getLogger("sgd")

#: The longest single wait on the actor: how soon a stopped run leaves a collective, seconds.
WAIT_SLICE_S = 0.1
#: How many times a timed-out call asks the actor to fail it (one per timeout period) before it
#: fails on its own (an actor that does not answer must not hold a rank past its timeout).
ABORTS = 3


class _Calls:
    """The collective calls of one run on one worker: how many, in which world."""

    __slots__ = ("count", "generation")

    def __init__(self) -> None:
        self.count = 0
        self.generation: Any = 0


_CALLS: weakref.WeakKeyDictionary[Session, _Calls] = weakref.WeakKeyDictionary()


def _generation(session: Session) -> Any:
    """The world this run is in: changes each time the group re-forms in place."""
    return getattr(session.resets, "plan_key", None) or 0


def _calls(session: Session) -> _Calls:
    calls = _CALLS.get(session)
    if calls is None:
        calls = _CALLS[session] = _Calls()
    generation = _generation(session)
    if generation != calls.generation:  # a re-formed world counts its calls afresh
        calls.count, calls.generation = 0, generation
    return calls


def current_session(call: str) -> Session:
    session = STATE.session
    if session is None:
        raise RuntimeError(
            f"{call}() was called outside a training function. Call it inside the function passed to "
            "a trainer (TorchTrainer(train_loop_per_worker), Trainer.run), on every worker.")
    return session


def collective(call: str, data: Any = None) -> Any:
    """Make the collective call ``call`` (``BARRIER`` or ``BROADCAST``) on this worker; what it
    returns (rank 0's ``data`` for a broadcast)."""
    session = current_session(call)
    context = session.context
    rank, world_size = context.world_rank, context.world_size
    if world_size <= 1:
        return data if call == BROADCAST else None  # one rank: nothing to wait for, nothing to send
    actor, run = context.collective, context.collective_run
    if actor is None or run is None:
        raise RuntimeError(f"{call}() needs a run started by sgd's worker group (this worker's group has no "
                           "collective actor)")
    group, token, timeout_s, warn_s = run
    calls = _calls(session)
    calls.count += 1
    number = calls.count
    payload = None
    if call == BROADCAST and rank == 0 and data is not None:
        payload = [_put(data)]  # a reference in a list: the actor hands it on without fetching it
    where = (group, token, calls.generation, number)
    outcome = _wait(session, actor.arrive.remote(*where, rank, world_size, call, payload), actor, where, timeout_s,
                    warn_s, call)
    kind, value = outcome
    if kind == "error":
        raise value
    if call != BROADCAST:
        return None
    if rank == 0:
        return data  # the object itself: nothing to fetch
    if value is None:
        return None
    import ray

    return ray.get(value[0])


def _put(data: Any) -> Any:
    import ray

    try:
        return ray.put(data)
    except Exception as exc:
        t = type(data)
        raise TypeError(
            f"{BROADCAST}: rank 0's data, a {t.__module__}.{t.__qualname__}, cannot be pickled to send to the "
            f"other ranks: {exc}. Broadcast something picklable (plain data, arrays, tensors), or make it "
            "picklable.") from exc


def _wait(session: Session, ref: Any, actor: Any, where: Tuple[str, int, Any, int], timeout_s: Optional[float],
          warn_s: float, call: str) -> Any:
    """The outcome of ``ref`` (an ``arrive`` call), waited for in slices: leave when the run is
    stopped or asked to re-form; warn every ``warn_s``; ask the actor to fail the call once
    ``timeout_s`` passed."""
    import ray
    from ray.exceptions import RayActorError

    begun = time.monotonic()
    next_warning = begun + warn_s
    aborts, next_abort = 0, begun + (timeout_s or 0.0)
    missing: Optional[list] = None  # as the actor last said
    try:
        while True:
            ready, _ = ray.wait([ref], timeout=WAIT_SLICE_S)
            if ready:
                return ray.get(ref)
            if session._stopping:  # the driver stopped the run (a peer failed): leave the collective
                raise RunStopped()
            session.resets.check()  # asked to re-form in place (sgd.elastic)
            now = time.monotonic()
            if now >= next_warning:
                next_warning = now + warn_s
                missing = _warn(session, actor, where, warn_s)
            if timeout_s is not None and now >= next_abort:
                if aborts >= ABORTS:  # the actor does not answer: the timeout holds all the same
                    raise CollectiveTimeoutError(
                        f"{call} (collective call #{where[3]}) timed out after {now - begun:.1f} s, and the "
                        f"collective actor did not answer (ranks missing when it last did: {missing}); set "
                        "SGD_COLLECTIVE_TIMEOUT_S to wait longer", missing or [], timeout_s, call, where[3])
                # The actor fails the call for every rank, naming the missing ones: the answer comes on ref.
                actor.abort.remote(*where, timeout_s)
                aborts, next_abort = aborts + 1, now + max(timeout_s, 1.0)
    except RayActorError as exc:
        raise RuntimeError(f"{call}: the group's collective actor died ({exc}); the run fails over as for a "
                           "worker failure") from exc


def _warn(session: Session, actor: Any, where: Tuple[str, int, Any, int], warn_s: float) -> Optional[list]:
    """Log which ranks the collective still waits for (from the lowest rank waiting only); them."""
    import ray

    try:
        status = ray.get(actor.status.remote(*where), timeout=warn_s)
    except Exception:
        return None
    if status is None:
        return None
    call, arrived, missing, elapsed = status
    if arrived and arrived[0] == session.context.world_rank:
        logger.warning(
            "%s (collective call #%d) has waited %.0f s for rank%s %s (world size %d); every rank must make the "
            "same sgd.collective calls in the same order. SGD_COLLECTIVE_WARN_INTERVAL_S sets how often this "
            "is said, SGD_COLLECTIVE_TIMEOUT_S a limit.", call, where[3], elapsed, "s" if len(missing) != 1 else "",
            missing, session.context.world_size)
    return list(missing)


def run_returned(session: Session) -> None:
    """The training function of ``session`` returned: tell the actor how many collective calls it
    made (not waited for), so a rank still waiting in a later one fails at once."""
    context = session.context
    actor, run = context.collective, context.collective_run
    if actor is None or run is None or context.world_size <= 1:
        return
    calls = _calls(session)
    try:
        actor.leave.remote(run[0], run[1], calls.generation, context.world_rank, calls.count)
    except Exception:  # the run's result matters more than this note
        logger.debug("could not tell the collective actor this run returned", exc_info=True)


RETURN_HOOKS.append(run_returned)

__all__ = ["collective", "current_session", "run_returned"]
