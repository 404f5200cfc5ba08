"""In-place recovery: when a worker or a host is lost, the survivors keep their processes and
their state in memory, the group re-forms around them, and training goes on from the last
in-memory commit (Horovod's elastic API, for any sgd backend that can re-form its group).

::

    from sgd import elastic

    def train_func(config):
        state = elastic.ObjectState(step=0, total=0.0)

        @elastic.run
        def train(state):
            while state.step < config["steps"]:
                state.total += work(state.step)       # collectives of your framework here
                state.step += 1
                state.commit()                         # in memory, cheap: no disk
                sgd.report({"step": state.step})
            return state.total

        return train(state)

    sgd.Trainer(backend="torch", num_workers=(2, 4)).run(train_func)

PyTorch users take :class:`sgd_torch.elastic.TorchState` (model and optimizer). What happens
on a loss: a survivor's collective fails (or the driver interrupts it at its next ``commit()``
or report), :func:`run` catches that, the worker waits at a barrier; the driver re-forms the
group from the survivors (and new workers where the group needs them), the backend builds its
process group again at the new size, every worker restores the last commit (workers behind it,
and new ones, load it from a survivor), and :func:`run` calls the function again. Steps after
the last commit are redone; a report already delivered is not sent again, and none is lost.
Without :func:`run`, a loss restarts every worker from the latest checkpoint, as before.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any, Callable, Dict, List, Optional, TypeVar

from sgd._common.peers import reads_like_peer_failure
from sgd._common.run_hooks import RESET_HOOKS, run_interrupt_hooks
from sgd._worker.resets import ResetInterrupt, ResetLink, Resume
from sgd._worker.session import STATE
from sgd.errors import PeerFailureError

logger = logging.getLogger("sgd")

F = TypeVar("F", bound=Callable[..., Any])


class State:
    """State that survives a re-forming of the group in memory.

    A subclass says what its state is: :meth:`save` (a copy, in memory) and :meth:`load`.
    Call :meth:`commit` at points the run may go back to (after an optimizer step); after a
    reset every worker is at the same commit.
    """

    def __init__(self) -> None:
        self._reset_callbacks: List[Callable[[], None]] = []
        self._saved: Any = None

    # --- what a subclass defines -------------------------------------------------------------

    def save(self) -> Any:
        """A snapshot of the state: a copy that later changes to the state do not alter.
        It must pickle (new workers and workers behind receive it from a survivor)."""
        raise NotImplementedError

    def load(self, snapshot: Any) -> None:
        """Make the state what ``snapshot`` (from :meth:`save`, here or on another worker) holds."""
        raise NotImplementedError

    def _before_reset(self) -> None:
        """Let go of what ties the state to the old group (sgd-torch: the DDP wrapper)."""

    def _after_reset(self) -> None:
        """Tie the state to the new group (sgd-torch: wrap the model in DDP again)."""

    def _peer_snapshot(self) -> Any:
        """The last commit, as it travels to another worker."""
        return self._saved

    # --- the API ---------------------------------------------------------------------------------------

    def commit(self) -> None:
        """Keep the state as it is now, in memory: after a reset the run goes on from here.

        When the group is about to re-form (the driver asked), this raises to :func:`run`
        *before* keeping anything: the step since the last commit is redone in the new group.
        """
        link = _link()
        if link is not None:
            link.check()
        self._saved = self.save()
        if link is not None:
            link.committed()

    def restore(self) -> None:
        """Go back to the last commit."""
        if self._saved is None:
            raise RuntimeError("nothing to restore: commit() was never called and the state was never synced")
        self.load(self._saved)

    def sync(self) -> None:
        """Make every worker's state the one of rank 0 (called by every worker, at the same
        point: a barrier through the driver). :func:`run` syncs new workers itself."""
        link = _link()
        self._saved = self.save()
        if link is None or not link.entered:
            return  # a single process: nothing to sync with
        plan, snapshot = link.barrier("sync", failed=False)
        self._apply(plan, snapshot)

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Call each of ``callbacks`` (no arguments) after every reset, once the state was
        restored (to adjust a learning rate to the new world size, rebuild a data loader...)."""
        for cb in callbacks:
            if not callable(cb):
                raise TypeError(f"register_reset_callbacks takes callables; got {cb!r}")
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks (called by :func:`run` after each reset)."""
        for cb in self._reset_callbacks:
            cb()

    def _apply(self, plan: Resume, snapshot: Any) -> None:
        if plan.load:
            self.load(snapshot)
            self._saved = self.save()
        else:
            self.restore()


class ObjectState(State):
    """Any picklable values, as attributes: ``state = ObjectState(epoch=0, best=None)``, then
    ``state.epoch += 1``. A commit keeps a deep copy."""

    def __init__(self, **values: Any) -> None:
        super().__init__()
        self._names = list(values)
        for name, value in values.items():
            if name.startswith("_") or name in _RESERVED:
                raise ValueError(f"ObjectState: {name!r} cannot be a value's name (it starts with '_' or is a method)")
            setattr(self, name, value)

    def save(self) -> Dict[str, Any]:
        values = {name: getattr(self, name) for name in self._names}
        try:
            return copy.deepcopy(values)
        except Exception as exc:
            bad = _first_uncopyable(values)
            raise TypeError(f"ObjectState cannot keep {bad!r}: {exc}. Keep values that copy and pickle "
                            "(numbers, strings, lists, dicts, arrays)") from exc

    def load(self, snapshot: Dict[str, Any]) -> None:
        for name, value in copy.deepcopy(snapshot).items():
            setattr(self, name, value)

    def value_names(self) -> List[str]:
        """The names of the values, in the order given."""
        return list(self._names)


_RESERVED = {n for n in dir(ObjectState) if not n.startswith("_")}


def _first_uncopyable(values: Dict[str, Any]) -> str:
    for name, value in values.items():
        try:
            copy.deepcopy(value)
        except Exception:
            return name
    return "?"


def _link() -> Optional[ResetLink]:
    session = STATE.session
    return session.resets if session is not None else None


def reset_link() -> Optional[ResetLink]:
    """On a worker, inside a training function: the run's side of in-place recovery (the reset
    barrier, the commit count that keys its reports, the driver's interrupt); ``None`` outside
    a training function. For a framework whose own elastic loop stands in for :func:`run`
    (sgd-horovod runs ``hvd.elastic.run`` on it). Such a loop:

    - checks ``link.capable`` (the backend re-forms in place), then calls ``link.announce()``,
      or ``link.join()`` when ``link.joined`` is set (a new worker of a re-formed group), and
      sets ``link.state`` to a :class:`State` whose last commit a new worker may load (a plain
      ``State()`` when the framework syncs new workers itself);
    - calls ``link.committed()`` after each commit, and reads ``link.requested`` at its own
      sync points (the driver wants the group to re-form: new workers wait to join);
    - on a failure or a request, goes back to its last commit and waits in
      ``link.barrier(reason, failed)``, which returns once the group re-formed (the backend set
      up again, this worker's new place in ``sgd.world_rank()``...).

    It leaves ``link.entered`` false: sgd's own ``commit()`` and ``sgd.report`` then never raise
    :class:`ResetInterrupt` into the framework's loop.
    """
    return _link()


def run(func: F) -> F:
    """Decorate the training loop (a function whose first argument is the :class:`State`):
    when the group re-forms, the loop is called again in the new group, from the last commit.

    :raises RuntimeError: called outside a training function, or the run's backend cannot
        re-form its group in place (the message names it and what to do).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"a function decorated with sgd.elastic.run takes an sgd.elastic State first; "
                            f"got {type(state).__name__}")
        session = STATE.session
        if session is None:
            raise RuntimeError("sgd.elastic.run: called outside a training function; call it inside the function "
                               "passed to Trainer.run")
        link = session.resets
        if STATE.context is not None and STATE.context.local_gpus is not None:
            return func(state, *args, **kwargs)  # local mode: one process, no peers to lose
        if not link.capable:
            raise RuntimeError(
                "sgd.elastic.run: this run's backend cannot re-form its group in place (its "
                "Backend.reforms_in_place is false). Use a backend that can (backend='torch'), or drop "
                "elastic.run: a lost worker then restarts every worker from the latest checkpoint")
        link.entered, link.state = True, state
        state._saved = state.save()
        if link.joined is not None:
            plan, snapshot = link.join()  # a new worker of a re-formed group: the survivors' state
            state._apply(plan, snapshot)
        else:
            link.announce()
        while True:
            try:
                return func(state, *args, **kwargs)
            except ResetInterrupt:
                reason, failed = "the group re-forms", link.hard
            except Exception as exc:
                if not (link.hard or isinstance(exc, PeerFailureError)
                        or reads_like_peer_failure(type(exc).__name__, str(exc))):
                    raise
                reason, failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}", True
                del exc  # its traceback holds the failed step's frames, and they the process group
            state._before_reset()
            if failed:
                run_interrupt_hooks()  # peers blocked in a collective with this worker fail now, not at a timeout
            logger.info("rank %d: %s; waiting for the group to re-form", session.context.world_rank, reason)
            plan, snapshot = link.barrier(reason, failed)
            for hook in list(RESET_HOOKS):
                hook()
            state._after_reset()
            state._apply(plan, snapshot)
            logger.info("rank %d of %d: re-formed (%s); going on from commit %d", session.context.world_rank,
                        session.context.world_size, plan.reason, plan.commits)
            state.on_reset()

    return wrapper  # type: ignore[return-value]



__all__ = ["ObjectState", "ResetInterrupt", "State", "reset_link", "run"]
