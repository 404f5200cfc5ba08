"""Collectives across the workers of a run, whatever the framework: ``sgd.collective``, Ray Train
2.60's ``ray.train.collective`` under sgd's name (``from ray.train.collective import barrier`` ->
``from sgd.collective import barrier``).

Call them inside a training function, on every worker, the same calls in the same order::

    import sgd
    import sgd.collective

    def train_func():
        if sgd.get_context().get_world_rank() == 0:
            vocab = build_vocabulary()           # once, on rank 0
        else:
            vocab = None
        vocab = sgd.collective.broadcast_from_rank_zero(vocab)   # every rank gets rank 0's
        sgd.collective.barrier()                 # every rank waits here for the others

They work on every backend (``"torch"``, ``"tensorflow"``, ``"horovod"``, ``"xgboost"``, the plain
``"base"``) and need no process group: the ranks meet in one small actor on the driver's node, as
in Ray (:mod:`sgd.group.collective_actor`). In local mode (``num_workers=0``) and with one worker they return at
once. Differences from Ray 2.60, all additions:

- no size limit on a broadcast (Ray warns above 1 kB): the object travels through Ray's object
  store, from rank 0 to each rank that reads it, never through the actor;
- calls that do not match across ranks fail at once with :class:`CollectiveMismatchError`
  (different calls at the same place; a rank whose training function returned while another
  waits in a call it never made), instead of waiting for the timeout;
- a run that fails or is stopped (a peer raised or died) leaves a collective at once: the ranks
  waiting in it do not hang, and the group restarts as ``max_failures`` allows.

Settings, read in the driver's environment when a run starts: ``SGD_COLLECTIVE_TIMEOUT_S`` (how
long a call may wait for every rank; default: no limit, as in Ray; ``none`` for no limit), and
``SGD_COLLECTIVE_WARN_INTERVAL_S`` (how often a waiting call logs the ranks it waits for; default
60). Ray's names, ``RAY_TRAIN_COLLECTIVE_TIMEOUT_S`` and ``RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S``,
are read when sgd's are not set. A call that times out raises :class:`CollectiveTimeoutError`
on every rank waiting in it, naming the ranks that never arrived.
"""

from __future__ import annotations

from typing import TypeVar

from sgd._common.rendezvous import BARRIER, BROADCAST, CollectiveMismatchError, CollectiveTimeoutError
from sgd._worker.collective import collective

T = TypeVar("T")

__all__ = ["barrier", "broadcast_from_rank_zero", "CollectiveMismatchError", "CollectiveTimeoutError"]


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data``, on every worker; what the other ranks pass is ignored.

    Also a barrier: every worker must call it before any goes on. Rank 0 gets its own object
    back; the other ranks get a copy, unpickled from Ray's object store (any size: a 50 MB
    array is fine). ``None`` from rank 0 broadcasts ``None``.

    Example::

        def train_func():
            if sgd.get_context().get_world_rank() == 0:
                data = {"some_key": "some_value"}
            else:
                data = None
            data = sgd.collective.broadcast_from_rank_zero(data)

    :param data: on rank 0, the object to send: anything picklable.
    :returns: rank 0's ``data``.
    :raises TypeError: on rank 0, when ``data`` does not pickle (the message names its type); the
        run fails with it, and the other ranks, waiting, leave the call.
    :raises CollectiveTimeoutError: some ranks did not make the call within
        ``SGD_COLLECTIVE_TIMEOUT_S`` (names them).
    :raises CollectiveMismatchError: the ranks' collective calls differ (see the module docstring).
    :raises RuntimeError: called outside a training function.
    """
    return collective(BROADCAST, data)  # type: ignore[no-any-return]


def barrier() -> None:
    """Wait until every worker of the run has called ``barrier()``.

    Example::

        def train_func():
            print(f"rank {sgd.get_context().get_world_rank()} waits at the barrier")
            sgd.collective.barrier()
            print("every rank has reached the barrier")

    :raises CollectiveTimeoutError: some ranks did not make the call within
        ``SGD_COLLECTIVE_TIMEOUT_S`` (names them).
    :raises CollectiveMismatchError: the ranks' collective calls differ (see the module docstring).
    :raises RuntimeError: called outside a training function.
    """
    collective(BARRIER)
