"""Placing a worker group: placement-group timeouts, the wait for a placement (logging what
fits where while it waits), and the clear error when the cluster cannot hold the group.
:class:`sgd.WorkerGroup` reserves its bundles and calls :func:`wait_for_placement`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Collection, Dict, Optional

import ray
from ray.util.placement_group import PlacementGroup

from sgd._common.scaling import fit_per_node
from sgd._common.waits import wait
from sgd.errors import ResourcesUnavailableError

logger = logging.getLogger("sgd")

#: Ray placement-group strategies a worker group may use.
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


#: Ray Train 2.60's name of ``SGD_PLACEMENT_TIMEOUT_S`` (how long its worker group may take to
#: start), read when sgd's is not set.
RAY_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


def placement_timeout_s() -> float:
    """Seconds to wait for resources that the cluster has but are in use (``SGD_PLACEMENT_TIMEOUT_S``,
    else Ray Train's ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``, else 120).

    :raises ValueError: the variable is not a number of seconds (the message names it).
    """
    for name in ("SGD_PLACEMENT_TIMEOUT_S", RAY_START_TIMEOUT_ENV):
        value = os.environ.get(name)
        if value:
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    return 120.0


def infeasible_timeout_s() -> float:
    """Seconds to wait for resources the cluster does not have at all, in case nodes are
    joining (``SGD_INFEASIBLE_TIMEOUT_S``)."""
    return float(os.environ.get("SGD_INFEASIBLE_TIMEOUT_S", "10"))


def wait_for_placement(pg: PlacementGroup, bundle: Dict[str, float], count: int, owned: bool,
                       avoid: Collection[str] = (), timeout_s: Optional[float] = None) -> None:
    """Wait for ``pg`` (``count`` bundles of ``bundle``) to be placed, logging every 5 s what
    fits where; ``owned``: a group this worker group made (else the caller's, or a trial's).

    :raises ResourcesUnavailableError: not placed within ``timeout_s`` (default: the
        placement timeout when the cluster could hold it, else the infeasible timeout).
    """
    feasible, why = _feasible(bundle, count, avoid) if owned else (True, "")
    timeout = timeout_s
    if timeout is None:
        timeout = placement_timeout_s() if feasible else infeasible_timeout_s()
    deadline = time.monotonic() + timeout
    ready = pg.ready()
    while True:  # what fits where is logged every 5 s; Ctrl-C is handled within a wait slice
        done, _ = wait([ready], timeout=min(5.0, max(0.0, deadline - time.monotonic())))
        if done:
            return
        if time.monotonic() >= deadline:
            break
        logger.warning("waiting for resources for %d workers of %s; %s", count, bundle,
                       capacity_summary(bundle, avoid))
    if not owned:
        raise ResourcesUnavailableError(
            f"the placement group passed as placement_group= was not ready within {timeout:.0f}s; "
            "check that the cluster can hold its bundles (ray.util.placement_group_table())."
        )
    feasible, why = _feasible(bundle, count, avoid)
    raise ResourcesUnavailableError(
        f"could not place {count} workers of {bundle} within {timeout:.0f}s: "
        + (why if not feasible else "the resources exist but are in use by other work")
        + f" ({capacity_summary(bundle, avoid)})"
        + ". Ask for fewer workers or resources per worker, or add nodes to the cluster."
    )


def capacity_summary(bundle: Dict[str, float], avoid: Collection[str] = ()) -> str:
    """Where workers of ``bundle`` could go now: per alive host, how many fit in its free
    resources; hosts being avoided (lost or draining) and dead ones are named as such."""

    fits = fit_per_node(bundle)
    parts, unusable = [], []
    for node in ray.nodes():
        node_id, ip = node.get("NodeID", ""), node.get("NodeManagerAddress", "?")
        if not node.get("Alive"):
            continue
        if node_id in avoid:
            unusable.append(f"{ip} (lost or draining)")
            continue
        fit = fits.get(node_id, 0)
        if node.get("Resources", {}).get("CPU", 0) or fit:
            parts.append(f"{ip}: {fit}")
    text = "workers that fit now, per host: " + (", ".join(parts) if parts else "none")
    if unusable:
        text += "; not used: " + ", ".join(unusable)
    return text


def _feasible(bundle: Dict[str, float], n: int, avoid: Collection[str] = ()) -> tuple[bool, str]:
    """Whether the cluster as it is now could ever hold ``n`` bundles (ignoring current use)."""
    nodes = [node for node in ray.nodes() if node.get("Alive") and node.get("NodeID") not in avoid]
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
