"""``WorkerGroup``: N Ray actors in one placement group, in rank order; started, resized, stopped.

Where the actors run is :mod:`sgd.worker_group.reservation`'s job, running code on them
:mod:`sgd.worker_group.calls`'s, their ranks :mod:`sgd.worker_group.ranks`'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, Iterator, List, Optional, Tuple, Union

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from sgd._common.placement import PLACEMENT_STRATEGIES, placement_timeout_s
from sgd._common.public import public_module
from sgd._common.waits import wait
from sgd._worker.actor import WorkerMetadata, remote_worker_class
from sgd._worker.session import WorkerContext
from sgd.errors import ResourcesUnavailableError
from sgd.utils import ensure_ray
from sgd.worker_group.calls import _Calls
from sgd.worker_group.keep import KEPT, new_kept_actor, park, tag_for
from sgd.worker_group.ranks import contexts_in_order, rank_order
from sgd.worker_group.reservation import _Reservation

if TYPE_CHECKING:
    from sgd.backend import Backend

logger = logging.getLogger("sgd")


def _check_count(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@public_module("sgd.worker_group")
class WorkerGroup(_Reservation, _Calls):
    """A group of Ray actors, one per worker, indexed by world rank.

    :param num_workers: how many actors (> 0); 1 by default, as in Ray Train.
    :param num_cpus_per_worker: CPUs reserved per actor (>= 0).
    :param num_gpus_per_worker: GPUs reserved per actor (>= 0).
    :param additional_resources_per_worker: custom Ray resources per actor.
    :param actor_cls: make each worker an instance of this class, so its
        methods can be called through the handles (``wg[0].train.remote()``).
    :param actor_cls_args: positional arguments for ``actor_cls``.
    :param actor_cls_kwargs: keyword arguments for ``actor_cls``.
    :param placement_group: a placement group you created (``ray.util.placement_group``):
        the workers go into its bundles (any bundle with room, as in Ray Train) and it is left
        for you to remove. ``"default"`` (or ``None``): the enclosing placement group when
        there is one (a Ray Tune trial's), else one the group reserves and removes itself.
    :param placement_timeout_s: how long to wait for the cluster to place the group.
    :param preload_modules: modules every worker starts importing in the background at once.
    :param node_id: pin every worker to this Ray node (a ``NodeID`` from ``ray.nodes()``);
        ``None`` lets Ray place them. Not with ``placement_group=`` or inside an enclosing one.
    :param avoid_nodes: Ray node ids (hex) to keep the workers off: hosts known to be lost
        or draining that Ray still offers. Honoured for the placement group the group reserves
        itself (not inside ``placement_group=`` or an enclosing one).
    :param keep_tag: with :func:`sgd.keep_workers` on, a clean :meth:`shutdown` parks the
        workers' processes under this tag for the next group with the same tag, instead of
        ending them (workers of at most 1 CPU and no other resource, without ``actor_cls``, in a
        placement group of their own only);
        ``None`` (the default): never kept.

    The group starts when created. Workers on one node get consecutive ranks;
    rank 0 is on the driver's node when a worker runs there.
    """

    def __init__(
        self,
        num_workers: int = 1,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        additional_resources_per_worker: Optional[Dict[str, float]] = None,
        actor_cls: Optional[type] = None,
        actor_cls_args: Optional[tuple] = None,
        actor_cls_kwargs: Optional[dict] = None,
        placement_group: Union[PlacementGroup, str, None] = "default",
        *,
        placement_timeout_s: Optional[float] = None,
        preload_modules: Tuple[str, ...] = (),
        placement_strategy: str = "PACK",
        node_id: Optional[str] = None,
        avoid_nodes: Optional[Collection[str]] = None,
        keep_tag: Optional[str] = None,
    ):
        _check_count(num_workers, "num_workers")
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
        if not (placement_group in (None, "default") or isinstance(placement_group, PlacementGroup)):
            raise TypeError(
                "placement_group must be a ray.util.placement_group.PlacementGroup you created, or "
                f"'default' (sgd reserves one itself), got {placement_group!r}"
            )
        self.placement_strategy = placement_strategy
        self._node_id = node_id
        self._avoid_nodes = frozenset(avoid_nodes or ())
        self.num_workers = num_workers
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker
        self.additional_resources_per_worker = extra
        self._actor_cls = actor_cls
        self._actor_args = tuple(actor_cls_args or ())
        self._actor_kwargs = dict(actor_cls_kwargs or {})
        self._placement_timeout_s = placement_timeout_s
        self._preload_modules = tuple(preload_modules)
        #: The caller's placement group (``placement_group=``), never removed by this group.
        self._given_pg: Optional[PlacementGroup] = (
            placement_group if isinstance(placement_group, PlacementGroup) else None
        )
        # One slot per worker, in index order: (placement group, bundle index; -1 is any bundle).
        self._slots: List[Tuple[PlacementGroup, int]] = []
        # Slots of workers removed while their reservation is kept (a group re-formed in place,
        # sgd.elastic): reused first when workers are added, so the group grows back into them.
        self._spare: List[Tuple[PlacementGroup, int]] = []
        # The placement groups this group reserved itself (removed on shutdown).
        self._own_pgs: List[PlacementGroup] = []
        # Preloads sent to each actor (by actor id): calls with user code wait for them there.
        self._preloads: Dict[Any, int] = {}
        self.workers: List[Any] = []
        self.metadata: List[WorkerMetadata] = []
        self.contexts: List[WorkerContext] = []
        self._shutdown_hooks: List[Callable[[WorkerGroup], None]] = []
        #: The :class:`sgd.Backend` object set up on this group (by ``Trainer.to_worker_group``,
        #: a ``Trainer`` run, or ``sgd_horovod.RayExecutor``); ``None`` for a bare group.
        #: It keeps whatever state its backend holds (a rendezvous server...) until shutdown.
        self.backend: Optional[Backend] = None
        #: What each worker's run-end hooks said when the last run ended cleanly, in rank order
        #: (see :attr:`sgd.backend.Workers.run_notes`); kept by the run's group.
        self.run_notes: List[Optional[Dict[str, Any]]] = []
        # Its owner's tag (sgd.worker_group.keep): with sgd.keep_workers on, a clean shutdown
        # parks the processes for the next group with the same tag. ``_kept``: the tag its
        # workers are taken from the pool under and parked under (None: not kept, see tag_for).
        # Workers that replace others, or are added, are taken and parked the same way: a
        # process is parked only after it forgot its run (sgd.worker_group.keep.park).
        self._keep_tag = keep_tag
        self._kept: Optional[str] = None
        self.start()

    # --- lifecycle ----------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """Whether the actors are up."""
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
        self._kept = None
        if self._actor_cls is None and self._given_pg is None and ray.util.get_current_placement_group() is None:
            self._kept = tag_for(bundle, self._keep_tag)
        try:
            self._slots = self._reserve(self.num_workers, first=True, node_id=self._node_id)
            self._start_actors()
        except BaseException:
            for actor in self.workers:  # asked for but never running: not a group
                ray.kill(actor, no_restart=True)
            self.workers = []
            self._release()
            raise

    def _launch(self, slots: List[Tuple[PlacementGroup, int]]) -> Tuple[List[Any], List[WorkerMetadata]]:
        """Start one actor per slot (a kept process where there is one) and wait for each to
        report where it runs."""
        remote_cls = remote_worker_class(self._actor_cls)
        extra = {k: v for k, v in self.additional_resources_per_worker.items() if v > 0}
        taken: Dict[int, str] = {}  # index in slots -> node, of processes a previous group kept
        if self._kept is not None:
            nodes = self._slot_nodes(slots)
            actors = []
            for i, node in enumerate(nodes):
                actor = KEPT.take(self._kept, node)
                if actor is None:
                    actor = new_kept_actor(remote_cls, node)
                else:
                    taken[i] = node
                actors.append(actor)
        else:
            actors = [
                remote_cls.options(
                    num_cpus=self.num_cpus_per_worker,
                    num_gpus=self.num_gpus_per_worker,
                    resources=extra or None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                ).remote(*self._actor_args, **self._actor_kwargs)
                for pg, index in slots
            ]
        try:
            if self._preload_modules:  # overlaps the framework import with what follows
                for a in actors:
                    self._send_preload(a, self._preload_modules)
            # Starting processes on reserved resources is not waiting for room: a short
            # placement_timeout_s (an elastic attempt, a user's) does not bound it.
            timeout = max(self._placement_timeout_s or 0.0, placement_timeout_s())
            refs = [a._sgd_metadata.remote() for a in actors]
            # Bounded: a reservation on a lost node may never be honoured.
            ready, _ = wait(refs, timeout=timeout)
            if len(ready) < len(refs):
                raise ResourcesUnavailableError(
                    f"{len(refs)} workers did not start within {timeout:.0f}s (a node of the "
                    "reservation may be gone)."
                )
            metadata, errors = [], []
            for i, ref in enumerate(refs):  # every one read, so Ray logs no "unhandled error" for the rest
                gone_while_parked = ray.exceptions.RayActorError if i in taken else ()
                try:
                    metadata.append(ray.get(ref))
                except gone_while_parked as exc:
                    # A kept process that died while parked: a new one in its place.
                    logger.debug("a kept worker process is gone (%s); starting a new one", exc)
                    actors[i] = new_kept_actor(remote_cls, taken[i])
                    if self._preload_modules:
                        self._send_preload(actors[i], self._preload_modules)
                    metadata.append(ray.get(actors[i]._sgd_metadata.remote(), timeout=timeout))
                except Exception as exc:  # actor_cls(...) raised: re-raised with its type
                    errors.append(exc)
            if errors:
                raise errors[0]
        except BaseException:
            for a in actors:
                ray.kill(a, no_restart=True)
            raise
        return actors, metadata

    def _start_actors(self) -> None:
        actors, metadata = self._launch(self._slots)
        self.workers = actors
        self._assign_ranks(actors, metadata)

    # --- resizing (Ray Train 1.x's WorkerGroup API) ---------------------------------------

    def add_workers(self, num_workers: int, *, node_id: Optional[str] = None) -> None:
        """Start ``num_workers`` more workers, appended after the current ones (indices
        ``len(group)`` onwards); every worker's context (world size, ranks) is updated.

        New workers go into the ``placement_group=`` the group was made with, or into a new
        placement group of their own that the group removes once they are all removed (or on
        shutdown). ``node_id`` pins them to that Ray node (not with ``placement_group=``).

        :raises ValueError: ``num_workers`` is not a positive int.
        :raises RuntimeError: the group is shut down, or a backend is set up on it (its
            process group or rendezvous has a fixed size: start a new group instead).
        :raises ResourcesUnavailableError: the cluster cannot place them in time.
        """
        _check_count(num_workers, "num_workers")
        self._check_resizable("add_workers")
        self._add(num_workers, node_id)

    def _add(self, num_workers: int, node_id: Optional[str] = None) -> None:
        """:meth:`add_workers` without its checks (a group re-forming in place, sgd.elastic)."""
        slots = self._slots_for(num_workers, node_id)
        try:
            actors, metadata = self._launch(slots)
        except BaseException:
            self._release_unused()
            raise
        self._slots += slots
        self._set_order(self.workers + actors, self.metadata + metadata)

    def remove_workers(self, worker_indexes: List[int]) -> None:
        """Stop the workers at ``worker_indexes``; the others keep their order and are
        renumbered from 0 (their contexts updated). A placement group this group reserved is
        removed once none of its workers is left; a bundle of one still in use stays held.

        :raises ValueError: an index is out of range or repeated, or no worker would be left
            (call :meth:`shutdown` instead).
        :raises RuntimeError: the group is shut down, or a backend is set up on it.
        """
        self._check_resizable("remove_workers")
        indexes = list(worker_indexes)
        n = len(self.workers)
        bad = [i for i in indexes if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n]
        if bad:
            raise ValueError(f"remove_workers: indexes {bad} are not worker indexes of this group (0..{n - 1})")
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"remove_workers: repeated indexes in {indexes}")
        if len(indexes) == n:
            raise ValueError("remove_workers would leave no worker; call shutdown() instead")
        self._remove(indexes)

    def _remove(self, indexes: List[int], keep_slots: bool = False) -> None:
        """:meth:`remove_workers` without its checks (a group re-forming in place, sgd.elastic);
        ``keep_slots``: keep their reservation for workers added later."""
        n = len(self.workers)
        gone = set(indexes)
        for i in sorted(gone):
            ray.kill(self.workers[i], no_restart=True)
            self._preloads.pop(self.workers[i]._actor_id, None)
        if keep_slots:
            self._spare += [self._slots[i] for i in sorted(gone) if self._slots[i][1] >= 0]
        keep = [i for i in range(n) if i not in gone]
        self._slots = [self._slots[i] for i in keep]
        self._release_unused()
        self._set_order([self.workers[i] for i in keep], [self.metadata[i] for i in keep])

    def _check_resizable(self, what: str) -> None:
        self._check_running()
        if self.backend is not None:
            raise RuntimeError(
                f"{what}: this group has a {type(self.backend).__name__} set up for {len(self.workers)} "
                "workers; shut it down and start one of the size you want (or use Trainer(num_workers=(min, max)))"
            )

    def _set_order(self, actors: List[Any], metadata: List[WorkerMetadata]) -> None:
        """Contexts for workers kept in this exact index order (ranks follow the indices)."""
        contexts = contexts_in_order(metadata)
        self.workers, self.metadata, self.contexts = list(actors), list(metadata), contexts
        self.num_workers = len(actors)
        for ref in [w._sgd_set_context.remote(c) for w, c in zip(self.workers, contexts)]:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                # A worker that died since it was added: its death surfaces where it is used
                # (its owner removes it); resizing must not fail for the live ones.
                logger.debug("worker died before its context was updated", exc_info=True)

    def _assign_ranks(self, actors: List[Any], metadata: List[WorkerMetadata]) -> None:
        order, contexts = rank_order(metadata, ray.get_runtime_context().get_node_id())
        self.workers = [actors[i] for i in order]
        self.metadata = [metadata[i] for i in order]
        self._slots = [self._slots[i] for i in order]
        self.contexts = contexts
        ray.get([w._sgd_set_context.remote(c) for w, c in zip(self.workers, contexts)])

    def shutdown(self, patience_s: float = 5, *, keep: bool = True, await_freed: bool = True) -> None:
        """Stop the actors and release their resources. Safe to call twice.

        Actors get ``patience_s`` seconds to exit on their own before they are killed. A group
        its owner tagged, with :func:`sgd.keep_workers` on, parks its processes for the next
        group instead (``keep=False``: never; its owner knows they are not clean).
        ``await_freed``: return only once Ray's resource view shows the reservation free (at
        most 2 s), for a caller that counts free resources next; ``False`` for one that counted
        before (a restart), since the bundles of a lost host never show free again.
        """
        if not self.workers:
            self._release(await_freed)
            return
        clean = keep
        for hook in list(self._shutdown_hooks):
            try:
                hook(self)
            except Exception:
                clean = False
                logger.exception("error while shutting the worker group down")
        if clean and self._kept is not None:
            workers, self.workers = self.workers, []
            for w in workers:
                self._preloads.pop(w._actor_id, None)
            park(self._kept, workers, [m.node_id for m in self.metadata], patience_s)
        else:
            self.stop_actors(patience_s)
        self._release(await_freed)

    def stop_actors(self, patience_s: float = 0) -> None:
        """Stop the actors but keep the resource reservation; :meth:`restart_actors` starts new ones."""
        workers, self.workers = self.workers, []
        if patience_s > 0:
            refs = [w.__ray_terminate__.remote() for w in workers]
            wait(refs, timeout=patience_s)
        for w in workers:
            ray.kill(w, no_restart=True)
            self._preloads.pop(w._actor_id, None)
        # metadata/contexts still describe the stopped actors (where they ran) until a restart.

    def replace_workers(self, indexes: List[int]) -> None:
        """Kill the workers at ``indexes`` and start new ones in their places (their slots of
        the reservation, their ranks); the other workers are kept as they are. Every
        worker's context is set again (a new worker may land on another node where the
        reservation is shared).

        :raises ValueError: an index is not a worker index of this group.
        """
        self._check_running()
        n = len(self.workers)
        bad = [i for i in indexes if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n]
        if bad:
            raise ValueError(f"replace_workers: indexes {bad} are not worker indexes of this group (0..{n - 1})")
        gone = sorted(set(indexes))
        if not gone:
            return
        for i in gone:
            ray.kill(self.workers[i], no_restart=True)
            self._preloads.pop(self.workers[i]._actor_id, None)
        actors, metadata = self._launch([self._slots[i] for i in gone])
        workers, metas = list(self.workers), list(self.metadata)
        for i, actor, meta in zip(gone, actors, metadata):
            workers[i], metas[i] = actor, meta
        self._set_order(workers, metas)

    def restart_actors(self) -> None:
        """Kill every actor at once and start fresh ones in the same reservation (as many as now).

        Used after a failure: a worker stuck in a collective cannot be stopped
        any other way.
        """
        self.stop_actors(patience_s=0)
        self._start_actors()

    def add_shutdown_hook(self, hook: Callable[[WorkerGroup], None]) -> None:
        """Run ``hook(group)`` at the start of :meth:`shutdown`, while the actors are alive."""
        self._shutdown_hooks.append(hook)

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, index: int) -> Any:
        return self.workers[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.workers))

    def __repr__(self) -> str:
        state = "running" if self.workers else "stopped"
        return f"WorkerGroup(num_workers={self.num_workers}, bundle={self.bundle}, {state})"
