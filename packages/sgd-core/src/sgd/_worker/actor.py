"""The Ray actor every sgd worker is: a plain class, or the user's ``actor_cls`` plus this mixin."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from sgd._common import run_hooks
from sgd._worker import heap
from sgd._worker.rank_logs import RankLog, rank_log_path
from sgd._worker.resets import Resume
from sgd._worker.session import STATE, Session, WorkerContext
from sgd._worker.stacks import thread_stacks

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


class _Preloads:
    """How many preloads this process has finished. Calls that unpickle user code wait here
    for the preloads the driver sent before them (issue 18): unpickling a function that refers
    to a class deep inside a package (tensorflow...) while another thread imports that package
    trips Python's import-deadlock detection, and one of the two imports then sees a partially
    initialised module. Counting, not call order, so it holds whatever order Ray runs the
    calls of a threaded actor in."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._done = 0

    def finished(self) -> None:
        with self._cv:
            self._done += 1
            self._cv.notify_all()

    def wait(self, count: int) -> None:
        with self._cv:
            while self._done < count:
                self._cv.wait()


_PRELOADS = _Preloads()


def _user_code(code: Any, preloads: int) -> Any:
    """``code`` ready to call: after ``preloads`` preloads finished, unpickled if it came as bytes."""
    if preloads:
        _PRELOADS.wait(preloads)
    if isinstance(code, bytes):
        import ray.cloudpickle as cloudpickle

        return cloudpickle.loads(code)
    return code


class WorkerMixin:
    """Methods sgd calls on each worker actor; mixed into the user's ``actor_cls`` if any."""

    def _sgd_execute(self, fn: Any, args: Tuple, kwargs: Dict[str, Any], preloads: int = 0) -> Any:
        """``fn(*args, **kwargs)``; ``fn`` comes pickled (bytes) while preloads are pending."""
        return _user_code(fn, preloads)(*args, **kwargs)

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
    def _sgd_stacks(self, include_idle: bool = False) -> str:
        """Every thread's Python stack, answered from a control thread while training runs."""
        rank = STATE.context.world_rank if STATE.context is not None else -1
        return thread_stacks(rank, include_idle)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_preload(self, modules: Tuple[str, ...]) -> None:
        """Import ``modules`` (in a control-group thread, so other calls go on meanwhile;
        calls that unpickle user code wait for it: see :class:`_Preloads`)."""
        import importlib

        try:
            for name in modules:
                try:
                    importlib.import_module(name)
                except Exception:  # the real import later reports the problem properly
                    pass
        finally:
            _PRELOADS.finished()

    def _sgd_park(self) -> Optional[Tuple[int, str]]:
        """Forget the group this process served, so another may take it (sgd.worker_group.keep);
        this process's pid and host name (what the driver waits on when it ends it), or ``None``
        (and nothing forgotten) while a training function still runs here."""
        session = STATE.session
        if session is not None and not session.finished:
            return None
        STATE.context, STATE.session = None, None
        STATE.sent_once.clear()
        run_hooks.clear()
        _save_measurement()
        return os.getpid(), socket.gethostname()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_set_context(self, context: WorkerContext) -> None:
        STATE.context = context

    def _sgd_start_training(
        self,
        request: Any,
        run_info: Optional[Dict[str, Any]] = None,
        dataset_shard: Any = None,
        join: Optional[Resume] = None,
        snapshot: Any = None,
    ) -> Any:
        """Start a run: ``request`` is a :class:`~sgd._common.protocol.StartRequest`, pickled
        (bytes) as the driver sends it to many workers at once. A run without a dataset leaves
        ``dataset_shard`` out of the call (Ray serialises every argument passed, ``None`` too).

        ``join`` (with the root's ``snapshot``): this worker joins a run that re-formed its group
        in place (:mod:`sgd.elastic`). Returns the run's first poll reply when the request asks
        for one (``first_poll``), else ``None`` once the run started."""
        if isinstance(request, bytes):
            import ray.cloudpickle as cloudpickle

            request = cloudpickle.loads(request)  # sgd's own dataclass: the user's code stays bytes while preloads run
        # What the driver sends a worker once (its node, its file server), kept for later runs:
        # taken before anything here can fail (the driver counts it as sent).
        run_info = dict(run_info or {})
        STATE.sent_once.update({k: run_info[k] for k in SENT_ONCE if k in run_info})
        train_func, encode, checkpoint = _user_code(request.user_code, request.preloads)
        heap.settle()  # once per process: what it imported leaves the collector's full passes
        previous = STATE.session
        if previous is not None and not previous.finished:
            raise RuntimeError("a training function is still running on this worker")
        assert STATE.context is not None, "worker context must be set before training"
        if run_info:
            run_info.update(STATE.sent_once)
            STATE.context = dataclasses.replace(STATE.context, **run_info)  # type: ignore[arg-type]
        session = Session(
            train_func, STATE.context, encode, checkpoint, dataset_shard, request.max_pending,
            request.start_iteration, request.checkpoint_target, request.reforms,
        )
        if join is not None:
            session.resets.joined = (join, snapshot)
        STATE.session = session
        session.rank_log = _rank_log(session)
        session.start()
        if request.first_poll:
            return session.poll(request.first_poll, timeout_s=request.first_wait_s, linger_s=request.first_linger_s)
        return None

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

    # --- in-place recovery (sgd.elastic) ---------------------------------------------------------

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_elastic_interrupt(self, hard: bool) -> bool:
        """Ask the run to come to the reset barrier (hard: a peer died, release the
        collectives); whether the run is in ``sgd.elastic.run``."""
        session = STATE.session
        if session is None or session.finished:
            return False
        return session.resets.interrupt(hard)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_elastic_snapshot(self) -> Any:
        """The run's state as last committed, for the workers that load it from this one."""
        session = STATE.session
        state = session.resets.state if session is not None else None
        if state is None:
            raise RuntimeError("this worker's run has no sgd.elastic state")
        return state._peer_snapshot()

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_elastic_resume(self, plan: Resume, snapshot: Any = None) -> None:
        """Let the run waiting at the barrier go on in the new world ``plan`` describes."""
        session = STATE.session
        if session is None or session.finished:
            raise RuntimeError("no run waits to re-form on this worker")
        if plan.context is not None:
            # The new place in the group, with what the run was told about itself kept.
            run_fields = {f: getattr(session.context, f) for f in _RUN_FIELDS}
            STATE.context = dataclasses.replace(plan.context, **run_fields)
            session.context = STATE.context
        if plan.shard is not None:
            session.dataset_shard = plan.shard
        session.set_iteration(plan.iteration)
        session.resets.resume(plan, snapshot)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_notice(self, info: Any) -> int:
        """A host of the group is draining: the reports this worker made so far (-1: no run)."""
        session = STATE.session
        return -1 if session is None or session.finished else session.notice(info)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_notice_from(self, iteration: int) -> None:
        if STATE.session is not None:
            STATE.session.notice_from(iteration)

    @ray.method(concurrency_group=CONTROL_GROUP)
    def _sgd_poll(self, max_items: int):
        session = STATE.session
        if session is None:
            raise RuntimeError("no training run on this worker")
        return session.poll(max_items)


def _save_measurement() -> None:
    """Save a coverage.py measurement running in this process (a test suite's), if any. A kept
    process outlives the group that parks it and may be killed later (a group that fails is
    killed, not parked), which would lose everything it measured for the groups before: saved
    at each park, such a kill loses only what came after."""
    coverage = sys.modules.get("coverage")
    current = getattr(getattr(coverage, "Coverage", None), "current", None)
    measurement = current() if callable(current) else None
    if measurement is not None:
        try:
            measurement.save()
        except Exception:
            logging.getLogger("sgd").debug("could not save the coverage measurement", exc_info=True)


#: The run-info fields the driver sends each worker process once (the same for every run of the
#: group): a start call without them keeps the last ones sent (``WorkerState.sent_once``).
SENT_ONCE = ("driver_node_id", "driver_files", "collective")

#: The worker context's fields that describe the run rather than the worker's place.
_RUN_FIELDS = ("experiment_name", "trial_dir", "trial_name", "trial_id", "driver_node_id", "driver_files",
               "driver_files_told", "local_gpus", "collective", "collective_run")


def _rank_log(session: Session) -> Any:
    """The tee of this run's stdout and stderr into ``run_dir/logs/rank_N.log`` (None: off)."""
    run_dir = session.context.trial_dir
    if not run_dir or os.environ.get("SGD_RANK_LOGS", "1") == "0":
        return None
    rank = session.context.world_rank
    try:
        # Elsewhere than on the driver's host, the output goes to the driver with the poll replies.
        sink = None if session.shares_driver_disk else session.send_log
        return RankLog(rank, rank_log_path(run_dir, rank), sink)
    except Exception as exc:  # a log is not worth a run
        logging.getLogger("sgd").warning("rank %d: no log file in %s/logs: %s", rank, run_dir, exc)
        return None


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
