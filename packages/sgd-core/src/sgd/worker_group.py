"""``WorkerGroup``: N Ray actors in one placement group, in rank order.

The class-level API that embedding libraries (Ludwig and the like) use
directly, and what :class:`sgd.Trainer` runs training functions on.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from sgd._internal.session import WorkerContext
from sgd.utils import ensure_ray

if TYPE_CHECKING:
    from sgd.backend import Backend
from sgd._internal.worker import WorkerMetadata, remote_worker_class

logger = logging.getLogger("sgd")

#: Ray placement-group strategies a worker group may use.
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def placement_timeout_s() -> float:
    """Seconds to wait for resources that the cluster has but are in use (``SGD_PLACEMENT_TIMEOUT_S``)."""
    return float(os.environ.get("SGD_PLACEMENT_TIMEOUT_S", "120"))


def infeasible_timeout_s() -> float:
    """Seconds to wait for resources the cluster does not have at all, in case nodes are
    joining (``SGD_INFEASIBLE_TIMEOUT_S``)."""
    return float(os.environ.get("SGD_INFEASIBLE_TIMEOUT_S", "10"))


class ResourcesUnavailableError(RuntimeError):
    """The cluster could not place the workers in time."""


class WorkerGroup:
    """A group of Ray actors, one per worker, indexed by world rank.

    :param num_workers: how many actors (> 0).
    :param num_cpus_per_worker: CPUs reserved per actor (>= 0).
    :param num_gpus_per_worker: GPUs reserved per actor (>= 0).
    :param additional_resources_per_worker: custom Ray resources per actor.
    :param actor_cls: make each worker an instance of this class, so its
        methods can be called through the handles (``wg[0].train.remote()``).
    :param actor_cls_args: positional arguments for ``actor_cls``.
    :param actor_cls_kwargs: keyword arguments for ``actor_cls``.
    :param placement_timeout_s: how long to wait for the cluster to place the group.
    :param preload_modules: modules every worker starts importing in the background at once.

    The group starts when created. Workers on one node get consecutive ranks;
    rank 0 is on the driver's node when a worker runs there.
    """

    def __init__(
        self,
        num_workers: int = 2,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        additional_resources_per_worker: Optional[Dict[str, float]] = None,
        actor_cls: Optional[type] = None,
        actor_cls_args: Optional[tuple] = None,
        actor_cls_kwargs: Optional[dict] = None,
        *,
        placement_timeout_s: Optional[float] = None,
        preload_modules: Tuple[str, ...] = (),
        placement_strategy: str = "PACK",
    ):
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers <= 0:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if num_cpus_per_worker < 0 or num_gpus_per_worker < 0:
            raise ValueError(
                f"CPUs and GPUs per worker must be >= 0, got num_cpus_per_worker={num_cpus_per_worker}, "
                f"num_gpus_per_worker={num_gpus_per_worker}"
            )
        extra = dict(additional_resources_per_worker or {})
        for key, value in extra.items():
            if value < 0:
                raise ValueError(f"additional_resources_per_worker[{key!r}] must be >= 0, got {value}")
        if actor_cls is None and (actor_cls_args or actor_cls_kwargs):
            raise ValueError("actor_cls_args / actor_cls_kwargs were given without actor_cls")
        if placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {placement_strategy!r}")
        self.placement_strategy = placement_strategy
        self.num_workers = num_workers
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker
        self.additional_resources_per_worker = extra
        self._actor_cls = actor_cls
        self._actor_args = tuple(actor_cls_args or ())
        self._actor_kwargs = dict(actor_cls_kwargs or {})
        self._placement_timeout_s = placement_timeout_s
        self._preload_modules = tuple(preload_modules)
        self._pg: Optional[PlacementGroup] = None
        self._owns_pg = True
        self._bundle_offset = 0
        self.workers: List[Any] = []
        self.metadata: List[WorkerMetadata] = []
        self.contexts: List[WorkerContext] = []
        self._shutdown_hooks: List[Callable[[WorkerGroup], None]] = []
        #: The :class:`sgd.Backend` object set up on this group (by ``Trainer.to_worker_group``,
        #: a ``Trainer`` run, or ``sgd_horovod.RayExecutor``); ``None`` for a bare group.
        #: It keeps whatever state its backend holds (a rendezvous server...) until shutdown.
        self.backend: Optional[Backend] = None
        self.start()

    # --- lifecycle ----------------------------------------------------------

    @property
    def bundle(self) -> Dict[str, float]:
        """The Ray resources one worker reserves."""
        bundle = {"CPU": self.num_cpus_per_worker, "GPU": self.num_gpus_per_worker}
        bundle.update(self.additional_resources_per_worker)
        return {k: v for k, v in bundle.items() if v > 0}

    @property
    def is_running(self) -> bool:
        return bool(self.workers)

    def start(self) -> None:
        """Reserve the resources and start the actors.

        :raises RuntimeError: the group is already running.
        :raises ResourcesUnavailableError: the cluster cannot place the group in time.
        """
        if self.workers:
            raise RuntimeError("this WorkerGroup is already running; call shutdown() first")
        ensure_ray()
        bundle = self.bundle
        if not bundle:
            raise ValueError("each worker must reserve some resource (CPU, GPU or a custom one)")
        current = ray.util.get_current_placement_group()
        if current is not None:
            # Running inside a reservation made for us (a Ray Tune trial asks for one bundle
            # for its own driver, then one per worker): use its last bundles, never nest.
            specs = current.bundle_specs
            if len(specs) < self.num_workers:
                raise ValueError(
                    f"the enclosing placement group has {len(specs)} bundles; {self.num_workers} workers "
                    "need one each"
                )
            self._pg, self._owns_pg = current, False
            self._bundle_offset = len(specs) - self.num_workers
        else:
            self._pg = placement_group([dict(bundle) for _ in range(self.num_workers)],
                                       strategy=self.placement_strategy)
            self._owns_pg, self._bundle_offset = True, 0
        try:
            if self._owns_pg:
                self._wait_for_placement(bundle)
            self._start_actors()
        except BaseException:
            for actor in self.workers:  # asked for but never running: not a group
                ray.kill(actor, no_restart=True)
            self.workers = []
            self._release()
            raise

    def _wait_for_placement(self, bundle: Dict[str, float]) -> None:
        assert self._pg is not None
        feasible, why = _feasible(bundle, self.num_workers)
        timeout = self._placement_timeout_s
        if timeout is None:
            timeout = placement_timeout_s() if feasible else infeasible_timeout_s()
        deadline = time.monotonic() + timeout
        ready = self._pg.ready()
        while True:
            done, _ = ray.wait([ready], timeout=min(5.0, max(0.0, deadline - time.monotonic())))
            if done:
                return
            if time.monotonic() >= deadline:
                break
            logger.warning("waiting for resources for %d workers of %s", self.num_workers, bundle)
        feasible, why = _feasible(bundle, self.num_workers)
        raise ResourcesUnavailableError(
            f"could not place {self.num_workers} workers of {bundle} within {timeout:.0f}s: "
            + (why if not feasible else "the resources exist but are in use by other work")
            + ". Ask for fewer workers or resources per worker, or add nodes to the cluster."
        )

    def _start_actors(self) -> None:
        assert self._pg is not None
        remote_cls = remote_worker_class(self._actor_cls)
        extra = {k: v for k, v in self.additional_resources_per_worker.items() if v > 0}
        actors = [
            remote_cls.options(
                num_cpus=self.num_cpus_per_worker,
                num_gpus=self.num_gpus_per_worker,
                resources=extra or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=self._bundle_offset + i
                ),
            ).remote(*self._actor_args, **self._actor_kwargs)
            for i in range(self.num_workers)
        ]
        self.workers = actors
        if self._preload_modules:
            self.preload(self._preload_modules)  # overlaps the framework import with what follows
        timeout = self._placement_timeout_s or placement_timeout_s()
        refs = [a._sgd_metadata.remote() for a in actors]
        # Bounded: a reservation on a lost node may never be honoured.
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            raise ResourcesUnavailableError(
                f"{self.num_workers} workers did not start within {timeout:.0f}s (a node of the "
                "reservation may be gone)."
            )
        metadata, errors = [], []
        for ref in refs:  # every one read, so Ray logs no "unhandled error" for the rest
            try:
                metadata.append(ray.get(ref))
            except Exception as exc:  # actor_cls(...) raised: re-raised with its type
                errors.append(exc)
        if errors:
            raise errors[0]
        self._assign_ranks(actors, metadata)

    def _assign_ranks(self, actors: List[Any], metadata: List[WorkerMetadata]) -> None:
        driver_node = ray.get_runtime_context().get_node_id()
        by_node: OrderedDict[str, List[int]] = OrderedDict()
        if any(m.node_id == driver_node for m in metadata):
            by_node[driver_node] = []
        for i, m in enumerate(metadata):
            by_node.setdefault(m.node_id, []).append(i)
        order: List[int] = []
        contexts: List[WorkerContext] = []
        for node_rank, indices in enumerate(by_node.values()):
            for local_rank, i in enumerate(indices):
                order.append(i)
                contexts.append(
                    WorkerContext(
                        world_rank=len(contexts),
                        local_rank=local_rank,
                        world_size=len(actors),
                        node_rank=node_rank,
                        local_world_size=len(indices),
                    )
                )
        self.workers = [actors[i] for i in order]
        self.metadata = [metadata[i] for i in order]
        self.contexts = contexts
        ray.get([w._sgd_set_context.remote(c) for w, c in zip(self.workers, contexts)])

    def shutdown(self, patience_s: float = 5) -> None:
        """Stop the actors and release their resources. Safe to call twice.

        Actors get ``patience_s`` seconds to exit on their own before they are killed.
        """
        if not self.workers:
            self._release()
            return
        for hook in list(self._shutdown_hooks):
            try:
                hook(self)
            except Exception:
                logger.exception("error while shutting the worker group down")
        self.stop_actors(patience_s)
        self._release()

    def stop_actors(self, patience_s: float = 0) -> None:
        """Stop the actors but keep the resource reservation; :meth:`restart_actors` starts new ones."""
        workers, self.workers = self.workers, []
        if patience_s > 0:
            refs = [w.__ray_terminate__.remote() for w in workers]
            ray.wait(refs, num_returns=len(refs), timeout=patience_s)
        for w in workers:
            ray.kill(w, no_restart=True)
        # metadata/contexts still describe the stopped actors (where they ran) until a restart.

    def restart_actors(self) -> None:
        """Kill every actor at once and start fresh ones in the same reservation.

        Used after a failure: a worker stuck in a collective cannot be stopped
        any other way.
        """
        self.stop_actors(patience_s=0)
        self._start_actors()

    def _release(self) -> None:
        if self._pg is not None and not self._owns_pg:
            self._pg = None  # someone else's reservation: theirs to remove
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # the cluster may already be gone
                logger.debug("could not remove placement group", exc_info=True)
            self._pg = None

    def add_shutdown_hook(self, hook: Callable[[WorkerGroup], None]) -> None:
        """Run ``hook(group)`` at the start of :meth:`shutdown`, while the actors are alive."""
        self._shutdown_hooks.append(hook)

    # --- running code -----------------------------------------------------------

    def _check_running(self) -> None:
        if not self.workers:
            raise RuntimeError("this WorkerGroup is shut down; call start() first")

    def execute_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[ray.ObjectRef]:
        """Run ``fn(*args, **kwargs)`` on every worker; object refs in rank order."""
        self._check_running()
        return [w._sgd_execute.remote(fn, args, kwargs) for w in self.workers]

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker; results in rank order."""
        refs = self.execute_async(fn, *args, **kwargs)
        try:
            return ray.get(refs)
        except Exception:
            # Read the other calls that already ended too, so that Ray does not log their
            # errors as "unhandled" later (without waiting for ones still running).
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception:
                    pass
            raise

    def execute_single_async(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Run ``fn(*args, **kwargs)`` on worker ``index``; an object ref."""
        self._check_running()
        if not 0 <= index < len(self.workers):
            raise IndexError(f"worker index {index} out of range for {len(self.workers)} workers")
        return self.workers[index]._sgd_execute.remote(fn, args, kwargs)

    def execute_single(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on worker ``index`` and return its result."""
        return ray.get(self.execute_single_async(index, fn, *args, **kwargs))

    def preload(self, modules: Tuple[str, ...]) -> None:
        """Start importing ``modules`` on every worker in the background and return at once.

        Code that needs them later waits on Python's import lock until they are in; an
        import error is left for that code to report.
        """
        self._check_running()
        for w in self.workers:
            w._sgd_preload.remote(tuple(modules))

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, index: int) -> Any:
        return self.workers[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.workers))

    def __repr__(self) -> str:
        state = "running" if self.workers else "stopped"
        return f"WorkerGroup(num_workers={self.num_workers}, bundle={self.bundle}, {state})"


def _feasible(bundle: Dict[str, float], n: int) -> tuple[bool, str]:
    """Whether the cluster as it is now could ever hold ``n`` bundles (ignoring current use)."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    totals: Dict[str, float] = {}
    fits_one_node = False
    for node in nodes:
        res = node.get("Resources", {})
        for k, v in res.items():
            totals[k] = totals.get(k, 0) + v
        if all(res.get(k, 0) >= v for k, v in bundle.items()):
            fits_one_node = True
    if not fits_one_node:
        return False, f"no node has {bundle} (cluster has {_summary(totals, bundle)})"
    for k, v in bundle.items():
        if totals.get(k, 0) < v * n:
            return False, f"the cluster has {totals.get(k, 0):g} {k} in all, {v * n:g} are needed"
    return True, ""


def _summary(totals: Dict[str, float], bundle: Dict[str, float]) -> str:
    return ", ".join(f"{totals.get(k, 0):g} {k}" for k in bundle)
