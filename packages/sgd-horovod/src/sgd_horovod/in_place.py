"""Horovod's elastic API (``hvd.elastic.run``, ``TorchState``, ``state.commit()``) on sgd's
in-place recovery: a run of ``sgd.Trainer(backend="horovod", num_workers=(min, max))`` whose
training function uses ``hvd.elastic.run`` keeps its survivors' processes when a worker is lost,
and takes in new workers while it trains, under sgd's run controller.

What maps to what, on each worker (the backend installs it, :func:`install`):

- ``hvd.elastic.run`` is :func:`run`: inside an sgd run it tells the driver the run recovers in
  place (or, on a worker started into a re-formed group, joins it), and runs Horovod's loop —
  ``state.sync()``, the function, and on ``HorovodInternalError`` (a peer died) or
  ``HostsUpdatedInterrupt`` (the group re-forms to take in new workers) back to the last commit,
  ``hvd.shutdown()``, sgd's reset barrier, ``hvd.init()`` in the re-formed group,
  ``state.on_reset()``, and round again. Outside an sgd run (plain Horovod) it is Horovod's own.
- ``state.commit()``: when the driver asked the group to re-form (new workers wait), every rank
  raises ``HostsUpdatedInterrupt`` at the same commit (Horovod's own notification, synced from
  rank 0), *before* keeping anything, so the step is redone in the new group and its report is
  sent once; otherwise Horovod's save, counted as sgd's commit (the keys that make sure no report
  is sent twice).
- The driver's interrupt after a death shuts the connections of Horovod's Gloo context (recorded
  at ``hvd.init()``): a survivor blocked in a collective with the lost worker, or with a survivor
  already at the barrier, fails at once with ``HorovodInternalError`` instead of at the timeout.
- Every survivor and every new worker then meets in ``hvd.init()`` through the rendezvous server
  the driver started for the new group, with the ranks and size of the new plan.

Nothing here imports Horovod at module level.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any, Callable, Optional, TypeVar

from sgd import world_rank
from sgd.backend import on_worker_interrupt, on_worker_reset
from sgd.elastic import State, reset_link
from sgd_torch.sockets import OpenedSockets

logger = logging.getLogger("sgd.horovod")

F = TypeVar("F", bound=Callable[..., Any])

#: The connections of Horovod's Gloo context on this worker (recorded at each ``hvd.init()``).
_CONTEXT_SOCKETS = OpenedSockets()
#: Horovod's own ``hvd.elastic.run``, for runs that are not sgd's.
_HOROVOD_RUN: Optional[Callable[[Any], Any]] = None
#: Whether ``state.commit()`` keeps the state before it checks for a host update (Horovod's order).
_KEEP_FIRST = False


def keep_before_host_check(enabled: bool = True) -> None:
    """On this worker, make ``state.commit()`` keep the state *before* it checks for a host
    update, as Horovod's own does (``ElasticJob`` sets it: its workers send ``ray_logger``
    dicts, not ``sgd.report`` calls keyed by commits). A peer lost during the check then leaves
    every survivor at this commit, not the one before.

    :param enabled: ``False`` gives back sgd's order (check first, so that the step at which
        new workers arrive is redone in the new group and its report is sent once).
    """
    global _KEEP_FIRST
    _KEEP_FIRST = bool(enabled)


def install() -> None:
    """On a worker (the backend runs it at setup): ``hvd.elastic.run`` becomes :func:`run`,
    ``hvd.init()`` records its connections, and sgd's interrupt and reset hooks are registered.
    Safe to call again."""
    global _HOROVOD_RUN
    import horovod.torch
    import horovod.torch.elastic
    import horovod.torch.mpi_ops

    if horovod.torch.elastic.run is not run:
        _HOROVOD_RUN = horovod.torch.elastic.run
        horovod.torch.elastic.run = run
    for module in (horovod.torch, horovod.torch.mpi_ops, horovod.torch.elastic):
        if not getattr(module.init, "_sgd_tracked", False):
            module.init = _recording(module.init)  # type: ignore[attr-defined]
    on_worker_interrupt(_interrupt)
    on_worker_reset(_reinit)


def _recording(init: Callable[..., Any]) -> Callable[..., Any]:
    """``hvd.init`` that records the connections of the Gloo context it makes. A call while
    Horovod is initialised (the next run's ``hvd.init()`` on the same workers) makes none and
    keeps the record of the context there."""
    import horovod.torch as hvd

    recorded = _CONTEXT_SOCKETS.recording(init)

    @functools.wraps(init)
    def init_recorded(*args: Any, **kwargs: Any) -> Any:
        return init(*args, **kwargs) if hvd.is_initialized() else recorded(*args, **kwargs)

    init_recorded._sgd_tracked = True  # type: ignore[attr-defined]
    return init_recorded


def _interrupt() -> None:
    """A peer was lost: make a collective blocked in Horovod's Gloo context fail now."""
    if "horovod.torch" in sys.modules:
        _CONTEXT_SOCKETS.shut_down()


def _reinit() -> None:
    """A run in ``sgd.elastic.run`` goes on in a re-formed group: Horovod meets again in it
    (when the run had initialised it)."""
    import horovod.torch as hvd

    if hvd.is_initialized():
        hvd.shutdown()
        hvd.init()


def run(func: F) -> F:
    """``hvd.elastic.run`` on sgd's workers (see the module docstring): decorate the training
    loop, whose first argument is a Horovod ``State`` (``hvd.elastic.TorchState``...)."""
    if _HOROVOD_RUN is not None:
        horovods = _HOROVOD_RUN(func)
    else:  # not installed here (no backend set this process up): it is still Horovod's own
        import horovod.torch.elastic

        horovods = horovod.torch.elastic.run(func)

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        link = reset_link()
        if link is None or not link.capable:  # not an sgd run that re-forms in place
            return horovods(state, *args, **kwargs)
        return _run_in_place(link, func, state, args, kwargs)

    return wrapper  # type: ignore[return-value]


def _run_in_place(link: Any, func: Callable[..., Any], state: Any, args: Any, kwargs: Any) -> Any:
    import horovod.torch as hvd
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    link.state = State()  # new workers take the state from Horovod's sync, not from a peer's snapshot
    if link.joined is not None:
        link.join()  # a new worker of a re-formed group: the survivors' counters; the state comes with sync()
    else:
        link.announce()
    state.commit = _commit_for(link, state)
    try:
        while True:
            try:
                state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as exc:
                reason, failed = f"HorovodInternalError: {str(exc).splitlines()[0][:200] if str(exc) else ''}", True
                del exc  # its traceback holds the failed step's frames
            except HostsUpdatedInterrupt:
                reason, failed = "the group re-forms", link.hard
            state.restore()  # the last commit (Horovod keeps uncommitted changes on a host update: redone here)
            if failed:
                _interrupt()  # peers blocked on this worker fail now, not at a timeout
            rank = world_rank()
            began = time.monotonic()
            hvd.shutdown()
            logger.info("rank %d: %s; waiting for the group to re-form", rank, reason)
            link.barrier(reason, failed)
            hvd.init()
            logger.info("horovod rank %d of %d: re-formed in %.3fs", hvd.rank(), hvd.size(), time.monotonic() - began)
            state.on_reset()
    finally:
        del state.commit


def _commit_for(link: Any, state: Any) -> Callable[[], None]:
    """``state.commit`` for a run on sgd's link: Horovod's commit with the host update checked
    first (a request of the driver raises on every rank at the same commit, before keeping
    anything), and each commit counted by sgd."""
    from horovod.runner.elastic.worker import HostUpdateResult

    def commit() -> None:
        keep_first = _KEEP_FIRST
        if keep_first:
            state.save()
            link.committed()
        if link.requested:
            state.on_hosts_updated(time.time(), HostUpdateResult.mixed)
        state.check_host_updates()  # a broadcast of rank 0's view: every rank raises, or none
        if not keep_first:
            state.save()
            link.committed()

    return commit


__all__ = ["install", "keep_before_host_check", "run"]
