"""The errors a run raises in the driver.

``TrainingFailedError`` ends a run that could not finish (a worker died more often than
``max_retries`` allows, at any phase: starting the group, its ``initialization_hook``,
starting a run, or mid-run); its ``__cause__`` is the last :class:`WorkerDiedError`.
A user exception on a worker is re-raised with its own type, and its ``__cause__`` is a
:class:`WorkerError` carrying the rank and the remote traceback.
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "PeerFailureError",
    "PicklableError",
    "ResourcesUnavailableError",
    "CheckpointError",
    "CheckpointIntegrityError",
    "TrainingFailedError",
    "UntrustedCheckpointError",
    "WorkerDiedError",
    "WorkerError",
]


class PicklableError:
    """Mixin: the exception pickles whole, whatever its ``__init__`` takes: its type, message
    (``args``), attributes and ``__cause__``.

    Plain pickling calls ``cls(*args)`` again, which fails for an ``__init__`` with more
    parameters than it passes to ``Exception`` (``TypeError: __init__() missing 2 required
    positional arguments``) and drops ``__cause__``. Ray, Ray Tune and every library that runs
    a trainer in an actor move errors by pickling them; every exception class of sgd's packages
    mixes this in (put it first: ``class MyError(PicklableError, RuntimeError)``). A cause that
    does not pickle itself travels as a ``RuntimeError`` naming its type and message.
    """

    def __reduce__(self) -> Tuple[Any, ...]:
        state: Dict[str, Any] = dict(getattr(self, "__dict__", {}))
        exc: BaseException = self  # type: ignore[assignment]
        if exc.__cause__ is not None:
            state["__cause__"] = _portable(exc.__cause__)
        if exc.__suppress_context__:
            state["__suppress_context__"] = True
        return (_rebuild, (type(self), exc.args), state)

    def __setstate__(self, state: Optional[Dict[str, Any]], /) -> None:
        state = dict(state or {})
        exc: BaseException = self  # type: ignore[assignment]
        exc.__cause__ = state.pop("__cause__", None)
        exc.__suppress_context__ = state.pop("__suppress_context__", False)
        self.__dict__.update(state)


def _rebuild(cls: type, args: Tuple[Any, ...]) -> BaseException:
    """An instance of ``cls`` with ``args``, made without calling an ``__init__`` of its own
    (which may want other arguments than those it passed to ``Exception``)."""
    if not any("__init__" in vars(k) for k in cls.__mro__ if k.__module__ != "builtins"):
        return cls(*args)  # no __init__ of its own: args are what it takes
    exc = cls.__new__(cls, *args)
    BaseException.__init__(exc, *args)
    return exc


def _portable(cause: BaseException) -> BaseException:
    try:
        pickle.dumps(cause)
        return cause
    except Exception:
        return RuntimeError(f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}")


class TrainingFailedError(PicklableError, RuntimeError):
    """Training could not finish: a worker died, or failures outlasted ``max_retries``."""


class WorkerDiedError(TrainingFailedError):
    """A worker process died (killed, crashed, node lost).

    :param world_rank: the rank of the worker that died (``-1`` when the group had no ranks yet).
    """

    def __init__(self, message: str, world_rank: int):
        super().__init__(message)
        self.world_rank = world_rank


class TrainingHangError(WorkerDiedError):
    """No worker sent anything for ``hang_timeout_s`` (``SGD_HANG_TIMEOUT_S``): the run is hung.

    Retried like a worker death (``max_retries``): the restart stops the workers, killing those
    stuck outside sgd (in a collective, say).

    :param stragglers: the ranks that are not where the others are (behind in reports, or in
        another place of the training function), most likely the cause.
    :param stacks: every worker's Python stacks when the hang was declared, in rank order.
    """

    def __init__(self, message: str, stragglers: List[int], stacks: List[str]):
        super().__init__(message, stragglers[0] if stragglers else -1)
        self.stragglers = list(stragglers)
        self.stacks = list(stacks)


class WorkerError(PicklableError, RuntimeError):
    """The remote side of a user exception: rank, process and traceback.

    Attached as ``__cause__`` of the re-raised original exception, or raised
    itself when the original could not be sent to the driver.
    """

    def __init__(self, message: str, world_rank: int, remote_traceback: str):
        super().__init__(message)
        self.world_rank = world_rank
        self.remote_traceback = remote_traceback


class CheckpointError(PicklableError, ValueError):
    """A checkpoint could not be loaded; the message names the checkpoint and what to do."""


class CheckpointIntegrityError(CheckpointError):
    """A checkpoint is damaged or altered: a file does not match the sha256 or size recorded
    when it was written, its metadata points outside its directory or names an unknown codec,
    or its state does not decode."""


class UntrustedCheckpointError(CheckpointError):
    """Loading the checkpoint needs pickle (it holds arbitrary Python objects) and the caller
    did not opt in with ``trusted=True`` or ``SGD_TRUST_CHECKPOINTS=1``."""


class PeerFailureError(PicklableError, ConnectionError):
    """Raise (a subclass of) this on a worker when your collective call failed because a peer
    died or stopped, not because of anything this worker did.

    sgd then treats the error as the echo of another worker's failure: the driver waits up to
    ``SGD_PEER_FAILURE_GRACE_S`` seconds (default 10) for that failure to show itself; a
    worker's death restarts the group (and training resumes from the latest checkpoint)
    instead of failing the run, and another worker's own exception is raised instead of this
    one. Only when neither arrives is this error raised as the run's error.

    Framework packages whose collectives raise errors sgd cannot recognise by their message
    (gloo's, NCCL's and torch's it can) wrap them in a subclass of this, chaining the original
    (``raise MyPeerError(...) from exc``)::

        class XGBoostPeerError(PeerFailureError): ...

    The marker is read on the worker (an ``isinstance`` check) and travels to the driver as a
    flag, so the driver needs neither the class nor to unpickle the exception to honour it.
    """


class ResourcesUnavailableError(PicklableError, RuntimeError, TimeoutError):
    """The cluster could not place the workers in time.

    Also a :class:`TimeoutError`, which is what Horovod's ``RayExecutor`` and Ray Train 1.x
    code catch for the same case.
    """
