"""Where the ranks of a run meet for ``sgd.collective``: the state of the group's collectives
(a leaf module: no Ray; the group's collective actor, :mod:`sgd.group.collective_actor`, holds one
:class:`Rendezvous` and wakes the callers it releases).

Every rank numbers its collective calls (1, 2, ...) within a run; call number ``n`` of every rank
is one :class:`Collective`. It is released once every rank of the world arrived with the same
call (``barrier`` or ``broadcast_from_rank_zero``), carrying rank 0's payload. It fails, for every
rank in it and every rank that comes to it later, when:

- two ranks made different calls at that number (:class:`CollectiveMismatchError`);
- a rank's training function returned after fewer calls (:meth:`Rendezvous.leave`; also a
  :class:`CollectiveMismatchError`);
- a rank waited longer than the timeout (:meth:`Rendezvous.abort`, asked by that rank:
  :class:`CollectiveTimeoutError`, naming the ranks that never arrived).

A run is identified by a token the driver raises at each start of a training function on the
group (each attempt after a failure too): the first call of a newer run ends what an older one
left open, and a call of an older run fails at once. Within a run, a generation tells the worlds
of a run that re-forms in place (:mod:`sgd.elastic`) apart.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from sgd._common.public import public_module
from sgd.errors import PicklableError

BARRIER = "sgd.collective.barrier"
BROADCAST = "sgd.collective.broadcast_from_rank_zero"

#: What a released collective gives its callers: ``("ok", payload)`` or ``("error", exception)``.
Outcome = Tuple[str, Any]


@public_module("sgd.collective")
class CollectiveTimeoutError(PicklableError, TimeoutError):
    """A collective call waited longer than ``SGD_COLLECTIVE_TIMEOUT_S`` (Ray's name,
    ``RAY_TRAIN_COLLECTIVE_TIMEOUT_S``, is read too) for some ranks to make it.

    :ivar missing_ranks: the ranks that never arrived.
    :ivar timeout_s: the timeout that passed.
    :ivar call: which call (``"sgd.collective.barrier"`` ...); :ivar number: its number in the run.
    """

    def __init__(self, message: str, missing_ranks: List[int], timeout_s: float, call: str, number: int):
        super().__init__(message)
        self.missing_ranks = list(missing_ranks)
        self.timeout_s = timeout_s
        self.call = call
        self.number = number


@public_module("sgd.collective")
class CollectiveMismatchError(PicklableError, RuntimeError):
    """The ranks did not make the same collective calls in the same order: at one call number,
    ranks called different functions, or a rank's training function returned after fewer calls
    than another rank waits in.

    :ivar number: the call number at which they parted.
    :ivar calls: what each rank that arrived called there, by rank.
    """

    def __init__(self, message: str, number: int, calls: Dict[int, str]):
        super().__init__(message)
        self.number = number
        self.calls = dict(calls)


class Collective:
    """Call number ``number`` of every rank of one world."""

    __slots__ = ("number", "world_size", "calls", "payload", "started", "outcome", "event")

    def __init__(self, number: int, world_size: int, started: float):
        self.number = number
        self.world_size = world_size
        #: rank -> the function it called at this number
        self.calls: Dict[int, str] = {}
        self.payload: Any = None
        self.started = started
        self.outcome: Optional[Outcome] = None
        #: what the holder of the rendezvous wakes the callers with (an ``asyncio.Event``)
        self.event: Any = None

    def missing(self) -> List[int]:
        return [rank for rank in range(self.world_size) if rank not in self.calls]

    def names(self) -> str:
        return " / ".join(sorted(set(self.calls.values())))


def _done(outcome: Outcome) -> Collective:
    """A collective already decided (a call of a run that ended, a call at a failed number)."""
    collective = Collective(0, 0, 0.0)
    collective.outcome = outcome
    return collective


def _ranks(ranks: List[int]) -> str:
    return ", ".join(map(str, ranks))


_SAME_CALLS = "every rank must make the same sgd.collective calls in the same order"


class Rendezvous:
    """The collectives of one worker group (see the module docstring). Each method returns the
    collectives it decided, whose callers are to be woken."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: the newest run seen (see the module docstring)
        self.token = -1
        self._open: Dict[Tuple[Any, int], Collective] = {}
        self._failed: Dict[Tuple[Any, int], BaseException] = {}
        # generation -> rank -> how many calls that rank made before its function returned
        self._left: Dict[Any, Dict[int, int]] = {}

    def _current(self, token: int) -> Tuple[bool, List[Collective]]:
        """Whether ``token`` is the current run (a newer one ends what the older left open)."""
        if token < self.token:
            return False, []
        ended: List[Collective] = []
        if token > self.token:
            ended = self.close("was left open by a run that ended")
            self.token = token
        return True, ended

    def close(self, why: str = "was left open when its worker group shut down") -> List[Collective]:
        """Fail every open collective (``why`` says what became of it) and forget the run's state."""
        ended = list(self._open.values())
        for collective in ended:
            collective.outcome = ("error", RuntimeError(f"{collective.names()} (call #{collective.number}) {why}"))
        self._open.clear()
        self._failed.clear()
        self._left.clear()
        return ended

    def _fail(self, key: Tuple[Any, int], collective: Collective, error: BaseException) -> Collective:
        collective.outcome = ("error", error)
        self._open.pop(key, None)
        self._failed[key] = error
        return collective

    def arrive(self, token: int, generation: Any, number: int, rank: int, world_size: int, call: str,
               payload: Any = None) -> Tuple[Collective, List[Collective]]:
        """Rank ``rank`` makes call ``number`` (``call``: which function; ``payload``: what it
        broadcasts, used from rank 0 only). Returns its collective (decided or not) and the
        collectives decided by this arrival, to wake."""
        current, decided = self._current(token)
        if not current:
            return _done(("error", RuntimeError(
                f"{call} was called by rank {rank} of a run that has ended (the group was restarted)"))), decided
        key = (generation, number)
        failed = self._failed.get(key)
        if failed is not None:
            return _done(("error", failed)), decided
        collective = self._open.get(key)
        if collective is None:
            collective = self._open[key] = Collective(number, world_size, self._clock())
        if world_size != collective.world_size or rank in collective.calls or not 0 <= rank < world_size:
            error = RuntimeError(f"{call} call #{number}: rank {rank} of world size {world_size} arrived where "
                                 f"world size {collective.world_size} and ranks {sorted(collective.calls)} are")
            return collective, decided + [self._fail(key, collective, error)]
        collective.calls[rank] = call
        if rank == 0:
            collective.payload = payload
        names = set(collective.calls.values())
        if len(names) > 1:
            by_call = {name: sorted(r for r, c in collective.calls.items() if c == name) for name in sorted(names)}
            said = "; ".join(f"ranks [{_ranks(ranks)}] called {name}" for name, ranks in by_call.items())
            error = CollectiveMismatchError(
                f"collective call #{number} differs across ranks: {said}. {_SAME_CALLS[0].upper()}{_SAME_CALLS[1:]}.",
                number, collective.calls)
            return collective, decided + [self._fail(key, collective, error)]
        gone = self._left_before(generation, number, world_size)
        if gone:
            return collective, decided + [self._fail(key, collective, self._returned_error(collective, gone))]
        if len(collective.calls) == world_size:
            collective.outcome = ("ok", collective.payload)
            del self._open[key]
            decided.append(collective)
        return collective, decided

    def _left_before(self, generation: Any, number: int, world_size: int) -> Dict[int, int]:
        """The ranks whose training function returned after fewer than ``number`` calls."""
        left = self._left.get(generation, {})
        return {rank: calls for rank, calls in left.items() if calls < number and rank < world_size}

    def _returned_error(self, collective: Collective, gone: Dict[int, int]) -> CollectiveMismatchError:
        rank, calls = min(gone.items())
        waiting = sorted(collective.calls)
        return CollectiveMismatchError(
            f"{collective.names()} (collective call #{collective.number}) cannot complete: the training function "
            f"of rank {rank} returned after {calls} collective call{'s' if calls != 1 else ''}, while ranks "
            f"[{_ranks(waiting)}] wait in call #{collective.number}; {_SAME_CALLS}.",
            collective.number, collective.calls)

    def leave(self, token: int, generation: Any, rank: int, calls: int) -> List[Collective]:
        """Rank ``rank``'s training function returned after ``calls`` collective calls: the
        collectives past that number it is not in can never complete."""
        current, decided = self._current(token)
        if not current:
            return decided
        self._left.setdefault(generation, {})[rank] = calls
        for key, collective in list(self._open.items()):
            if key[0] == generation and collective.number > calls and rank not in collective.calls:
                decided.append(self._fail(key, collective, self._returned_error(collective, {rank: calls})))
        return decided

    def abort(self, token: int, generation: Any, number: int, timeout_s: float) -> List[Collective]:
        """A rank waited ``timeout_s`` in call ``number``: it fails for every rank, naming the
        ranks that never arrived."""
        collective = self._open.get((generation, number))
        if token != self.token or collective is None:
            return []
        missing = collective.missing()
        elapsed = self._clock() - collective.started
        error = CollectiveTimeoutError(
            f"{collective.names()} (collective call #{number}) timed out after {elapsed:.1f} s: rank"
            f"{'s' if len(missing) != 1 else ''} [{_ranks(missing)}] never arrived (world size "
            f"{collective.world_size}). Make sure {_SAME_CALLS}; to wait longer, set SGD_COLLECTIVE_TIMEOUT_S "
            "(or Ray's RAY_TRAIN_COLLECTIVE_TIMEOUT_S) to more seconds, or to 'none' to wait forever.",
            missing, timeout_s, collective.names(), number)
        return [self._fail((generation, number), collective, error)]

    def status(self, token: int, generation: Any, number: int) -> Optional[Tuple[str, List[int], List[int], float]]:
        """``(call, arrived ranks, missing ranks, seconds since the first arrived)`` of an open
        collective, else ``None``."""
        collective = self._open.get((generation, number))
        if token != self.token or collective is None:
            return None
        return (collective.names(), sorted(collective.calls), collective.missing(),
                self._clock() - collective.started)

    @property
    def open_count(self) -> int:
        """How many collectives wait for ranks (for tests)."""
        return len(self._open)


__all__ = ["BARRIER", "BROADCAST", "Collective", "CollectiveMismatchError", "CollectiveTimeoutError", "Rendezvous"]
