"""Elastic sizing: how many workers to start now, within ``num_workers=(min, max)``."""

from __future__ import annotations

from typing import Dict, Optional


def placeable_workers(
    bundle: Dict[str, float], min_workers: int, max_workers: int, ours: Optional[Dict[str, int]] = None
) -> int:
    """How many workers of ``bundle`` fit in the cluster now, clamped to ``[min_workers, max_workers]``
    (placement then waits for ``min_workers`` if fewer fit).

    :param ours: node id → workers of ours reserved there, about to be released; they count as free.
    """
    from ray._private.state import available_resources_per_node

    need = {k: v for k, v in bundle.items() if v > 0}
    ours = ours or {}
    fit = 0
    for node_id, avail in available_resources_per_node().items():
        held = ours.get(node_id, 0)
        fit += min((int((avail.get(k, 0) + v * held + 1e-9) // v) for k, v in need.items()), default=0)
    return max(min_workers, min(max_workers, fit))
