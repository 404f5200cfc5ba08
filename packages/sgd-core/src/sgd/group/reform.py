"""Re-forming an actor group in place (:mod:`sgd.elastic`): the survivors keep their processes.

Called by :meth:`sgd.group.actors.ActorGroup.reform` once every worker still in the group waits
at the reset barrier (a :class:`~sgd.group.status.Barrier`). In order:

1. the workers that are gone leave the group (their slots are released);
2. new workers are added where the group needs them: a fixed-size group back to its size, an
   elastic one up to its minimum (above it, it goes on smaller now and grows later);
3. when the world changed (or a collective failed), the backend's setup runs on the new group
   (sgd-torch builds its process group again: survivors in their live processes);
4. the root is the survivor with the most commits; a survivor behind it, and every new worker,
   loads the root's last commit (one object in Ray's object store, fetched by each directly);
5. the survivors go on (each told its new place, the commit count, the reports delivered and
   the last one, so nothing is sent twice); new workers start the run and join.

The survivors keep their order at the front, so rank 0 stays rank 0 while it lives.
"""

from __future__ import annotations

import logging
import time
from typing import Any, List, Optional

import ray

from sgd._worker.resets import Resume
from sgd.group.rounds import RoundCollector
from sgd.group.status import Barrier

logger = logging.getLogger("sgd")


def reform_in_place(group: Any, barrier: Barrier, iteration: int) -> None:
    """Re-form ``group`` (the :class:`~sgd.group.actors.ActorGroup` that calls this) around
    the workers at ``barrier`` (see the module docstring); raises
    what went wrong (a death while re-forming, no room for the workers needed)."""
    begun = time.monotonic()
    wg = group.worker_group
    assert wg is not None and group.backend is not None
    arrivals = barrier.arrivals
    survivors = sorted(arrivals)
    gone = sorted(barrier.gone)
    failed = barrier.failure is not None
    root_commits = max(a.commits for a in arrivals.values())
    root_old = min(i for i in survivors if arrivals[i].commits == root_commits)
    delivered = max(a.sent for a in arrivals.values())
    if gone:
        where = ", ".join(f"rank {i} ({wg.metadata[i].node_ip})" for i in gone)
        logger.warning("re-forming the group in place without %s; %d survivor(s) keep their processes",
                       where, len(survivors))
        wg._remove(gone, keep_slots=True)  # their bundles: where the group grows back
    new: List[int] = []
    if group._joining is not None:  # started to grow the group: they join now
        slots, actors, metadata = group._joining
        group._joining = None
        wg._slots += slots
        wg._set_order(wg.workers + actors, wg.metadata + metadata)
        new = list(range(len(survivors), len(wg)))
        logger.info("re-forming: %d new worker(s) join (ranks %s)", len(new), new)
    target = group.max_workers if group.min_workers == group.max_workers else max(group.min_workers, len(survivors))
    if target > len(wg):
        wg._avoid_nodes = frozenset(group.nodes.avoid())
        first = len(wg)
        wg._add(target - first)
        new += list(range(first, len(wg)))
        logger.info("re-forming: %d new worker(s) join (ranks %s)", len(new), new)
    group.num_workers = len(wg)
    changed = bool(gone) or bool(new)
    placed = time.monotonic()
    if changed or failed:
        group._setup(new)  # the initialization hook on the new workers, the backend's setup on all
        group._dirty = True  # a run is on
    set_up = time.monotonic()
    root = survivors.index(root_old)
    sync = not changed and not failed
    loaders = [r for r, i in enumerate(survivors) if r != root and (sync or arrivals[i].commits != root_commits)]
    snapshot: Optional[Any] = None
    if loaders or new:
        snapshot = wg.workers[root]._sgd_elastic_snapshot.remote()
    request = group._request
    assert request is not None
    shards: Optional[List[Any]] = group._inputs.shards(request, wg) if changed else None
    why = (f"{len(gone)} worker(s) lost" if gone else "a collective failed" if failed
           else f"{len(new)} worker(s) joined" if new else "sync")
    calls = []
    for r in range(len(survivors)):
        plan = Resume(context=wg.contexts[r] if changed else None, load=r in loaders, commits=root_commits,
                      iteration=iteration, delivered=delivered, shard=shards[r] if shards else None, reason=why)
        calls.append(wg.workers[r]._sgd_elastic_resume.remote(plan, snapshot if r in loaders else None))
    ray.get(calls)
    starts: List[Optional[Any]] = [None] * len(wg)
    if new:
        join = Resume(load=True, commits=root_commits, iteration=iteration, delivered=delivered, reason=why)
        refs = group._start_training(new, shards or [None] * len(wg), iteration, join, snapshot)
        for r, ref in zip(new, refs):
            starts[r] = ref
    collector = RoundCollector(list(wg.workers), starts=starts, lost_hosts=group.on_lost_hosts,
                               on_log=group.write_log)
    collector.elastic = True
    group._rounds = collector
    now = time.monotonic()
    logger.info("re-formed in place in %.3fs (%.3fs the group, %.3fs the backend, %.3fs the runs): %d worker(s) (%s)",
                now - begun, placed - begun, set_up - placed, now - set_up, len(wg), why)


__all__ = ["reform_in_place"]
