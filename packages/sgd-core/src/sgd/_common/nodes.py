"""The cluster's hosts as the driver sees them: alive, lost, draining.

Ray's control store (GCS) declares a host dead only after it missed several health checks
(about 15 s with Ray's defaults, measured in docs/clusters.md). sgd does not wait for that:
when a worker dies, :meth:`NodeWatch.lost` asks the GCS *and* knocks on the raylet of each host
the group used (a TCP connect to its node-manager port). A host whose raylet does not answer
is lost now; sgd places the next group elsewhere (a placement group that avoids it) while Ray
still counts its CPUs as free.

Draining hosts (``ray drain-node``, a cloud preemption notice, KubeRay's scale-down) come from
the same store, with their deadline.

Every check is one or two GCS calls however many workers there are, plus one connect per host
the group used, in parallel: the driver's work per check grows with hosts, never with rounds.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Set

logger = logging.getLogger("sgd")

#: How long a raylet may take to accept a TCP connection before its host counts as lost.
PROBE_TIMEOUT_S = float(os.environ.get("SGD_NODE_PROBE_TIMEOUT_S", "1.0"))
#: How often a running job asks the GCS whether one of its hosts died or is draining.
NODE_CHECK_INTERVAL_S = float(os.environ.get("SGD_NODE_CHECK_INTERVAL_S", "1.0"))


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node (host) as the GCS reports it."""

    node_id: str
    ip: str
    alive: bool
    #: the raylet's port (probed to tell a lost host before the GCS declares it dead).
    port: int
    #: when the node is draining: its deadline (``time.time()`` seconds; ``math.inf`` when
    #: the drain request gave none); ``None`` when it is not draining.
    drain_deadline: Optional[float] = None

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None

    def describe(self) -> str:
        return f"{self.ip} (node {self.node_id[:8]})"


def _gcs() -> object:
    import ray

    return getattr(ray._private.worker.global_worker, "gcs_client", None)


def cluster_nodes() -> Dict[str, NodeInfo]:
    """Every node the GCS knows, alive or dead, with drain deadlines (two GCS calls)."""
    gcs = _gcs()
    if gcs is None:
        return {}
    infos = gcs.get_all_node_info(timeout=10)  # type: ignore[attr-defined]
    try:
        draining = {str(k): int(v) for k, v in gcs.get_draining_nodes(timeout=10).items()}  # type: ignore[attr-defined]
    except Exception:  # an older GCS: no drain information
        logger.debug("could not read draining nodes from the GCS", exc_info=True)
        draining = {}
    out: Dict[str, NodeInfo] = {}
    for node_id, info in infos.items():
        hex_id = node_id.hex()
        deadline_ms = draining.get(hex_id)
        deadline = None if deadline_ms is None else (deadline_ms / 1000.0 if deadline_ms > 0 else math.inf)
        out[hex_id] = NodeInfo(hex_id, info.node_manager_address, info.state == 0, int(info.node_manager_port),
                               deadline)
    return out


def raylet_answers(node: NodeInfo, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the node's raylet accepts a TCP connection within ``timeout`` seconds."""
    try:
        with socket.create_connection((node.ip, node.port), timeout=timeout):
            return True
    except OSError:
        return False


class NodeWatch:
    """Which hosts a group must not be placed on, and which of a group's hosts are gone.

    Remembers hosts found lost until the GCS declares them dead (after that Ray itself no
    longer offers their resources).
    """

    def __init__(self) -> None:
        #: node id → (address, when it was found lost)
        self._lost: Dict[str, tuple] = {}

    def lost(self, node_ids: Iterable[str], nodes: Optional[Dict[str, NodeInfo]] = None) -> Dict[str, NodeInfo]:
        """The nodes among ``node_ids`` that are gone: dead for the GCS, or whose raylet does
        not answer. One GCS call and one parallel round of connects."""
        wanted = set(node_ids)
        if not wanted:
            return {}
        if nodes is None:
            try:
                nodes = cluster_nodes()
            except Exception:  # without the GCS's view, no host is known to be lost
                logger.debug("could not read the cluster's nodes", exc_info=True)
                return {}
        gone: Dict[str, NodeInfo] = {}
        probe = []
        for node_id in wanted:
            info = nodes.get(node_id)
            if info is None:
                continue
            if not info.alive:
                gone[node_id] = info
            else:
                probe.append(info)
        if probe:
            with ThreadPoolExecutor(max_workers=min(32, len(probe))) as pool:
                for info, ok in zip(probe, pool.map(raylet_answers, probe)):
                    if not ok:
                        gone[info.node_id] = info
        now = time.monotonic()
        for node_id, info in gone.items():
            if node_id not in self._lost:
                state = "declared dead by Ray" if not info.alive else "its raylet does not answer"
                logger.warning("host %s is lost (%s)", info.describe(), state)
            self._lost.setdefault(node_id, (info.ip, now))
        return gone

    def avoid(self, nodes: Optional[Dict[str, NodeInfo]] = None) -> Set[str]:
        """Node ids a new placement must avoid: hosts found lost that the GCS still lists as
        alive, and draining hosts."""
        if nodes is None:
            try:
                nodes = cluster_nodes()
            except Exception:
                logger.debug("could not read the cluster's nodes", exc_info=True)
                return set(self._lost)
        for node_id in list(self._lost):
            info = nodes.get(node_id)
            if info is None or not info.alive:
                del self._lost[node_id]  # Ray no longer offers it
        return set(self._lost) | {i for i, n in nodes.items() if n.alive and n.draining}


def avoid_selector(node_ids: Iterable[str]) -> Optional[Dict[str, str]]:
    """A Ray label selector (``ray.io/node-id``) that keeps a bundle off ``node_ids``."""
    ids = sorted(node_ids)
    if not ids:
        return None
    return {"ray.io/node-id": f"!in({','.join(ids)})"}
