"""Horovod's ``ElasticRayExecutor`` (``horovod.ray.elastic``, deprecated there since 0.25) on sgd
workers, and the names that module exports.

The executor is a thin adapter of :class:`sgd_horovod.elastic_job.ElasticJob`, which runs each
``run`` as an sgd run under the run controller (``RayExecutor(min_workers=...)`` runs on it too);
the host discovery is :class:`sgd_horovod.discovery.RayHostDiscovery`.

Nothing here imports Horovod at module level.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from sgd.worker_group import WorkerGroup
from sgd_horovod.discovery import RayHostDiscovery as RayHostDiscovery
from sgd_horovod.discovery import node_for_host as node_for_host
from sgd_horovod.elastic_job import ElasticJob as ElasticJob


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
