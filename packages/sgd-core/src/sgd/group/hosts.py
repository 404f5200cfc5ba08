"""The health of a group's hosts, read from the cluster: lost (declared dead by Ray) and
draining (a preemption notice). Read as data; the run controller decides what to do."""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List

import ray

from sgd._common.nodes import NodeInfo, cluster_nodes
from sgd._worker.session import PreemptionInfo
from sgd.errors import WorkerDiedError
from sgd.group.status import HEALTHY, Health
from sgd.worker_group import WorkerGroup

logger = logging.getLogger("sgd")


def read_health(group: Any) -> Health:
    """One read of the cluster's nodes: a worker whose host Ray declared dead (``lost``), and
    the draining hosts the group runs on. Healthy when the cluster cannot be read now (Ray
    Client, the GCS briefly away): a death is then seen through the workers' own calls."""
    if group is None or not group.metadata:
        return HEALTHY
    try:
        nodes = cluster_nodes()
    except Exception:
        logger.debug("could not read the cluster's nodes", exc_info=True)
        return HEALTHY
    lost = None
    for i, meta in enumerate(group.metadata):
        info = nodes.get(meta.node_id)
        if info is not None and not info.alive:
            lost = WorkerDiedError(f"worker rank {i} is gone: its host {info.describe()} was declared dead by Ray", i)
            break
    ours = {m.node_id for m in group.metadata}
    draining = {n: nodes[n] for n in ours if n in nodes and nodes[n].draining}
    return Health(lost, draining)


def announce_drain(group: WorkerGroup, draining: Dict[str, NodeInfo]) -> None:
    """Tell every worker that hosts are draining, so that each shows the notice
    (``sgd.get_context().preemption``) from the same report on."""
    from ray.exceptions import RayError

    first = min(draining.values(), key=lambda n: n.drain_deadline or math.inf)
    by_node = {n: [i for i, m in enumerate(group.metadata) if m.node_id == n] for n in draining}
    info = PreemptionInfo(first.drain_deadline or math.inf, first.ip, first.node_id, by_node)
    ranks = [i for i, m in enumerate(group.metadata) if m.node_id in draining]
    left = "no deadline" if info.deadline == math.inf else f"deadline in {info.seconds_left:.0f}s"
    logger.warning("host %s is draining (%s; ranks %s): the workers leave it at the next checkpoint",
                   first.describe(), left, ranks)

    # Two steps: ask each worker how far it got (its next report waits until told), then
    # tell all the first report none of them has passed.
    def answers(refs: List[Any]) -> List[Any]:
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=30))
            except (RayError, TimeoutError):
                pass  # a dead worker: its death is handled where its poll fails
        return out

    counts = answers([w._sgd_notice.remote(info) for w in group.workers])
    start = max(counts, default=0) + 1
    answers([w._sgd_notice_from.remote(start) for w in group.workers])
