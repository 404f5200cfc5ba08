"""Horovod's elastic API on Ray (``horovod.ray.ElasticRayExecutor`` and ``RayExecutor(min_workers=...)``)
on an :class:`sgd.WorkerGroup`.

Horovod's own elastic machinery decides who trains: its ``ElasticDriver`` polls a host
discovery, assigns ranks, runs the elastic rendezvous (its HTTP server with the elastic
handler) and tells rank 0 when hosts change, and ``hvd.elastic.run`` on the workers commits,
restores and syncs the state. What sgd provides is the processes: every slot the driver asks
for becomes one worker appended to an sgd ``WorkerGroup`` (``add_workers(1, node_id=...)``,
pinned to the discovered host's Ray node) and every worker that ends, fails or whose host left
is taken out of it (``remove_workers``), so the group always holds the job's live workers.

Nothing here imports Horovod at module level.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import ray

from sgd.worker_group import ResourcesUnavailableError, WorkerGroup
from sgd_horovod._horovod import require_horovod
from sgd_horovod.config import _probe, _secret
from sgd_horovod.rendezvous import Slot, choose_interfaces

logger = logging.getLogger("sgd.horovod")

#: How often a worker's driver thread checks whether its host left or the job stopped, seconds.
POLL_S = 0.2


def _number(value: Any, name: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


# --- discovery ------------------------------------------------------------------------------


class RayHostDiscovery:
    """Horovod host discovery from the Ray cluster: every alive node is a host, with as many
    slots as its total resources hold workers (Horovod's ``RayHostDiscovery``; it assumes the
    whole cluster is there for the job).

    Hosts are named by Ray node id, which is unique even for several Ray nodes on one machine
    (Horovod names them by IP). Accepts both Horovod spellings of the sizes: ``cpus_per_slot`` /
    ``gpus_per_slot`` (``horovod.ray.elastic``) and ``cpus_per_worker`` / ``gpus_per_worker``
    (``horovod.ray.elastic_v2``).

    :param use_gpu: count GPU slots too (a host's slots are the smaller of CPU and GPU slots).
    :param cpus_per_slot: CPUs one worker reserves.
    :param gpus_per_slot: GPUs one worker reserves when ``use_gpu``.
    """

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: float = 1, *,
                 cpus_per_worker: Optional[float] = None, gpus_per_worker: Optional[float] = None):
        self.use_gpu = bool(use_gpu)
        self.cpus_per_slot = _number(cpus_per_slot if cpus_per_worker is None else cpus_per_worker,
                                     "cpus_per_slot (cpus_per_worker)")
        gpus = gpus_per_slot if gpus_per_worker is None else gpus_per_worker
        self.gpus_per_slot = _number(1 if gpus is None else gpus, "gpus_per_slot (gpus_per_worker)",
                                     positive=self.use_gpu)
        if not self.cpus_per_slot and not self.use_gpu:
            raise ValueError("a worker must reserve some CPUs (cpus_per_slot > 0) or GPUs (use_gpu=True)")

    # Horovod's v2 names for the same numbers.
    @property
    def cpus_per_worker(self) -> float:
        return self.cpus_per_slot

    @property
    def gpus_per_worker(self) -> float:
        return self.gpus_per_slot

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        """``{host: slots}`` for every alive Ray node with room for at least one worker."""
        mapping: Dict[str, int] = {}
        for node in ray.nodes():
            if not node.get("Alive", node.get("alive")):
                continue
            resources = node.get("Resources", {})
            counts = []
            if self.cpus_per_slot:
                counts.append(resources.get("CPU", 0) // self.cpus_per_slot)
            if self.use_gpu:
                counts.append(resources.get("GPU", 0) // self.gpus_per_slot)
            slots = int(math.ceil(min(counts)))
            if slots > 0:
                mapping[node.get("NodeID") or node["NodeManagerAddress"]] = slots
        return mapping


def node_for_host(host: str) -> str:
    """The Ray node id of a discovered host: ``host`` may be a node id, a node's IP or host
    name, or a custom resource ``node:<host>`` that one node declares (how Horovod's own tests
    name hosts). The first alive node that matches.

    :raises ValueError: no alive node matches.
    """
    nodes = [n for n in ray.nodes() if n.get("Alive", n.get("alive"))]
    for match in (
        lambda n: n.get("NodeID") == host,
        lambda n: f"node:{host}" in n.get("Resources", {}),
        lambda n: host in (n.get("NodeManagerAddress"), n.get("NodeManagerHostname")),
    ):
        for node in nodes:
            if match(node):
                return str(node["NodeID"])
    raise ValueError(
        f"the host discovery reported host {host!r}, which names no alive Ray node. Report hosts as Ray node "
        f"ids, node IPs or host names, or start the node with a resource 'node:{host}' "
        f"(ray start --resources='{{\"node:{host}\": 1}}')"
    )


class _CheckedDiscovery:
    """Wraps the user's discovery: checks what it returns and keeps its first error, so that a
    broken discovery is reported as itself rather than as "the job has been shut down"."""

    def __init__(self, discovery: Any):
        self.discovery = discovery
        self.error: Optional[BaseException] = None

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        try:
            hosts = self.discovery.find_available_hosts_and_slots()
            if not isinstance(hosts, dict) or not all(
                    isinstance(h, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
                    for h, n in hosts.items()):
                raise TypeError(
                    f"{type(self.discovery).__name__}.find_available_hosts_and_slots() must return a dict of "
                    f"host name to slot count (int >= 0), got {hosts!r}"
                )
            return hosts
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise


# --- the job --------------------------------------------------------------------------------


class _Rendezvous:
    """Horovod's HTTP rendezvous server with the elastic handler; ``stop`` also closes the
    socket (Horovod's leaves it open) and may be called twice."""

    def __init__(self, verbose: int):
        http_server = require_horovod("horovod.runner.http.http_server", "on the driver")
        self._server: Any = http_server.RendezvousServer(verbose)
        self._running = False

    def start(self, handler_cls: Any) -> int:
        port = int(self._server.start(handler_cls))
        self._running = True
        return port

    def init(self, host_alloc_plan: Any) -> None:
        self._server.init(host_alloc_plan)

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            self._server.stop()
            httpd = getattr(self._server, "_httpd", None)
            if httpd is not None:
                httpd.server_close()
        except Exception:
            logger.debug("stopping the elastic rendezvous server failed", exc_info=True)


@dataclass
class _Run:
    """One ``run`` call: the function, what came back, and the first error of each worker."""

    fn: Callable[[Any], Any]
    queue: Any
    values: List[Tuple[int, Any]] = field(default_factory=list)
    errors: Dict[str, BaseException] = field(default_factory=dict)
    finished: List[Any] = field(default_factory=list)  # actors that returned: stopped when the run ends
    spawned: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ElasticJob:
    """An elastic Horovod job: Horovod's ``ElasticDriver`` deciding, an sgd ``WorkerGroup`` holding
    the live workers. What :class:`ElasticRayExecutor` and ``RayExecutor(min_workers=...)`` run on.

    :param discovery: Horovod host discovery (``find_available_hosts_and_slots() -> {host: slots}``).
    :param min_workers: fewest workers to train with; fewer available makes the job wait.
    :param max_workers: most workers (``None``: as many as discovered).
    :param reset_limit: how many resets (size changes) before the job fails (``None``: no limit).
    :param cooldown_range: ``(min, max)`` seconds a failed host stays blacklisted (``None``: for good).
    :param elastic_timeout: seconds to wait for ``min_workers`` slots, at start and after a reset.
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
        self._lock = threading.Lock()  # guards the group: driver threads add and remove workers at once
        self._group: Optional[WorkerGroup] = None
        self._driver: Any = None
        self._checked: Optional[_CheckedDiscovery] = None
        self._env: Dict[str, str] = {}
        self._common_env: Dict[str, str] = {}
        self._executable: Tuple[Any, Sequence, Dict[str, Any]] = (None, (), {})
        self._started = False

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Start the rendezvous server and the driver, and wait until discovery reports at least
        ``min_workers`` slots. The workers start in :meth:`run`.

        :raises ResourcesUnavailableError: (a ``TimeoutError``) fewer slots for ``elastic_timeout`` s.
        """
        if self._started:
            raise RuntimeError("this elastic executor is already started; call shutdown() first")
        if executable_cls is not None and not callable(executable_cls):
            raise TypeError(f"executable_cls must be a class, got {executable_cls!r}")
        if env_vars is not None and not isinstance(env_vars, dict):
            raise TypeError(
                f"extra_env_vars / env_vars must be a dict of names to values, got {type(env_vars).__name__}"
            )
        require_horovod("horovod.runner.elastic.driver", "on the driver")
        self._executable = (executable_cls, tuple(executable_args or ()), dict(executable_kwargs or {}))
        self._env = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self._driver = self._new_driver()
        self._started = True

    def _new_driver(self) -> Any:
        from horovod.runner.common.util import codec, secret
        from horovod.runner.common.util.timeout import TimeoutException
        from horovod.runner.elastic.driver import ElasticDriver
        from horovod.runner.elastic.rendezvous import create_rendezvous_handler

        rendezvous = _Rendezvous(max(0, self.verbose - 1))
        self._checked = _CheckedDiscovery(self.discovery)
        driver = ElasticDriver(rendezvous, self._checked, self.min_workers, self.max_workers,
                               timeout=self.elastic_timeout, reset_limit=self.reset_limit,
                               cooldown_range=self.cooldown_range, verbose=self.verbose)
        try:
            port = rendezvous.start(create_rendezvous_handler(driver))
            self._common_env = {
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": ray.util.get_node_ip_address(),
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_ELASTIC": "1",
                "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, int(round(self.timeout_s)))),
                "PYTHONUNBUFFERED": "1",
                secret.HOROVOD_SECRET_KEY: codec.dumps_base64(_secret(self.key)),  # type: ignore[attr-defined]
            }
            try:
                driver.wait_for_available_slots(self.min_workers)
            except TimeoutException as exc:
                raise ResourcesUnavailableError(
                    f"the host discovery did not report {self.min_workers} slots (min_workers) within "
                    f"elastic_timeout={self.elastic_timeout}s; it reports {self._last_hosts()}. Add hosts, "
                    "lower min_workers, or raise elastic_timeout."
                ) from exc
            except RuntimeError:
                if self._checked.error is not None:
                    raise self._discovery_error() from self._checked.error
                raise
        except BaseException:
            driver.stop()
            raise
        return driver

    def _last_hosts(self) -> str:
        try:
            return repr(self.discovery.find_available_hosts_and_slots())
        except Exception as exc:
            return f"an error ({type(exc).__name__}: {exc})"

    def _discovery_error(self) -> RuntimeError:
        assert self._checked is not None and self._checked.error is not None
        err = self._checked.error
        return RuntimeError(f"the host discovery {type(self.discovery).__name__} failed: "
                            f"{type(err).__name__}: {err}")

    def shutdown(self) -> None:
        """Stop the driver and any worker still running. Safe to call twice."""
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        with self._lock:
            group, self._group = self._group, None
        if group is not None:
            group.shutdown(patience_s=0)
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    @property
    def worker_group(self) -> Optional[WorkerGroup]:
        """The group of the workers alive now (``None`` between runs)."""
        return self._group

    # --- running ----------------------------------------------------------------------------

    def run(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable[[Dict[str, Any]], Any]]] = None
            ) -> List[Any]:
        """Run ``fn(executable)`` as an elastic Horovod job until it returns on the workers of the
        last rendezvous; their return values in rank order.

        :param callbacks: each gets every dict that a worker sends with ``sgd_horovod.ray_logger.log``.
        :raises RuntimeError: the job failed (every worker failed, the reset limit was reached,
            ...): Horovod's message, with the first worker error as its cause.
        """
        if not self._started:
            raise RuntimeError("this elastic executor is not started; call start() first")
        if callbacks is not None and (not isinstance(callbacks, (list, tuple)) or not all(map(callable, callbacks))):
            raise TypeError(f"callbacks must be a list of callables (each gets a dict), got {callbacks!r}")
        driver = self._driver or self._new_driver()  # a driver runs once: a second run gets a new one
        self._driver = None
        queue = None
        if callbacks:
            from ray.util.queue import Queue

            queue = Queue(actor_options={"num_cpus": 0})
        run = _Run(fn=fn, queue=queue)
        pump = _CallbackPump(queue, list(callbacks or ()))
        pump.start()
        try:
            driver.start(self.min_workers, lambda slot, events: self._worker_loop(driver, run, slot, events))
            results = driver.get_results()
        finally:
            driver.stop()
            pump.stop()
            self._retire_all(run)
            if queue is not None:
                queue.shutdown()
        if self._checked is not None and self._checked.error is not None and not run.values:
            raise self._discovery_error() from self._checked.error
        if results.error_message is not None:
            raise RuntimeError(results.error_message) from _first(run.errors)
        failed = sorted(((name, v) for name, v in results.worker_results.items() if v[0] != 0),
                        key=lambda item: item[1][1])
        if failed:
            name = failed[0][0]
            cause = run.errors.get(name) or _first(run.errors)
            # A RayTaskError's own text is the whole remote traceback: name the user's error here,
            # the traceback stays in the cause.
            original = getattr(cause, "cause", None) or cause
            detail = f" ({type(original).__name__}: {original})" if original is not None else ""
            raise RuntimeError(
                "Horovod detected that one or more processes exited with non-zero status, thus causing the job "
                f"to be terminated. The first process to do so was: {name}{detail}"
            ) from cause
        pump.raise_error()
        return [value for _, value in sorted(run.values, key=lambda kv: kv[0])]

    def _worker_loop(self, driver: Any, run: _Run, slot: Any, events: Sequence[threading.Event]) -> Tuple[int, float]:
        """One slot's worker, from start to end, in a driver thread; Horovod's exit code."""
        name = f"{slot.hostname}[{slot.local_rank}]"
        actor = None
        try:
            actor = self._spawn(run, slot)
            ref = actor.execute.remote(run.fn)
            while True:
                done, _ = ray.wait([ref], timeout=POLL_S)
                if done:
                    value = ray.get(ref)
                    now = driver.get_slot_info(slot.hostname, slot.local_rank)
                    with run.lock:
                        run.values.append((now.rank if now.rank >= 0 else slot.rank, value))
                        run.finished.append(actor)
                    actor = None  # kept until the run ends: its peers may still be finishing
                    return 0, time.time()
                if any(event.is_set() for event in events):  # the job stopped, or this host left
                    return 1, time.time()
        except Exception as exc:
            if not any(event.is_set() for event in events):
                original = getattr(exc, "cause", None) or exc
                logger.warning("horovod elastic: worker %s failed: %s: %s", name, type(original).__name__, original)
            with run.lock:
                run.errors.setdefault(name, exc)
            return 1, time.time()
        finally:
            if actor is not None:
                self._retire(actor)

    def _spawn(self, run: _Run, slot: Any) -> Any:
        node_id = node_for_host(slot.hostname)
        from sgd_horovod.executor import HorovodWorker

        with self._lock:
            if self._group is None:
                self._group = WorkerGroup(
                    num_workers=1, num_cpus_per_worker=self.cpus_per_worker,
                    num_gpus_per_worker=self.gpus_per_worker, actor_cls=HorovodWorker, node_id=node_id,
                    placement_timeout_s=self.placement_timeout_s,
                )
            else:
                self._group.add_workers(1, node_id=node_id)
            group = self._group
            actor = group.workers[-1]
            probe = group.execute_single_async(len(group) - 1, _probe)
        with run.lock:
            run.spawned += 1
        try:
            info = ray.get(probe)
            where = f"worker {slot.hostname}[{slot.local_rank}] (node IP {info['node_ip']})"
            if "horovod_error" in info:
                raise ImportError(f"{where} cannot import horovod.torch: {info['horovod_error']}")
            if not info["horovod"]["gloo"]:
                raise RuntimeError(f"Horovod on {where} was built without Gloo; sgd runs Horovod over Gloo")
            iface = choose_interfaces([info], self.nics, single_node=False)[0]
            slot_env = Slot(hostname=slot.hostname, rank=slot.rank, local_rank=slot.local_rank,
                            cross_rank=slot.cross_rank, size=slot.size, local_size=slot.local_size,
                            cross_size=slot.cross_size).env()
            env = {**self._common_env, **self._env, **slot_env}
            if iface is not None:
                env["HOROVOD_GLOO_IFACE"] = env["NCCL_SOCKET_IFNAME"] = iface
            cls, args, kwargs = self._executable
            ray.get([actor.update_env_vars.remote(env), actor.set_queue.remote(run.queue)])
            ray.get(actor.start_executable.remote(cls, args, kwargs))
        except BaseException:
            self._retire(actor)
            raise
        return actor

    def _retire(self, actor: Any) -> None:
        """Stop ``actor`` and take it out of the group (the group ends with its last worker)."""
        with self._lock:
            group = self._group
            index = None
            if group is not None:
                index = next((i for i, w in enumerate(group.workers) if w._actor_id == actor._actor_id), None)
            if index is None:
                ray.kill(actor, no_restart=True)
            elif len(group) == 1:  # type: ignore[arg-type]
                group.shutdown(patience_s=0)  # type: ignore[union-attr]
                self._group = None
            else:
                group.remove_workers([index])  # type: ignore[union-attr]

    def _retire_all(self, run: _Run) -> None:
        with run.lock:
            finished, run.finished = run.finished, []
        for actor in finished:
            self._retire(actor)
        with self._lock:
            group, self._group = self._group, None
        if group is not None:  # workers whose threads have not noticed the end yet
            group.shutdown(patience_s=0)


def _first(errors: Dict[str, BaseException]) -> Optional[BaseException]:
    return next(iter(errors.values()), None)


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


# --- Horovod's ElasticRayExecutor (horovod.ray.elastic, deprecated there since 0.25) ---------


@dataclass
class ElasticRayExecutorSettings:
    """What :meth:`ElasticRayExecutor.create_settings` returns (the fields of Horovod's
    ``ElasticSettings`` that matter on Ray). Horovod's own ``ElasticSettings`` work too.

    ``discovery`` is set by :class:`ElasticRayExecutor` (a :class:`RayHostDiscovery`) unless it
    is created with ``override_discovery=False``; then set it yourself.
    """

    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    nics: Optional[Union[str, Sequence[str]]] = None
    verbose: int = 1
    cooldown_range: Optional[Sequence[int]] = None
    key: Optional[Union[str, bytes]] = field(default=None, repr=False)
    discovery: Any = None
    elastic: bool = True

    @property
    def num_proc(self) -> int:
        return self.min_num_proc


class ElasticRayExecutor:
    """Horovod's ``ElasticRayExecutor`` (``horovod.ray.elastic``) on sgd workers.

    :param settings: from :meth:`create_settings` (or Horovod's ``ElasticSettings``).
    :param use_gpu: reserve GPUs for each worker.
    :param cpus_per_slot: CPUs each worker reserves.
    :param gpus_per_slot: GPUs each worker reserves (needs ``use_gpu``; default 1 with it).
    :param env_vars: environment variables set on every worker before ``worker_fn`` runs.
    :param override_discovery: set ``settings.discovery`` to a :class:`RayHostDiscovery` of these
        sizes (``False``: keep the discovery you set).

    ``run(worker_fn, callbacks=None)`` runs ``worker_fn()`` (no arguments) on every worker,
    which calls ``hvd.init()`` and wraps its loop in ``hvd.elastic.run``; it returns the return
    values of the workers of the last rendezvous, in rank order.
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None,
                        reset_limit: Optional[int] = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[Union[str, Sequence[str]]] = None,
                        min_np: Optional[int] = None, max_np: Optional[int] = None,
                        **kwargs: Any) -> ElasticRayExecutorSettings:
        """Settings for :class:`ElasticRayExecutor` (Horovod's signature; ``min_np`` / ``max_np``
        are its deprecated names of ``min_num_proc`` / ``max_num_proc``).

        :param ssh_identity_file: accepted for compatibility; unused (Ray starts the workers).
        :param kwargs: also ``verbose``, ``cooldown_range`` and ``key``; other Horovod settings
            (``ssh_port``, ``output_filename``...) have no meaning here and are ignored with a warning.
        """
        if min_np is not None:
            warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2)
            min_num_proc = min_np
        if max_np is not None:
            warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2)
            max_num_proc = max_np
        known = {k: kwargs.pop(k) for k in ("verbose", "cooldown_range", "key") if k in kwargs}
        if kwargs:
            warnings.warn(f"ElasticRayExecutor.create_settings: {sorted(kwargs)} have no meaning on Ray "
                          "and are ignored", UserWarning, stacklevel=2)
        return ElasticRayExecutorSettings(min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                                          reset_limit=reset_limit, elastic_timeout=elastic_timeout,
                                          timeout_s=timeout_s, nics=nics, **known)

    def __init__(self, settings: Any, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: Optional[float] = None, env_vars: Optional[Dict[str, Any]] = None,
                 override_discovery: bool = True):
        if gpus_per_slot and not use_gpu:
            raise ValueError(
                "gpus_per_slot is set, but use_gpu is False. use_gpu must be True if gpus_per_slot is set."
            )
        gpus = (gpus_per_slot or 1) if use_gpu else 0
        if override_discovery:
            settings.discovery = RayHostDiscovery(use_gpu=use_gpu, cpus_per_slot=cpus_per_slot,
                                                  gpus_per_slot=gpus or 1)
        self.settings = settings
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = bool(use_gpu), cpus_per_slot, gpus
        self.env_vars = dict(env_vars or {})
        self._job = ElasticJob(
            getattr(settings, "discovery", None), getattr(settings, "min_num_proc", 1),
            getattr(settings, "max_num_proc", None), reset_limit=getattr(settings, "reset_limit", None),
            cooldown_range=getattr(settings, "cooldown_range", None),
            elastic_timeout=getattr(settings, "elastic_timeout", 600), timeout_s=_timeout_s(settings),
            nics=getattr(settings, "nics", None), verbose=_verbose(settings), key=getattr(settings, "key", None),
            cpus_per_worker=cpus_per_slot, gpus_per_worker=gpus,
        )

    def start(self) -> None:
        """Start Horovod's driver and rendezvous server; wait for ``min_num_proc`` slots."""
        self._job.start(env_vars=self.env_vars)

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Run ``worker_fn()`` elastically; the return values of the final workers in rank order."""
        if not callable(worker_fn):
            raise TypeError(f"worker_fn must be a function, got {worker_fn!r}")
        return self._job.run(_no_executable(worker_fn), callbacks)

    def shutdown(self) -> None:
        """Stop the driver and any worker left. (Horovod's executor has no ``shutdown``.)"""
        self._job.shutdown()

    @property
    def worker_group(self) -> Optional[WorkerGroup]:
        """The :class:`sgd.WorkerGroup` of the workers alive now (``None`` when none runs)."""
        return self._job.worker_group


def _no_executable(fn: Callable[[], Any]) -> Callable[[Any], Any]:
    def call(_executable: Any) -> Any:
        return fn()

    return call


def _timeout_s(settings: Any) -> float:
    value: Any = getattr(settings, "timeout_s", None)
    if value is None:  # Horovod's ElasticSettings: start_timeout is a Timeout object
        value = getattr(getattr(settings, "start_timeout", None), "_timeout", 30)
    return float(value)


def _verbose(settings: Any) -> int:
    verbose = getattr(settings, "verbose", 1)
    return int(verbose) if verbose is not None else 1
