"""Elastic sizing: how many workers to start now, within ``num_workers=(min, max)``."""

from __future__ import annotations

from typing import Collection, Dict, Optional


def fit_per_node(
    bundle: Dict[str, float], ours: Optional[Dict[str, int]] = None, avoid: Collection[str] = ()
) -> Dict[str, int]:
    """Node id → how many workers of ``bundle`` fit in that node's free resources now.

    :param ours: node id → workers of ours reserved there, about to be released; they count as free.
    :param avoid: node ids left out (hosts found lost that Ray still lists, draining hosts).
    """
    from ray._private.state import available_resources_per_node

    need = {k: v for k, v in bundle.items() if v > 0}
    ours = ours or {}
    fits = {}
    for node_id, avail in available_resources_per_node().items():
        if node_id in avoid:
            continue
        held = ours.get(node_id, 0)
        fits[node_id] = min((int((avail.get(k, 0) + v * held + 1e-9) // v) for k, v in need.items()), default=0)
    return fits


def fitting_workers(
    bundle: Dict[str, float], ours: Optional[Dict[str, int]] = None, avoid: Collection[str] = ()
) -> int:
    """How many workers of ``bundle`` fit in the cluster's free resources now (see :func:`fit_per_node`)."""
    return sum(fit_per_node(bundle, ours, avoid).values())

