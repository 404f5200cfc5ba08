"""Where a worker group's actors run: its slots of placement groups, reserved, reused, released.

A slot is ``(placement group, bundle index)`` (index ``-1``: any bundle with room). A group takes
its slots from the caller's placement group, an enclosing one (a Ray Tune trial's), or placement
groups it reserves itself and removes once no worker uses them. Slots of workers removed with
their reservation kept (a group re-formed in place, sgd.elastic) are spare: reused first when
workers are added, so that the group grows back into them.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from sgd._common.nodes import avoid_selector
from sgd._common.placement import wait_for_placement
from sgd.errors import ResourcesUnavailableError

logger = logging.getLogger("sgd")


class _Reservation:
    """The slots part of :class:`sgd.WorkerGroup` (a mixin: the group's ``__init__`` sets these)."""

    num_cpus_per_worker: float
    num_gpus_per_worker: float
    additional_resources_per_worker: Dict[str, float]
    placement_strategy: str
    _avoid_nodes: FrozenSet[str]
    _placement_timeout_s: Optional[float]
    _given_pg: Optional[PlacementGroup]
    _slots: List[Tuple[PlacementGroup, int]]
    _spare: List[Tuple[PlacementGroup, int]]
    _own_pgs: List[PlacementGroup]

    @property
    def bundle(self) -> Dict[str, float]:
        """The Ray resources one worker reserves."""
        bundle = {"CPU": self.num_cpus_per_worker, "GPU": self.num_gpus_per_worker}
        bundle.update(self.additional_resources_per_worker)
        return {k: v for k, v in bundle.items() if v > 0}

    @property
    def placement_group(self) -> Optional[PlacementGroup]:
        """The placement group the workers run in (the first one, if :meth:`add_workers` made more)."""
        return self._slots[0][0] if self._slots else None

    def _reserve(self, count: int, first: bool, node_id: Optional[str] = None) -> List[Tuple[PlacementGroup, int]]:
        """Slots for ``count`` more workers: in the caller's placement group, the enclosing one
        (a Ray Tune trial's), or a new one of ``count`` bundles that this group owns (on
        ``node_id`` when given)."""
        if node_id is not None:
            return self._reserve_on_node(count, node_id)
        if self._given_pg is not None:
            self._wait_for_placement(self._given_pg, self.bundle, count, owned=False)
            return [(self._given_pg, -1)] * count  # any bundle with room, as in Ray Train
        current = self._enclosing(count, first)
        if current is not None:
            # Running inside a reservation made for us (a Ray Tune trial asks for one bundle
            # for its own driver, then one per worker): use its last bundles, never nest.
            if first:
                offset = len(current.bundle_specs) - count
                return [(current, offset + i) for i in range(count)]
            return [(current, -1)] * count
        selector = avoid_selector(self._avoid_nodes)
        pg = placement_group([dict(self.bundle) for _ in range(count)], strategy=self.placement_strategy,
                             bundle_label_selector=[dict(selector) for _ in range(count)] if selector else None)
        self._own_pgs.append(pg)
        self._wait_for_placement(pg, self.bundle, count, owned=True)
        return [(pg, i) for i in range(count)]

    def _enclosing(self, count: int, first: bool) -> Optional[PlacementGroup]:
        """The enclosing placement group (a Ray Tune trial's) when it was made for this group: it
        has a bundle for each of the ``count`` workers besides its first, which holds the trial's
        own process (sgd-tune's trials ask for that). One with no room for them (a Ray Tune trial
        with its default resources running a trainer's ``fit()``: Ray Train 2.x's "driver
        function" pattern) is left alone, and the group reserves its own, as Ray Train does.
        Workers added later go where the first ones went."""
        current = ray.util.get_current_placement_group()
        if current is None:
            return None
        if first:
            return current if len(current.bundle_specs) > count else None
        return current if any(pg.id == current.id for pg, _ in self._slots + self._spare) else None

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
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")} - set(self._avoid_nodes)
        return [slot for slot, (state, node) in zip(self._spare, bundle_places(self._spare))
                if state == "CREATED" and node in alive]

    def _slot_nodes(self, slots: List[Tuple[PlacementGroup, int]]) -> List[str]:
        """The node of each slot's bundle (a kept group's actors are pinned there, not placed in it)."""
        nodes = []
        for (pg, index), (_, node) in zip(slots, bundle_places(slots)):
            if node is None:
                raise ResourcesUnavailableError(
                    f"bundle {index} of placement group {pg.id.hex()} is not placed on a node")
            nodes.append(node)
        return nodes

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

    def _release(self, await_freed: bool = True) -> None:
        """Remove this group's own reservations (the caller's or an enclosing one is theirs to
        remove); with ``await_freed``, return once Ray's resource view shows them free
        (:func:`_await_freed`)."""
        pgs, self._own_pgs, self._slots, self._spare = self._own_pgs, [], [], []
        if not pgs:
            return
        before = None
        if await_freed:
            try:
                before = ray.available_resources()
            except Exception:  # the cluster may already be gone
                before = None
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # the cluster may already be gone
                logger.debug("could not remove placement group", exc_info=True)
        if before is not None:
            _await_freed(pgs, before)


def bundle_places(slots: List[Tuple[PlacementGroup, int]]) -> List[Tuple[Optional[str], Optional[str]]]:
    """For each slot, its placement group's state (``"CREATED"``...) and the node its bundle is
    on (``None``: not placed, or the group's table could not be read); one table read per group."""
    from ray.util import placement_group_table

    tables: Dict[str, Dict[str, Any]] = {}
    places: List[Tuple[Optional[str], Optional[str]]] = []
    for pg, index in slots:
        key = pg.id.hex()
        if key not in tables:
            try:
                tables[key] = placement_group_table(pg)
            except Exception:  # the cluster may be going away
                tables[key] = {}
        places.append((tables[key].get("state"), tables[key].get("bundles_to_node_id", {}).get(index)))
    return places


#: How long a shutdown waits for the cluster's resource view to show its reservation freed.
FREED_WAIT_S = 2.0


def _await_freed(pgs: List[PlacementGroup], before: Dict[str, float]) -> None:
    """Wait (at most :data:`FREED_WAIT_S`) until ``ray.available_resources()`` shows the bundles of
    the placed groups among ``pgs`` free again. Ray frees them a moment after the removal (about
    0.1 s here); a caller that counts free resources right after a shutdown (an elastic group's
    next start, the next trainer's placement) would otherwise see them still taken."""
    freed: Dict[str, float] = {}
    for pg in pgs:
        if not any(pg.id.hex() in key for key in before):
            continue  # never placed: nothing to free
        for bundle in pg.bundle_specs:
            for key, value in bundle.items():
                freed[key] = freed.get(key, 0.0) + value
    if not freed:
        return
    deadline = time.monotonic() + FREED_WAIT_S
    while time.monotonic() < deadline:
        try:
            now = ray.available_resources()
        except Exception:
            return
        if all(now.get(k, 0.0) >= before.get(k, 0.0) + v - 1e-6 for k, v in freed.items()):
            return
        time.sleep(0.01)
