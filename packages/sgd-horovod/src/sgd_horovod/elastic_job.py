"""The elastic Horovod job: Horovod's elastic executors as a thin adapter over an sgd run under
the run controller.

Each :meth:`ElasticJob.run` is one ``sgd.Trainer(backend=HorovodConfig(...), num_workers=(min,
max), max_retries=reset_limit)`` run: ``hvd.elastic.run`` in the function recovers in place
(:mod:`sgd_horovod.in_place`), the controller decides when the group re-forms and counts the
recoveries against ``reset_limit``, and the Horovod backend starts a rendezvous for each group.
Horovod's ``ElasticDriver`` is not used. What Horovod's driver did with its host discovery is
done here through sgd's seams: the discovery is the group's room (``sgd_elastic_room``: the
slots of the hosts not avoided, at most ``max_workers``), a host whose worker was lost is
avoided for ``cooldown_range`` seconds (for good without it: Horovod's blacklist), and
``ray_logger.log`` reaches the ``callbacks`` through a queue.

Nothing here imports Horovod at module level.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from sgd import hookimpl
from sgd.errors import WorkerDiedError
from sgd.worker_group import ResourcesUnavailableError, WorkerGroup
from sgd_horovod._horovod import require_horovod
from sgd_horovod.discovery import _CheckedDiscovery, _number, node_for_host

logger = logging.getLogger("sgd.horovod")

#: How often a worker's driver thread checks whether its host left or the job stopped, seconds.
POLL_S = 0.2


# --- the job --------------------------------------------------------------------------------

#: Past this many workers an elastic job without ``max_workers`` is never asked to grow: the
#: discovery's slots are the limit (Horovod's ``max_np=None``).
_NO_MAX = 1 << 16


class _DiscoveredRoom:
    """The job's host discovery as sgd's elastic room, for one run's trainer (a plugin passed in
    ``sgd.Trainer(plugins=[...])``): the group may have as many workers as the discovered hosts
    that are not avoided have slots, and each worker is given a slot (``host[i]``) by rank."""

    def __init__(self, job: ElasticJob):
        self.job = job

    @hookimpl
    def sgd_elastic_room(self) -> Optional[int]:
        return self.job._room()

    @hookimpl
    def sgd_backend_setup(self, worker_group: Any) -> None:
        self.job._placed(worker_group)

    @hookimpl
    def sgd_backend_handle_failure(self, error: BaseException) -> None:
        self.job._failed(error)


class ElasticJob:
    """An elastic Horovod job as an sgd run under the run controller: a thin adapter.

    Each :meth:`run` is one ``sgd.Trainer(backend=HorovodConfig(...), num_workers=(min_workers,
    max_workers), max_retries=reset_limit)`` run. The training function's ``hvd.elastic.run``
    recovers in place (:mod:`sgd_horovod.in_place`): a lost worker's peers go on from the last
    commit in a re-formed group, and hosts the discovery adds are taken in at a commit. The
    discovery is the group's room (the ``sgd_elastic_room`` hook); a host whose worker was lost
    is avoided for ``cooldown_range`` seconds (for good without it); ``reset_limit`` is the
    controller's count of recoveries (``RunController.attempt``), nothing here counts.
    What :class:`ElasticRayExecutor` and ``RayExecutor(min_workers=...)`` run on.

    :param discovery: Horovod host discovery (``find_available_hosts_and_slots() -> {host: slots}``).
    :param min_workers: fewest workers to train with; fewer available makes the job wait.
    :param max_workers: most workers (``None``: as many as discovered).
    :param reset_limit: how many recoveries before the job fails (``None``: no limit).
    :param cooldown_range: ``(min, max)`` seconds a failed host stays avoided (``None``: for good).
    :param elastic_timeout: seconds to wait for ``min_workers`` slots, at start and to place the group.
    :param timeout_s: Gloo timeout, seconds.
    """

    def __init__(self, discovery: Any, min_workers: int, max_workers: Optional[int] = None, *,
                 reset_limit: Optional[int] = None, cooldown_range: Optional[Sequence[int]] = None,
                 elastic_timeout: float = 600, timeout_s: float = 30,
                 nics: Optional[Union[str, Sequence[str]]] = None, verbose: int = 1,
                 key: Optional[Union[str, bytes]] = None, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, placement_timeout_s: Optional[float] = None):
        if discovery is None or not callable(getattr(discovery, "find_available_hosts_and_slots", None)):
            raise TypeError(
                "an elastic job needs a host discovery: an object with find_available_hosts_and_slots() "
                f"returning {{host: slots}} (for example sgd_horovod.RayHostDiscovery()), got {discovery!r}"
            )
        if not isinstance(min_workers, int) or isinstance(min_workers, bool) or min_workers <= 0:
            raise ValueError(f"min_workers must be a positive int, got {min_workers!r}")
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers < min_workers):
            raise ValueError(f"max_workers must be None or an int >= min_workers ({min_workers}), got {max_workers!r}")
        if reset_limit is not None and (not isinstance(reset_limit, int) or reset_limit < 0):
            raise ValueError(f"reset_limit must be None or an int >= 0, got {reset_limit!r}")
        if cooldown_range is not None:
            if (len(cooldown_range) != 2 or not all(isinstance(v, int) and v >= 1 for v in cooldown_range)
                    or cooldown_range[0] > cooldown_range[1]):
                raise ValueError(f"cooldown_range must be (min, max) whole seconds with 1 <= min <= max, "
                                 f"got {cooldown_range!r}")
            cooldown_range = tuple(cooldown_range)
        _number(elastic_timeout, "elastic_timeout", positive=True)
        _number(timeout_s, "timeout_s", positive=True)
        _number(cpus_per_worker, "cpus_per_worker")
        _number(gpus_per_worker, "gpus_per_worker")
        if not cpus_per_worker and not gpus_per_worker:
            raise ValueError("each worker must reserve some CPUs or GPUs")
        self.discovery = discovery
        self.min_workers, self.max_workers = min_workers, max_workers
        self.reset_limit, self.cooldown_range = reset_limit, cooldown_range
        self.elastic_timeout, self.timeout_s = elastic_timeout, timeout_s
        self.nics: Optional[Tuple[str, ...]] = (nics,) if isinstance(nics, str) else (tuple(nics) if nics else None)
        self.verbose, self.key = verbose, key
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.placement_timeout_s = placement_timeout_s
        self._checked = _CheckedDiscovery(discovery)
        self._lock = threading.Lock()  # the controller asks for room while a callback may read the group
        self._group: Optional[WorkerGroup] = None
        self._hosts: Dict[str, int] = {}
        self._avoid: Dict[str, float] = {}  # host -> until (time.monotonic()); math.inf: for good
        self._slots: Dict[Any, Tuple[str, int]] = {}  # actor id -> (host, slot) of the current run
        self._names: List[str] = []  # "host[slot]" by rank, of the last (re-)formed group
        self._env: Dict[str, str] = {}
        self._executable: Tuple[Any, Sequence, Dict[str, Any]] = (None, (), {})
        self._started = False

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Wait until discovery reports at least ``min_workers`` slots. The workers start in :meth:`run`.

        :raises ResourcesUnavailableError: (a ``TimeoutError``) fewer slots for ``elastic_timeout`` s.
        :raises RuntimeError: the discovery failed.
        """
        if self._started:
            raise RuntimeError("this elastic executor is already started; call shutdown() first")
        if executable_cls is not None and not callable(executable_cls):
            raise TypeError(f"executable_cls must be a class, got {executable_cls!r}")
        if env_vars is not None and not isinstance(env_vars, dict):
            raise TypeError(
                f"extra_env_vars / env_vars must be a dict of names to values, got {type(env_vars).__name__}"
            )
        require_horovod("horovod.torch", "on the driver")
        deadline = time.monotonic() + self.elastic_timeout
        while sum(self._discover().values()) < self.min_workers:
            if time.monotonic() >= deadline:
                raise ResourcesUnavailableError(
                    f"the host discovery did not report {self.min_workers} slots (min_workers) within "
                    f"elastic_timeout={self.elastic_timeout}s; it reports {self._hosts!r}. Add hosts, "
                    "lower min_workers, or raise elastic_timeout."
                )
            time.sleep(POLL_S)
        self._executable = (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}))
        self._env = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self._started = True

    def _discover(self) -> Dict[str, int]:
        """Read the discovery (kept as the last hosts seen). A failure is a ``RuntimeError`` naming it."""
        try:
            self._hosts = self._checked.find_available_hosts_and_slots()
        except Exception as exc:
            raise RuntimeError(f"the host discovery {type(self.discovery).__name__} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        return self._hosts

    def shutdown(self) -> None:
        """Forget the start (workers exist only during :meth:`run`). Safe to call twice."""
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    @property
    def worker_group(self) -> Optional[WorkerGroup]:
        """The group of the workers alive now (``None`` between runs)."""
        return self._group

    # --- the room, by discovery ---------------------------------------------------------------

    def _usable(self) -> List[Tuple[str, int]]:
        """The slots ``(host, i)`` of the hosts discovered last that are not avoided now."""
        now = time.monotonic()
        return [(host, i) for host, n in self._hosts.items() if self._avoid.get(host, 0) <= now for i in range(n)]

    def _room(self) -> Optional[int]:
        """How many workers the job may have now (sgd's ``sgd_elastic_room``)."""
        try:
            self._discover()
        except RuntimeError:
            logger.warning("horovod elastic: host discovery failed; keeping the hosts seen last", exc_info=True)
        with self._lock:
            return min(len(self._usable()), self.max_workers or _NO_MAX)

    def _placed(self, group: Any) -> None:
        """A group was (re-)formed: the hosts of workers that left it are avoided (Horovod's
        blacklist), and each new worker gets a free slot."""
        ids = [w._actor_id for w in group.workers]
        with self._lock:
            for actor_id in [a for a in self._slots if a not in ids]:
                self._avoid_host(self._slots.pop(actor_id)[0])
            free = [slot for slot in self._usable() if slot not in set(self._slots.values())]
            for actor_id in ids:
                if actor_id not in self._slots and free:
                    self._slots[actor_id] = free.pop(0)
            slots = [self._slots.get(actor_id) for actor_id in ids]
            self._names = [f"{slot[0]}[{slot[1]}]" if slot else f"rank {rank}" for rank, slot in enumerate(slots)]
            self._group = group

    def _failed(self, error: BaseException) -> None:
        """The group is replaced after ``error``: a dead worker's host is avoided, the others' slots freed."""
        rank = getattr(error, "world_rank", -1)
        with self._lock:
            if isinstance(error, WorkerDiedError) and 0 <= rank < len(self._names) and "[" in self._names[rank]:
                self._avoid_host(self._names[rank].rsplit("[", 1)[0])
            self._slots.clear()

    def _avoid_host(self, host: str) -> None:
        until = time.monotonic() + random.uniform(*self.cooldown_range) if self.cooldown_range else math.inf
        logger.info("horovod elastic: a worker on host %s was lost; avoiding the host %s", host,
                    "for good" if until == math.inf else f"for {until - time.monotonic():.0f}s")
        self._avoid[host] = until

    # --- running ----------------------------------------------------------------------------

    def run(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable[[Dict[str, Any]], Any]]] = None
            ) -> List[Any]:
        """Run ``fn(executable)`` as an elastic Horovod job until it returns on the workers of the
        last group; their return values in rank order.

        :param callbacks: each gets every dict that a worker sends with ``sgd_horovod.ray_logger.log``.
        :raises RuntimeError: the job failed (a worker error, the reset limit reached, a host that
            names no Ray node): Horovod's message, with the worker's error as its cause.
        """
        import sgd
        from sgd_horovod.config import HorovodConfig

        if not self._started:
            raise RuntimeError("this elastic executor is not started; call start() first")
        if callbacks is not None and (not isinstance(callbacks, (list, tuple)) or not all(map(callable, callbacks))):
            raise TypeError(f"callbacks must be a list of callables (each gets a dict), got {callbacks!r}")
        for host in self._discover():
            try:
                node_for_host(host)
            except ValueError as exc:
                raise RuntimeError(_job_failed(f"{host}[0]", exc)) from exc
        queue = None
        if callbacks:
            from ray.util.queue import Queue

            queue = Queue(actor_options={"num_cpus": 0})
        pump = _CallbackPump(queue, list(callbacks or ()))
        with self._lock:
            self._slots, self._names = {}, []
        trainer = sgd.Trainer(
            backend=HorovodConfig(nics=list(self.nics) if self.nics else None, verbose=self.verbose, key=self.key,
                                  timeout_s=self.timeout_s),
            num_workers=(self.min_workers, self.max_workers or _NO_MAX), use_gpu=bool(self.gpus_per_worker),
            resources_per_worker={"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker},
            max_retries=-1 if self.reset_limit is None else self.reset_limit,
            placement_timeout_s=self.placement_timeout_s or self.elastic_timeout, plugins=[_DiscoveredRoom(self)],
        )
        pump.start()
        try:
            trainer.start()
            values = trainer.run(_on_worker(fn, queue, self._executable, self._env))
        except Exception as exc:
            rank = getattr(exc, "world_rank", getattr(exc.__cause__, "world_rank", 0))
            names = self._names
            name = names[rank] if isinstance(rank, int) and 0 <= rank < len(names) else f"rank {rank}"
            raise RuntimeError(_job_failed(name, exc)) from exc
        finally:
            try:
                trainer.shutdown()
            finally:
                self._group = None
                pump.stop()
                if queue is not None:
                    queue.shutdown()
        pump.raise_error()
        return list(values)


def _job_failed(name: str, error: BaseException) -> str:
    return ("Horovod detected that one or more processes exited with non-zero status, thus causing the job "
            f"to be terminated. The first process to do so was: {name} ({type(error).__name__}: {error})")


#: The executable of ``start(executable_cls=...)`` on this worker process, per job start.
_EXECUTABLES: Dict[str, Any] = {}


def _on_worker(fn: Callable[[Any], Any], queue: Any, executable: Tuple[Any, Sequence, Dict[str, Any]],
               env: Dict[str, str]) -> Callable[[], Any]:
    """The training function sgd runs: the job's environment, ``ray_logger`` sending to the
    callbacks' queue, and the executable (made once per process, after the environment is set)."""
    token = uuid.uuid4().hex

    def train_func() -> Any:
        import os

        from sgd_horovod import in_place, ray_logger

        os.environ.update(env)
        in_place.keep_before_host_check()
        ray_logger.configure(queue)
        cls, args, kwargs = executable
        if token not in _EXECUTABLES:
            _EXECUTABLES.clear()
            _EXECUTABLES[token] = cls(*args, **kwargs) if cls is not None else None
        return fn(_EXECUTABLES[token])

    return train_func


class _CallbackPump:
    """A driver thread handing every dict the workers log to the callbacks."""

    def __init__(self, queue: Any, callbacks: List[Callable[[Dict[str, Any]], Any]]):
        self.queue, self.callbacks = queue, callbacks
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    def start(self) -> None:
        if self.queue is not None:
            self._thread = threading.Thread(target=self._loop, name="sgd-horovod-callbacks", daemon=True)
            self._thread.start()

    def _deliver(self, item: Dict[str, Any]) -> None:
        for callback in self.callbacks:
            try:
                callback(item)
            except Exception as exc:
                if self.error is None:
                    self.error = exc
                    logger.exception("horovod elastic: a callback raised")

    def _loop(self) -> None:
        from ray.util.queue import Empty

        while True:
            try:
                item = self.queue.get(block=True, timeout=0.5)
            except Empty:
                if self._stop.is_set():
                    return
                continue
            except Exception:  # the queue actor is gone
                return
            self._deliver(item)

    def stop(self) -> None:
        """Deliver what is still queued, then stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"a callback raised {type(self.error).__name__}: {self.error}") from self.error
