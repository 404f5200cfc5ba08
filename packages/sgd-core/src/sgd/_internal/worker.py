"""The Ray actor every sgd worker is: a plain class, or the user's ``actor_cls`` plus this mixin."""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from sgd._internal.protocol import DirectWrite
from sgd._internal.session import STATE, Session, WorkerContext

#: Concurrency group for driver calls that must run while user code occupies the
#: default group (polling a run, reading metadata). User methods stay sequential.
CONTROL_GROUP = "sgd_control"


@dataclass
class WorkerMetadata:
    """Where a worker actor runs."""

    node_id: str
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: List[str]


class WorkerMixin:
    """Methods sgd calls on each worker actor; mixed into the user's ``actor_cls`` if any."""

    def _sgd_execute(self, fn: Callable[..., Any], args: Tuple, kwargs: Dict[str, Any]) -> Any:
        return fn(*args, **kwargs)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_metadata(self) -> WorkerMetadata:
        init_error = getattr(self, "_sgd_init_error", None)
        if init_error is not None:
            raise init_error  # actor_cls(...) failed: the driver gets its type and traceback
        return WorkerMetadata(
            node_id=ray.get_runtime_context().get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu_ids=[str(g) for g in ray.get_gpu_ids()],
        )

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_preload(self, modules: Tuple[str, ...]) -> None:
        """Import ``modules`` (in a control-group thread, so other calls go on meanwhile;
        code that needs them waits on Python's import lock until they are in)."""
        import importlib

        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # the real import later reports the problem properly
                pass

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_set_context(self, context: WorkerContext) -> None:
        STATE.context = context

    def _sgd_start_training(
        self,
        train_func: Callable[[], Any],
        encode: Callable[[Any], Any],
        checkpoint: Optional[dict],
        dataset_shard: Any,
        max_pending: int,
        start_iteration: int = 0,
        encode_checkpoint: Optional[Callable[[Any], Any]] = None,
        direct_write: Optional[DirectWrite] = None,
        run_info: Optional[Dict[str, Optional[str]]] = None,
    ) -> None:
        previous = STATE.session
        if previous is not None and not previous.finished:
            raise RuntimeError("a training function is still running on this worker")
        assert STATE.context is not None, "worker context must be set before training"
        if run_info:
            STATE.context = dataclasses.replace(STATE.context, **run_info)  # type: ignore[arg-type]
        session = Session(
            train_func, STATE.context, encode, checkpoint, dataset_shard, max_pending, start_iteration,
            encode_checkpoint, direct_write,
        )
        STATE.session = session
        session.start()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_stop(self) -> None:
        """Stop the current run at its next report or checkpoint (see ``Session.request_stop``)."""
        if STATE.session is not None:
            STATE.session.request_stop()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_watch(self) -> None:
        """Return when the current run's thread ends; the driver holds this call open
        so that a dead process shows up at once as an error on it."""
        if STATE.session is not None:
            STATE.session.join()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_poll(self, max_items: int):
        session = STATE.session
        if session is None:
            raise RuntimeError("no training run on this worker")
        return session.poll(max_items)


class _PlainWorker(WorkerMixin):
    pass


_REMOTE_CLASSES: Dict[Any, Any] = {}


def _keeping_init_error(actor_cls: type) -> Callable[..., None]:
    """``actor_cls.__init__`` that keeps its exception instead of killing the actor, so the
    driver can raise it with its own type (Ray would report an ``ActorDiedError``)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            actor_cls.__init__(self, *args, **kwargs)  # type: ignore[misc]
        except Exception as exc:
            self._sgd_init_error = exc

    return __init__


def remote_worker_class(actor_cls: Optional[type]) -> Any:
    """The Ray actor class for workers; with ``actor_cls``, a subclass of it and the mixin."""
    key = actor_cls or _PlainWorker
    cls = _REMOTE_CLASSES.get(key)
    if cls is None:
        base: Any
        if actor_cls is None:
            base = _PlainWorker
        else:
            if isinstance(actor_cls, ray.actor.ActorClass):
                actor_cls = actor_cls.__ray_actor_class__  # type: ignore[attr-defined]
            # Not findable by name in this module, so cloudpickle ships it by value.
            base = type(actor_cls.__name__, (actor_cls, WorkerMixin),
                        {"__module__": __name__, "__init__": _keeping_init_error(actor_cls)})
        cls = ray.remote(concurrency_groups={CONTROL_GROUP: 8})(base)  # type: ignore[call-overload]
        _REMOTE_CLASSES[key] = cls
    return cls
