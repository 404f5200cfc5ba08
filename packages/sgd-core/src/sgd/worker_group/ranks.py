"""Ranks of a worker group's workers: who is world rank 0, 1, ...; local and node ranks.

When a group starts, workers on one node get consecutive ranks and rank 0 is on the driver's node
when a worker runs there; when it is resized or re-formed, the workers keep the order they are in.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Sequence, Tuple

from sgd._worker.actor import WorkerMetadata
from sgd._worker.session import WorkerContext


def contexts_in_order(metadata: Sequence[WorkerMetadata]) -> List[WorkerContext]:
    """Contexts for workers kept in this exact index order (ranks follow the indices)."""
    nodes: Dict[str, int] = {}
    per_node: Dict[str, int] = {}
    for m in metadata:
        nodes.setdefault(m.node_id, len(nodes))
        per_node[m.node_id] = per_node.get(m.node_id, 0) + 1
    seen: Dict[str, int] = {}
    contexts = []
    for i, m in enumerate(metadata):
        contexts.append(WorkerContext(world_rank=i, local_rank=seen.get(m.node_id, 0), world_size=len(metadata),
                                      node_rank=nodes[m.node_id], local_world_size=per_node[m.node_id]))
        seen[m.node_id] = seen.get(m.node_id, 0) + 1
    return contexts


def rank_order(metadata: Sequence[WorkerMetadata], driver_node: str) -> Tuple[List[int], List[WorkerContext]]:
    """The workers' indices in world-rank order, by node (the driver's first), and their contexts."""
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
                    world_size=len(metadata),
                    node_rank=node_rank,
                    local_world_size=len(indices),
                )
            )
    return order, contexts
