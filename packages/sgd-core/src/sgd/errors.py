"""The errors a run raises in the driver.

``TrainingFailedError`` ends a run that could not finish (a worker died more often than
``max_retries`` allows, at any phase: starting the group, its ``initialization_hook``,
starting a run, or mid-run); its ``__cause__`` is the last :class:`WorkerDiedError`.
A user exception on a worker is re-raised with its own type, and its ``__cause__`` is a
:class:`WorkerError` carrying the rank and the remote traceback.

The AIR/v2 trainers' ``fit()`` raises, as Ray 2.60's does, a :class:`WorkerGroupError` (a
worker's exception or death, past ``FailureConfig(max_failures)``) or a
:class:`ControllerError` (the driver's own: a callback, a placement that timed out); both are
``TrainingFailedError`` and carry the run's ``Result`` as ``.result``.
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional, Tuple, Type

__all__ = [
    "PeerFailureError",
    "PicklableError",
    "ResourcesUnavailableError",
    "CheckpointError",
    "CheckpointIntegrityError",
    "ControllerError",
    "NCCLHangError",
    "PreemptionError",
    "TrainingFailedError",
    "UntrustedCheckpointError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroupError",
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
    """Training could not finish: a worker died, or failures outlasted ``max_retries``.

    What an AIR/v2 trainer's ``fit()`` raises is one of its subclasses :class:`WorkerGroupError`
    and :class:`ControllerError` (Ray 2.60's ``ray.train.TrainingFailedError``).

    :ivar result: raised by ``fit()``: the run's :class:`sgd.Result` so far (``path``,
        ``checkpoint``, ``best_checkpoints``, ``metrics``, ``metrics_dataframe``; its ``error``
        is this exception), so that nothing of a failed run is lost; else ``None``.
    """

    result: Any = None


class WorkerGroupError(TrainingFailedError):
    """The training function failed on a worker (it raised, or its process died) and the
    retries of ``FailureConfig(max_failures)`` ran out: what ``fit()`` raises then, as Ray 2.60's
    ``ray.train.WorkerGroupError``.

    The exception ``fit()`` raises for a worker's own exception is also an instance of that
    exception's class (as Ray AIR 2.x's was), so ``except ValueError:`` written for AIR and
    ``except sgd.WorkerGroupError:`` written for Ray 2.60 both catch it; attributes it lacks are
    read from the worker's exception. Its ``__cause__`` is the worker's exception.

    :param error_message: what failed, in words.
    :param worker_failures: the exception of each worker that failed, by world rank: the
        worker's own exception in its original type (its ``__cause__`` the
        :class:`WorkerError` with the remote traceback), or the :class:`WorkerDiedError` of a
        death. sgd stops the run at the first failure, so it holds one rank.
    :param result: see :attr:`TrainingFailedError.result`.
    """

    def __init__(self, error_message: str, worker_failures: Dict[int, BaseException], result: Any = None):
        BaseException.__init__(self, "Training failed due to worker errors:\n" + error_message)
        self._error_message = error_message
        self.worker_failures = dict(worker_failures)
        self.result = result

    def __reduce__(self) -> Tuple[Any, ...]:
        _, (cls, args), state = super().__reduce__()
        # A plain exception's pickle drops its __cause__ (the WorkerError with the remote traceback).
        state["worker_failures"] = {r: _sendable(e) for r, e in self.worker_failures.items()}
        state["_failure_causes"] = {r: _portable(e.__cause__) for r, e in self.worker_failures.items()
                                    if e.__cause__ is not None}
        return _reduce_failed(self, args, state)

    def __setstate__(self, state: Optional[Dict[str, Any]], /) -> None:
        state = dict(state or {})
        causes = state.pop("_failure_causes", {})
        super().__setstate__(state)
        for rank, cause in causes.items():
            failure = self.worker_failures.get(rank)
            if failure is not None and failure.__cause__ is None:
                failure.__cause__ = cause


class ControllerError(TrainingFailedError):
    """Training failed on the driver, not on a worker: a callback raised, the workers could
    not be placed in time, a preprocessor failed. What ``fit()`` raises then, as Ray 2.60's
    ``ray.train.ControllerError``; also an instance of ``controller_failure``'s class (see
    :class:`WorkerGroupError`). Never retried.

    :param controller_failure: the driver's exception (also this one's ``__cause__``).
    :param result: see :attr:`TrainingFailedError.result`.
    """

    def __init__(self, controller_failure: BaseException, result: Any = None):
        BaseException.__init__(self, "Training failed due to controller error:\n" + str(controller_failure))
        self.controller_failure = controller_failure
        self.result = result

    def __reduce__(self) -> Tuple[Any, ...]:
        _, (cls, args), state = super().__reduce__()
        state["controller_failure"] = _sendable(self.controller_failure)
        return _reduce_failed(self, args, state)


class NCCLHangError(WorkerGroupError):
    """Ray 2.60's error for a job its NCCL RAS watcher found hung; here for code that catches it.

    sgd has no NCCL watcher and never raises it: a hung job is a :class:`TrainingHangError`
    (``hang_timeout_s``), inside a :class:`WorkerGroupError` once the retries run out.
    """


class PreemptionError(TrainingFailedError):
    """Ray 2.60's error for training interrupted by a node's preemption; here for code that
    catches it.

    sgd never raises it: a draining host is not a failure there. The controller moves the
    workers off it at the next checkpoint (or when the drain's deadline is near) and goes on; a
    host that goes before that is a worker death, retried by ``FailureConfig(max_failures)``
    (a :class:`WorkerGroupError` holding a :class:`WorkerDiedError` once retries run out).

    :param preemption_info: the :class:`sgd.PreemptionInfo` of the preemption.
    :param drain_timed_out: whether the deadline passed while workers were still running.
    """

    def __init__(self, preemption_info: Any, drain_timed_out: bool = False):
        super().__init__(f"Training was interrupted by node preemption (preempted_ranks="
                         f"{getattr(preemption_info, 'preempted_ranks', None)}, drain_timed_out={drain_timed_out}).")
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out


#: (sgd's class, the failure's class) → the class that is both (see :func:`also_instance_of`)
_BOTH: Dict[Tuple[type, type], type] = {}


def also_instance_of(base: Type[TrainingFailedError], failure: BaseException) -> Type[TrainingFailedError]:
    """A subclass of ``base`` (:class:`WorkerGroupError` or :class:`ControllerError`) that is
    also one of ``failure``'s class, as Ray AIR 2.x's ``RayTaskError`` was of the user's
    exception; ``base`` itself when ``failure`` is sgd's own failure or its class cannot be
    combined (a layout conflict, a final class). Its ``str`` is ``base``'s message; attributes
    it lacks are read from ``failure``."""
    kind = type(failure)
    if isinstance(failure, TrainingFailedError) or not isinstance(failure, Exception) or issubclass(base, kind):
        return base
    return _both(base, kind)


def _both(base: type, kind: type) -> type:
    key = (base, kind)
    if key not in _BOTH:
        try:
            _BOTH[key] = type(f"{base.__name__}({kind.__name__})", (base, kind), {
                "__module__": base.__module__, "__qualname__": f"{base.__qualname__}({kind.__qualname__})",
                "__str__": BaseException.__str__, "__repr__": BaseException.__repr__,
                "__getattr__": _read_from_original})
        except Exception:
            _BOTH[key] = base
    return _BOTH[key]


def _read_from_original(self: BaseException, name: str) -> Any:
    """An attribute the exception lacks, read from the failure it stands for."""
    if name.startswith("__"):
        raise AttributeError(name)
    state = self.__dict__
    original = state.get("controller_failure")
    if original is None:
        original = next(iter((state.get("worker_failures") or {}).values()), None)
    if original is None:
        raise AttributeError(name)
    return getattr(original, name)


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles (by cloudpickle, which Ray uses, when plain pickle cannot), else
    the :class:`WorkerError` it came with, else a ``RuntimeError`` naming it."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:
        pass
    try:
        import ray.cloudpickle as cloudpickle

        cloudpickle.dumps(exc)
        return exc
    except Exception:
        cause = exc.__cause__
        return cause if isinstance(cause, WorkerError) else _portable(exc)


def _reduce_failed(exc: TrainingFailedError, args: Tuple[Any, ...], state: Dict[str, Any]) -> Tuple[Any, ...]:
    """How :class:`WorkerGroupError` / :class:`ControllerError` pickle: by their plain class
    and, for one made by :func:`also_instance_of`, the failure's class it is also one of."""
    made = type(exc) in _BOTH.values()  # (plain, the failure's class), made by _both
    plain = type(exc).__bases__[0] if made else type(exc)
    extra = type(exc).__bases__[1] if made else None
    if extra is not None:
        try:
            pickle.dumps(extra)
        except Exception:
            extra = None  # a class only cloudpickle can carry: rebuilt as the plain class
    return (_rebuild_failed, (plain, extra, args), state)


def _rebuild_failed(plain: type, extra: Optional[type], args: Tuple[Any, ...]) -> BaseException:
    cls = plain if extra is None else _both(plain, extra)
    # Made by the builtin base that lays the instance out (OSError's for an OSError), as cls(...) would be.
    maker: Any = cls
    while maker.__module__ != "builtins":
        maker = maker.__base__
    exc = maker.__new__(cls, *args)
    BaseException.__init__(exc, *args)
    return exc


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
