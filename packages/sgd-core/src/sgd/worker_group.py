"""``WorkerGroup``: N Ray actors in one placement group, in rank order.

The class-level API that embedding libraries (Ludwig and the like) use
directly, and what :class:`sgd.Trainer` runs training functions on.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, Iterator, List, Optional, Tuple, Union

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from sgd._common.nodes import avoid_selector

# Placement's names are re-exported here, where code importing them has found them so far.
from sgd._common.placement import (  # noqa: F401
    PLACEMENT_STRATEGIES,
    capacity_summary,
    infeasible_timeout_s,
    placement_timeout_s,
    wait_for_placement,
)
from sgd._common.waits import wait
from sgd._worker.session import WorkerContext
from sgd.errors import ResourcesUnavailableError
from sgd.utils import ensure_ray

if TYPE_CHECKING:
    from sgd.backend import Backend
from sgd._worker.actor import WorkerMetadata, remote_worker_class

logger = logging.getLogger("sgd")

#: After one worker's call in :meth:`WorkerGroup.execute` failed, how long the others may go on.
EXECUTE_ERROR_GRACE_S = 5.0


def _check_count(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class WorkerGroup:
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
        """Whether the actors are up."""
        return bool(self.workers)

    @property
    def placement_group(self) -> Optional[PlacementGroup]:
        """The placement group the workers run in (the first one, if :meth:`add_workers` made more)."""
        return self._slots[0][0] if self._slots else None

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
        try:
            self._slots = self._reserve(self.num_workers, first=True, node_id=self._node_id)
            self._start_actors()
        except BaseException:
            for actor in self.workers:  # asked for but never running: not a group
                ray.kill(actor, no_restart=True)
            self.workers = []
            self._release()
            raise

    def _reserve(self, count: int, first: bool, node_id: Optional[str] = None) -> List[Tuple[PlacementGroup, int]]:
        """Slots for ``count`` more workers: in the caller's placement group, the enclosing one
        (a Ray Tune trial's), or a new one of ``count`` bundles that this group owns (on
        ``node_id`` when given)."""
        if node_id is not None:
            return self._reserve_on_node(count, node_id)
        if self._given_pg is not None:
            self._wait_for_placement(self._given_pg, self.bundle, count, owned=False)
            return [(self._given_pg, -1)] * count  # any bundle with room, as in Ray Train
        current = ray.util.get_current_placement_group()
        if current is not None:
            # Running inside a reservation made for us (a Ray Tune trial asks for one bundle
            # for its own driver, then one per worker): use its last bundles, never nest.
            specs = current.bundle_specs
            if first:
                if len(specs) < count:
                    raise ValueError(
                        f"the enclosing placement group has {len(specs)} bundles; {count} workers "
                        "need one each"
                    )
                offset = len(specs) - count
                return [(current, offset + i) for i in range(count)]
            return [(current, -1)] * count
        selector = avoid_selector(self._avoid_nodes)
        pg = placement_group([dict(self.bundle) for _ in range(count)], strategy=self.placement_strategy,
                             bundle_label_selector=[dict(selector) for _ in range(count)] if selector else None)
        self._own_pgs.append(pg)
        self._wait_for_placement(pg, self.bundle, count, owned=True)
        return [(pg, i) for i in range(count)]

    def _reserve_on_node(self, count: int, node_id: str) -> List[Tuple[PlacementGroup, int]]:
        if self._given_pg is not None or ray.util.get_current_placement_group() is not None:
            raise ValueError(
                f"node_id={node_id!r} cannot be honoured inside a placement group that is not this group's own "
                "(placement_group= or an enclosing one, such as a Ray Tune trial's); leave node_id out there"
            )
        alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        if node_id not in alive:
            raise ValueError(
                f"node_id={node_id!r} is not an alive Ray node; alive nodes: {alive} (ray.nodes()[i]['NodeID'])"
            )
        # Ray gives every node the label ray.io/node-id: a hard pin, unlike _soft_target_node_id.
        pg = placement_group([dict(self.bundle) for _ in range(count)], strategy="PACK",
                             bundle_label_selector=[{"ray.io/node-id": node_id}] * count)
        self._own_pgs.append(pg)
        self._wait_for_placement(pg, self.bundle, count, owned=True)
        return [(pg, i) for i in range(count)]

    def _wait_for_placement(self, pg: PlacementGroup, bundle: Dict[str, float], count: int, owned: bool) -> None:
        wait_for_placement(pg, bundle, count, owned, self._avoid_nodes, self._placement_timeout_s)

    def _launch(self, slots: List[Tuple[PlacementGroup, int]]) -> Tuple[List[Any], List[WorkerMetadata]]:
        """Start one actor per slot and wait for each to report where it runs."""
        remote_cls = remote_worker_class(self._actor_cls)
        extra = {k: v for k, v in self.additional_resources_per_worker.items() if v > 0}
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
            for ref in refs:  # every one read, so Ray logs no "unhandled error" for the rest
                try:
                    metadata.append(ray.get(ref))
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

    def _slots_for(self, count: int, node_id: Optional[str] = None) -> List[Tuple[PlacementGroup, int]]:
        """Slots for ``count`` more workers: usable spare ones first (:meth:`usable_spare`), then
        a new reservation."""
        spare = self.usable_spare()[:count] if node_id is None else []
        for slot in spare:
            self._spare.remove(slot)
        if len(spare) == count:
            return spare
        try:
            return spare + self._reserve(count - len(spare), first=False, node_id=node_id)
        except BaseException:
            self._spare += spare
            raise

    def usable_spare(self) -> List[Tuple[PlacementGroup, int]]:
        """The spare slots (of workers removed with their reservation kept) whose bundle is
        placed now on a live node this group does not avoid (one lost with its host is placed
        again by Ray once a node has room)."""
        if not self._spare:
            return []
        from ray.util import placement_group_table

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")} - set(self._avoid_nodes)
        usable = []
        tables: Dict[str, Any] = {}
        for pg, index in self._spare:
            key = pg.id.hex()
            if key not in tables:
                try:
                    tables[key] = placement_group_table(pg)
                except Exception:
                    tables[key] = {}
            node = tables[key].get("bundles_to_node_id", {}).get(index)
            if tables[key].get("state") == "CREATED" and node in alive:
                usable.append((pg, index))
        return usable

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

    def _release_unused(self) -> None:
        """Remove the placement groups this group reserved that no worker uses any more."""
        used = {id(pg) for pg, _ in self._slots + self._spare}
        unused = [pg for pg in self._own_pgs if id(pg) not in used]
        self._own_pgs = [pg for pg in self._own_pgs if id(pg) in used]
        for pg in unused:
            try:
                remove_placement_group(pg)
            except Exception:  # the cluster may already be gone
                logger.debug("could not remove placement group", exc_info=True)

    def _check_resizable(self, what: str) -> None:
        self._check_running()
        if self.backend is not None:
            raise RuntimeError(
                f"{what}: this group has a {type(self.backend).__name__} set up for {len(self.workers)} "
                "workers; shut it down and start one of the size you want (or use Trainer(num_workers=(min, max)))"
            )

    def _set_order(self, actors: List[Any], metadata: List[WorkerMetadata]) -> None:
        """Contexts for workers kept in this exact index order (ranks follow the indices)."""
        nodes: Dict[str, int] = {}
        per_node: Dict[str, int] = {}
        for m in metadata:
            nodes.setdefault(m.node_id, len(nodes))
            per_node[m.node_id] = per_node.get(m.node_id, 0) + 1
        seen: Dict[str, int] = {}
        contexts = []
        for i, m in enumerate(metadata):
            contexts.append(WorkerContext(world_rank=i, local_rank=seen.get(m.node_id, 0), world_size=len(actors),
                                          node_rank=nodes[m.node_id], local_world_size=per_node[m.node_id]))
            seen[m.node_id] = seen.get(m.node_id, 0) + 1
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
        self._slots = [self._slots[i] for i in order]
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

    def _release(self) -> None:
        # Only our own reservations: the caller's or an enclosing one is theirs to remove.
        pgs, self._own_pgs, self._slots, self._spare = self._own_pgs, [], [], []
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # the cluster may already be gone
                logger.debug("could not remove placement group", exc_info=True)

    def add_shutdown_hook(self, hook: Callable[[WorkerGroup], None]) -> None:
        """Run ``hook(group)`` at the start of :meth:`shutdown`, while the actors are alive."""
        self._shutdown_hooks.append(hook)

    # --- running code -----------------------------------------------------------

    def _check_running(self) -> None:
        if not self.workers:
            raise RuntimeError("this WorkerGroup is shut down; call start() first")

    def _send_preload(self, actor: Any, modules: Tuple[str, ...]) -> None:
        actor._sgd_preload.remote(tuple(modules))
        self._preloads[actor._actor_id] = self._preloads.get(actor._actor_id, 0) + 1

    def user_code_for(self, index: int, code: Any, pickled: Optional[bytes] = None) -> Tuple[Any, int]:
        """How to send ``code`` (a function) to worker ``index``: ``(code or its pickle, preloads)``.

        While preloads were sent to that worker, the function travels pickled and the worker
        unpickles it once they finished (``preloads`` is how many), so that unpickling never
        races an import. For code that calls worker methods itself; :meth:`execute` does it.
        """
        n = self._preloads.get(self.workers[index]._actor_id, 0)
        if not n:
            return code, 0
        if pickled is None:
            import ray.cloudpickle as cloudpickle

            pickled = cloudpickle.dumps(code)
        return pickled, n

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        """The Python stack of every thread of every worker, in rank order (see
        :meth:`sgd.Trainer.stacks`). A worker that does not answer within ``timeout_s`` (dead,
        or its process frozen) gets a line that says so."""
        self._check_running()
        refs = [w._sgd_stacks.remote(include_idle) for w in self.workers]
        ready, _ = wait(refs, timeout=timeout_s)
        out = []
        for rank, ref in enumerate(refs):
            if ref not in ready:
                out.append(f"=== rank {rank}: no answer within {timeout_s:g} s (its process is frozen or gone) ===\n")
                continue
            try:
                out.append(ray.get(ref))
            except Exception as exc:  # dead
                out.append(f"=== rank {rank}: no stack ({type(exc).__name__}: {str(exc).splitlines()[0]}) ===\n")
        return out

    def execute_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[ray.ObjectRef]:
        """Run ``fn(*args, **kwargs)`` on every worker; object refs in rank order."""
        self._check_running()
        refs, pickled = [], None
        for i, w in enumerate(self.workers):
            code, n = self.user_code_for(i, fn, pickled)
            if n:
                pickled = code
            refs.append(w._sgd_execute.remote(code, args, kwargs, n))
        return refs

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker; results in rank order."""
        refs = self.execute_async(fn, *args, **kwargs)
        pending = list(refs)
        while pending:
            ready, pending = wait(pending, num_returns=1)
            try:
                ray.get(ready)
            except Exception:
                # The other calls get a moment to end (so that each worker ran ``fn`` once
                # whichever failed first), not forever: one may be blocked in a collective
                # the failed worker will never join. Their results are read, so that Ray
                # does not log their errors as "unhandled" later.
                done = wait(pending, timeout=EXECUTE_ERROR_GRACE_S)[0]
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception:
                        pass
                raise
        return ray.get(refs)

    def execute_single_async(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Run ``fn(*args, **kwargs)`` on worker ``index``; an object ref."""
        self._check_running()
        if not 0 <= index < len(self.workers):
            raise IndexError(f"worker index {index} out of range for {len(self.workers)} workers")
        code, n = self.user_code_for(index, fn)
        return self.workers[index]._sgd_execute.remote(code, args, kwargs, n)

    def execute_single(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on worker ``index`` and return its result."""
        return ray.get(self.execute_single_async(index, fn, *args, **kwargs))

    def preload(self, modules: Tuple[str, ...]) -> None:
        """Start importing ``modules`` on every worker in the background and return at once.

        The driver and the workers' control calls (placement, ranks) go on meanwhile; a
        function sent later with :meth:`execute` (or a training function) is unpickled on each
        worker only once the preloads sent before it finished, so that unpickling it never races
        the import (which can leave a package half-imported). An import error is left for the
        code that needs the module to report.
        """
        self._check_running()
        for w in self.workers:
            self._send_preload(w, tuple(modules))

    def __len__(self) -> int:
        return len(self.workers)

    def __getitem__(self, index: int) -> Any:
        return self.workers[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.workers))

    def __repr__(self) -> str:
        state = "running" if self.workers else "stopped"
        return f"WorkerGroup(num_workers={self.num_workers}, bundle={self.bundle}, {state})"


