"""Placing an actor group: a fixed size, or for an elastic group as many workers as fit now.

Placements keep off the hosts found lost or draining; an elastic placement of more than
``min_workers`` that is not ready soon is given up and the workers counted again.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Optional, Set

from sgd._common.nodes import NodeInfo, NodeWatch
from sgd._common.scaling import fitting_workers
from sgd.backend import Backend, BackendConfig
from sgd.utils import ensure_ray
from sgd.worker_group import ResourcesUnavailableError, WorkerGroup, placement_timeout_s

logger = logging.getLogger("sgd")

#: An elastic placement of more than ``min_workers`` that is not ready within this many seconds
#: is given up and the workers counted again (the count came from a moment-old resource view).
ELASTIC_ATTEMPT_S = float(os.environ.get("SGD_ELASTIC_ATTEMPT_S", "5"))


class _Placing:
    """The placement part of :class:`sgd.group.actors.ActorGroup` (a mixin: the group's
    ``__init__`` sets these)."""

    min_workers: int
    max_workers: int
    num_workers: int
    resources_per_worker: Dict[str, float]
    placement_strategy: str
    placement_timeout_s: Optional[float]
    nodes: NodeWatch
    worker_group: Optional[WorkerGroup]
    backend: Optional[Backend]
    backend_config: BackendConfig
    hook: Any
    _actor_cls: tuple

    def _supplied_room(self, fitting: int) -> int:
        """``fitting`` capped by the room a plugin supplies (``sgd_elastic_room``), if any."""
        supplied = self.hook.sgd_elastic_room(worker_group=self.worker_group,
                                              resources_per_worker=dict(self.resources_per_worker))
        return fitting if supplied is None else min(fitting, int(supplied))

    def _size(self, room: int) -> int:
        """The size to (re)start with when ``room`` workers fit, within [min, max]."""
        return max(self.min_workers, min(self.max_workers, room))

    def _new_worker_group(self, restarting: bool = False, count: Optional[int] = None) -> WorkerGroup:
        """Place a new group: ``num_workers`` of them, or for an elastic group as many as fit
        now (at least ``min_workers``), off the hosts found lost or draining.

        :param restarting: after a failure: wait up to the placement timeout even where the
            cluster lacks the resources now (a lost host may come back, an autoscaler may add one).
        :param count: for an elastic group, how many fit, counted before the group being
            replaced released its resources (:meth:`room`).
        """
        avoid = self.nodes.avoid() if (restarting or self.min_workers != self.max_workers) else set()
        timeout = self.placement_timeout_s
        if timeout is None and restarting:
            timeout = placement_timeout_s()
        if self.min_workers == self.max_workers:
            return self._make_group(self.num_workers, avoid, timeout)
        ensure_ray()
        deadline = time.monotonic() + (timeout if timeout is not None else placement_timeout_s())
        while True:
            if count is None:
                count = self._supplied_room(fitting_workers(self.resources_per_worker, None, avoid))
            self.num_workers = self._size(count)
            logger.info("elastic: starting %d workers (min %d, max %d)", self.num_workers,
                        self.min_workers, self.max_workers)
            left = max(0.0, deadline - time.monotonic())
            # More than min may not fit after all (resources Ray still reported free a moment
            # ago): try for a few seconds, then count again. At min there is nothing smaller.
            attempt = left if self.num_workers == self.min_workers else min(left, ELASTIC_ATTEMPT_S)
            try:
                return self._make_group(self.num_workers, avoid, attempt)
            except ResourcesUnavailableError:
                if time.monotonic() >= deadline or self.num_workers == self.min_workers:
                    raise
                count, avoid = None, self.nodes.avoid()

    def _make_group(self, num_workers: int, avoid: Set[str], timeout: Optional[float]) -> WorkerGroup:
        res = dict(self.resources_per_worker)
        cpus = res.pop("CPU", 0)
        gpus = res.pop("GPU", 0)
        actor_cls, actor_cls_args, actor_cls_kwargs = self._actor_cls
        assert self.backend is not None
        return WorkerGroup(
            num_workers=num_workers,
            num_cpus_per_worker=cpus,
            num_gpus_per_worker=gpus,
            additional_resources_per_worker=res,
            actor_cls=actor_cls,
            actor_cls_args=actor_cls_args,
            actor_cls_kwargs=actor_cls_kwargs,
            preload_modules=tuple(self.backend.preload_modules),
            placement_strategy=self.placement_strategy,
            placement_timeout_s=timeout,
            avoid_nodes=avoid,
            keep_tag=self._keep_tag(),
        )

    def _keep_tag(self) -> Optional[str]:
        """What this group's processes are parked under for a later group (sgd.worker_group.keep):
        its backend's class, when the backend says they can serve another group."""
        backend = self.backend
        if backend is None or not backend.reuses_processes(self.backend_config):
            return None
        return f"{type(backend).__module__}.{type(backend).__qualname__}"

    def room(self, nodes: Optional[Dict[str, NodeInfo]] = None) -> int:
        """How many workers the group could have now if it were placed anew: the workers of
        ours that run on hosts that stay count as free; lost and draining hosts are left out.

        :param nodes: the cluster's nodes as just read (:func:`~sgd._common.nodes.cluster_nodes`).
        """
        wg = self.worker_group
        avoid = self.nodes.avoid(nodes)
        ours: Dict[str, int] = {}
        for meta in wg.metadata if wg is not None else []:
            if meta.node_id not in avoid:
                ours[meta.node_id] = ours.get(meta.node_id, 0) + 1
        # The reservations of workers a re-formed group left (sgd.elastic): room of its own.
        spare = len(wg.usable_spare()) if wg is not None and wg._spare else 0
        return self._supplied_room(fitting_workers(self.resources_per_worker, ours, avoid) + spare)
