"""``RayExecutor``: Horovod's own embedding API (``horovod.ray.RayExecutor``) on sgd workers.

Libraries written against ``horovod.ray.RayExecutor`` switch by changing the
import::

    from sgd_horovod import RayExecutor          # was: from horovod.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=1)
    executor.start(executable_cls=MyTrainer, executable_kwargs={"lr": 0.1})
    losses = executor.execute(lambda trainer: trainer.train())   # on every worker
    executor.shutdown()

The workers are an :class:`sgd.WorkerGroup`; the Horovod setup is sgd's ``"horovod"``
backend (run through the plugin hooks, so other plugins' setup applies too). The
executable is created on each worker after the Horovod environment is in place,
so its ``__init__`` may call ``hvd.init()``.
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import ray

import sgd
from sgd.worker_group import WorkerGroup
from sgd_horovod.config import HorovodConfig
from sgd_horovod.discovery import RayHostDiscovery
from sgd_horovod.elastic_job import ElasticJob
from sgd_horovod.single import no_collectives

logger = logging.getLogger("sgd.horovod")


@dataclass
class RayExecutorSettings:
    """What :meth:`RayExecutor.create_settings` returns (Horovod's ``MiniSettings`` fields that
    matter without SSH). Any object with these attributes works, Horovod's own settings included.

    :param timeout_s: Gloo rendezvous and collective timeout, seconds.
    :param nics: network interfaces Gloo may use (see :class:`HorovodConfig`).
    :param verbose: log level of the setup (see :class:`HorovodConfig`).
    :param key: secret for Horovod's services (``None``: random).
    :param placement_group_timeout_s: how long to wait for the cluster to place the workers.
    :param elastic: ``True`` once an elastic :class:`RayExecutor` (``min_workers=...``) uses them.
    :param discovery: the host discovery of an elastic executor: set by it (a
        :class:`~sgd_horovod.RayHostDiscovery`) unless it is created with ``override_discovery=False``.
    """

    timeout_s: float = 30
    nics: Optional[Union[str, Sequence[str]]] = None
    verbose: int = 1
    key: Optional[Union[str, bytes]] = field(default=None, repr=False)
    placement_group_timeout_s: float = 100
    elastic: bool = False
    discovery: Any = None


class HorovodWorker:
    """The actor behind each worker of a :class:`RayExecutor`: the methods of Horovod's
    ``BaseHorovodWorker``, so code that calls them on ``executor.workers`` keeps working."""

    def __init__(self) -> None:
        self.executable: Any = None

    def hostname(self) -> str:
        return socket.gethostname()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def get_gpu_ids(self) -> List[Any]:
        return list(ray.get_gpu_ids())

    def update_env_vars(self, env_vars: Dict[str, Any]) -> None:
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        return dict(os.environ)

    def start_executable(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
                         executable_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Create ``executable_cls(*args, **kwargs)`` (or nothing when it is ``None``)."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """``func(executable)`` in this worker."""
        return func(self.executable)

    def set_queue(self, queue: Any) -> None:
        """Send this worker's :func:`sgd_horovod.ray_logger.log` dicts to ``queue`` (``None``: drop them)."""
        from sgd_horovod import ray_logger

        ray_logger.configure(queue)

    def execute_alone(self, func: Callable[[Any], Any], world_size: int) -> Any:
        """``func(executable)`` on this worker while the others do nothing: a Horovod collective
        inside raises :class:`~sgd_horovod.single.CollectiveInExecuteSingleError`."""
        with no_collectives(world_size):
            return func(self.executable)


def _warn_callbacks(callbacks: Optional[List[Callable]]) -> None:
    if callbacks:
        warnings.warn(
            "RayExecutor: callbacks are not supported and are ignored (Horovod's non-elastic RayExecutor "
            "ignores them too); report progress from the function's return value or with sgd.Trainer",
            UserWarning, stacklevel=3,
        )


class RayExecutor:
    """Horovod's ``RayExecutor`` API on an :class:`sgd.WorkerGroup`.

    :param settings: from :meth:`create_settings` (``None``: its defaults), or any object with
        ``timeout_s`` (and optionally ``nics``, ``verbose``, ``key``, ``placement_group_timeout_s``).
    :param num_workers: how many workers (Horovod processes).
    :param cpus_per_worker: CPUs each worker reserves.
    :param use_gpu: reserve GPUs (``gpus_per_worker``, default 1, per worker).
    :param gpus_per_worker: GPUs per worker when ``use_gpu``.

    Keyword-only, as in Horovod: ``num_hosts`` and ``num_workers_per_host`` instead of
    ``num_workers`` (``num_hosts * num_workers_per_host`` workers, placed like any sgd group:
    packed, not forced to that layout); ``use_current_placement_group`` (sgd always uses an
    enclosing placement group, such as a Tune trial's).
    Elastic, as in Horovod (keyword-only): ``min_workers`` (instead of ``num_workers``),
    ``max_workers``, ``reset_limit``, ``cooldown_range`` (``(min, max)`` seconds a failed host
    is avoided), ``elastic_timeout`` (seconds to wait for ``min_workers`` slots) and
    ``override_discovery`` (``True``: ``settings.discovery`` becomes a
    :class:`~sgd_horovod.RayHostDiscovery` of these sizes). Then each run is an sgd run under
    the run controller, recovering in place with ``hvd.elastic`` (see :mod:`sgd_horovod.elastic_job`);
    ``run``/``execute`` return the final workers' values and call ``callbacks`` with every
    :func:`sgd_horovod.ray_logger.log` dict.
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: float = 100,
                        nics: Optional[Union[str, Sequence[str]]] = None) -> RayExecutorSettings:
        """Settings for :class:`RayExecutor` (Horovod's signature).

        :param timeout_s: Gloo rendezvous and collective timeout, seconds.
        :param ssh_identity_file: accepted for compatibility; unused (Ray starts the workers, no SSH).
        :param ssh_str: accepted for compatibility; unused, and never written to disk.
        :param placement_group_timeout_s: how long to wait for the cluster to place the workers.
        :param nics: network interfaces Gloo may use.
        """
        return RayExecutorSettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                                   nics=nics)

    def __init__(
        self,
        settings: Any = None,
        num_workers: Optional[int] = None,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: Optional[float] = None,
        *,
        num_hosts: Optional[int] = None,
        num_workers_per_host: int = 1,
        use_current_placement_group: bool = True,
        min_workers: Optional[int] = None,
        max_workers: Optional[int] = None,
        reset_limit: Optional[int] = None,
        cooldown_range: Optional[List[int]] = None,
        elastic_timeout: int = 600,
        override_discovery: bool = True,
    ):
        if max_workers is not None and (not min_workers or min_workers <= 0):
            raise ValueError("`max_workers` provided without any positive `min_workers`. "
                             "Elastic workloads require a positive `min_workers`")
        if min_workers is not None and num_workers is not None:
            raise ValueError("Both `min_workers` and `num_workers` provided. Only one of the above is allowed "
                             "as workloads cannot be elastic and non-elastic.")
        if min_workers is None and (reset_limit is not None or cooldown_range is not None):
            raise ValueError("reset_limit and cooldown_range apply to elastic jobs only: pass min_workers "
                             "(and max_workers) to make this executor elastic, or leave them out")
        self.settings = settings if settings is not None else self.create_settings()
        if not isinstance(getattr(self.settings, "timeout_s", None), (int, float)):
            raise TypeError(
                f"settings must come from RayExecutor.create_settings() (or have a numeric timeout_s), "
                f"got {type(self.settings).__name__}"
            )
        self.num_workers = (min_workers if min_workers is not None
                            else self._count_workers(num_workers, num_hosts, num_workers_per_host))
        if isinstance(cpus_per_worker, bool) or not isinstance(cpus_per_worker, (int, float)) or cpus_per_worker < 0:
            raise ValueError(f"cpus_per_worker must be a number >= 0, got {cpus_per_worker!r}")
        if use_gpu:
            gpus = 1 if gpus_per_worker is None else gpus_per_worker
            if gpus <= 0:
                raise ValueError(f"use_gpu=True needs gpus_per_worker > 0 (or None for 1), got {gpus_per_worker!r}")
        else:
            if gpus_per_worker:
                raise ValueError(
                    f"gpus_per_worker={gpus_per_worker!r} but use_gpu=False; pass use_gpu=True to reserve GPUs"
                )
            gpus = 0
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = bool(use_gpu)
        self.gpus_per_worker = gpus
        if not use_current_placement_group and ray.is_initialized() and ray.util.get_current_placement_group():
            logger.warning("use_current_placement_group=False is not supported: sgd's workers use the "
                           "enclosing placement group")
        self._group: Optional[WorkerGroup] = None
        self._config: Optional[HorovodConfig] = None
        #: The elastic job (``min_workers=...``), else ``None``.
        self._elastic: Optional[ElasticJob] = None
        if min_workers is not None:
            if override_discovery:
                self.settings.discovery = RayHostDiscovery(use_gpu=use_gpu, cpus_per_slot=cpus_per_worker,
                                                           gpus_per_slot=gpus or 1)
            self.settings.elastic = True
            self._elastic = ElasticJob(
                getattr(self.settings, "discovery", None), min_workers, max_workers, reset_limit=reset_limit,
                cooldown_range=cooldown_range, elastic_timeout=elastic_timeout, timeout_s=self.settings.timeout_s,
                nics=getattr(self.settings, "nics", None), verbose=getattr(self.settings, "verbose", 1),
                key=getattr(self.settings, "key", None), cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus,
                placement_timeout_s=getattr(self.settings, "placement_group_timeout_s", None),
            )

    @staticmethod
    def _count_workers(num_workers: Optional[int], num_hosts: Optional[int], per_host: int) -> int:
        def positive(n: Any) -> bool:
            return isinstance(n, int) and not isinstance(n, bool) and n > 0

        if num_workers is not None and num_hosts is not None:
            raise ValueError("pass either num_workers or num_hosts (with num_workers_per_host), not both")
        if num_hosts is not None:
            if not positive(num_hosts) or not positive(per_host):
                raise ValueError(
                    f"num_hosts and num_workers_per_host must be positive ints, got {num_hosts!r} and {per_host!r}"
                )
            return num_hosts * per_host
        if num_workers is None:
            raise ValueError("RayExecutor needs num_workers (or num_hosts and num_workers_per_host)")
        if not positive(num_workers):
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        return num_workers

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, executable_cls: Optional[type] = None, executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict[str, Any]] = None,
              extra_env_vars: Optional[Dict[str, Any]] = None) -> None:
        """Start the workers, set Horovod up, set ``extra_env_vars``, then create
        ``executable_cls(*executable_args, **executable_kwargs)`` on every worker.

        :raises RuntimeError: already started (call :meth:`shutdown` first).
        """
        if self._elastic is not None:
            self._elastic.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
            return
        if self._group is not None:
            raise RuntimeError("this RayExecutor is already started; call shutdown() first")
        if executable_cls is not None and not callable(executable_cls):
            raise TypeError(f"executable_cls must be a class, got {executable_cls!r}")
        if extra_env_vars is not None and not isinstance(extra_env_vars, dict):
            raise TypeError(f"extra_env_vars must be a dict of names to values, got {type(extra_env_vars).__name__}")
        settings = self.settings
        config = HorovodConfig(
            nics=getattr(settings, "nics", None),
            verbose=getattr(settings, "verbose", 1),
            key=getattr(settings, "key", None),
            timeout_s=settings.timeout_s,
        )
        # sgd-core's lifecycle, through its public API: the workers placed as HorovodWorker
        # actors, the backend set up by the hooks (one backend object for the group's life: it
        # holds the rendezvous), torn down when the group shuts down. Horovod's RayExecutor does
        # not retry a start, so neither does this one.
        trainer = sgd.Trainer(
            backend=config,
            num_workers=self.num_workers,
            use_gpu=self.gpus_per_worker > 0,
            resources_per_worker={"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker},
            max_retries=0,
            placement_timeout_s=getattr(settings, "placement_group_timeout_s", None),
        )
        group = trainer.to_worker_group(HorovodWorker)
        try:
            if extra_env_vars:
                ray.get([w.update_env_vars.remote(extra_env_vars) for w in group])
            ray.get([w.start_executable.remote(executable_cls, executable_args, executable_kwargs) for w in group])
        except BaseException:
            group.shutdown(patience_s=0)
            raise
        self._group, self._config = group, config

    def shutdown(self) -> None:
        """Tear Horovod down and stop the workers. Safe to call twice; ``start()`` may follow."""
        if self._elastic is not None:
            self._elastic.shutdown()
        group, self._group = self._group, None
        if group is not None:
            group.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    @property
    def workers(self) -> List[Any]:
        """The worker actors in rank order (each has :class:`HorovodWorker`'s methods)."""
        return list(self._running())

    @property
    def worker_group(self) -> WorkerGroup:
        """The underlying :class:`sgd.WorkerGroup`."""
        return self._running()

    def _running(self) -> WorkerGroup:
        if self._elastic is not None:
            group = self._elastic.worker_group
            if group is None:
                raise RuntimeError("this elastic RayExecutor has no workers now: they exist only while run() or "
                                   "execute() runs (as in Horovod)")
            return group
        if self._group is None:
            raise RuntimeError("this RayExecutor is not started; call start() first")
        return self._group

    # --- running code -------------------------------------------------------------------------

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every worker; the results in rank order.

        Elastic: the workers of the last rendezvous; ``callbacks`` get every dict the workers
        send with :func:`sgd_horovod.ray_logger.log`.
        """
        if self._elastic is not None:
            return self._elastic_job().run(fn, callbacks)
        _warn_callbacks(callbacks)
        return ray.get([w.execute.remote(fn) for w in self._running()])

    def run(self, fn: Callable[..., Any], args: Optional[Sequence] = None, kwargs: Optional[Dict[str, Any]] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker (no executable); the results in rank order.

        Elastic: as :meth:`execute`.
        """
        if self._elastic is not None:
            call_args, call_kwargs = tuple(args or ()), dict(kwargs or {})
            return self._elastic_job().run(lambda _executable: fn(*call_args, **call_kwargs), callbacks)
        _warn_callbacks(callbacks)
        return ray.get(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn: Callable[..., Any], args: Optional[Sequence] = None,
                   kwargs: Optional[Dict[str, Any]] = None) -> List[ray.ObjectRef]:
        """Like :meth:`run`, without waiting: one object ref per worker, in rank order.

        :raises NotImplementedError: elastic (as in Horovod: the workers come and go).
        """
        if self._elastic is not None:
            raise NotImplementedError("run_remote: object refs cannot be returned from elastic runs, as the "
                                      "workers are ephemeral; use run(), which waits and returns the values")
        return self._running().execute_async(fn, *(args or ()), **(kwargs or {}))

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only; its result.

        The other workers do not run anything, so a Horovod collective inside ``fn`` could
        never complete: it raises
        :class:`~sgd_horovod.CollectiveInExecuteSingleError` instead of blocking.
        """
        if self._elastic is not None:
            raise NotImplementedError("Elastic mode does not support execute_single. Please use the execute "
                                      "method instead")
        group = self._running()
        return ray.get(group[0].execute_alone.remote(fn, len(group)))

    def _elastic_job(self) -> ElasticJob:
        assert self._elastic is not None
        if not self._elastic.started:
            raise RuntimeError("this RayExecutor is not started; call start() first")
        return self._elastic

    def __repr__(self) -> str:
        started = self._group is not None or (self._elastic is not None and self._elastic.started)
        state = "started" if started else "not started"
        return (f"RayExecutor(num_workers={self.num_workers}, cpus_per_worker={self.cpus_per_worker}, "
                f"gpus_per_worker={self.gpus_per_worker}, {state})")
