"""Horovod host discovery on Ray: which hosts an elastic job may use, and how many workers each takes.

:class:`RayHostDiscovery` is Horovod's ``RayHostDiscovery`` (``horovod.ray.elastic``); a user's
own discovery (anything with ``find_available_hosts_and_slots()``) works too, checked by
:class:`_CheckedDiscovery`. :func:`node_for_host` maps a discovered host name to its Ray node.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import ray


def _number(value: Any, name: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value



class RayHostDiscovery:
    """Horovod host discovery from the Ray cluster: every alive node is a host, with as many
    slots as its total resources hold workers (Horovod's ``RayHostDiscovery``; it assumes the
    whole cluster is there for the job).

    Hosts are named by Ray node id, which is unique even for several Ray nodes on one machine
    (Horovod names them by IP). Accepts both Horovod spellings of the sizes: ``cpus_per_slot`` /
    ``gpus_per_slot`` (``horovod.ray.elastic``) and ``cpus_per_worker`` / ``gpus_per_worker``
    (``horovod.ray.elastic_v2``).

    :param use_gpu: count GPU slots too (a host's slots are the smaller of CPU and GPU slots).
    :param cpus_per_slot: CPUs one worker reserves.
    :param gpus_per_slot: GPUs one worker reserves when ``use_gpu``.
    """

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: float = 1, *,
                 cpus_per_worker: Optional[float] = None, gpus_per_worker: Optional[float] = None):
        self.use_gpu = bool(use_gpu)
        self.cpus_per_slot = _number(cpus_per_slot if cpus_per_worker is None else cpus_per_worker,
                                     "cpus_per_slot (cpus_per_worker)")
        gpus = gpus_per_slot if gpus_per_worker is None else gpus_per_worker
        self.gpus_per_slot = _number(1 if gpus is None else gpus, "gpus_per_slot (gpus_per_worker)",
                                     positive=self.use_gpu)
        if not self.cpus_per_slot and not self.use_gpu:
            raise ValueError("a worker must reserve some CPUs (cpus_per_slot > 0) or GPUs (use_gpu=True)")

    # Horovod's v2 names for the same numbers.
    @property
    def cpus_per_worker(self) -> float:
        return self.cpus_per_slot

    @property
    def gpus_per_worker(self) -> float:
        return self.gpus_per_slot

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        """``{host: slots}`` for every alive Ray node with room for at least one worker."""
        mapping: Dict[str, int] = {}
        for node in ray.nodes():
            if not node.get("Alive", node.get("alive")):
                continue
            resources = node.get("Resources", {})
            counts = []
            if self.cpus_per_slot:
                counts.append(resources.get("CPU", 0) // self.cpus_per_slot)
            if self.use_gpu:
                counts.append(resources.get("GPU", 0) // self.gpus_per_slot)
            slots = int(math.ceil(min(counts)))
            if slots > 0:
                mapping[node.get("NodeID") or node["NodeManagerAddress"]] = slots
        return mapping


def node_for_host(host: str) -> str:
    """The Ray node id of a discovered host: ``host`` may be a node id, a node's IP or host
    name, or a custom resource ``node:<host>`` that one node declares (how Horovod's own tests
    name hosts). The first alive node that matches.

    :raises ValueError: no alive node matches.
    """
    nodes = [n for n in ray.nodes() if n.get("Alive", n.get("alive"))]
    for match in (
        lambda n: n.get("NodeID") == host,
        lambda n: f"node:{host}" in n.get("Resources", {}),
        lambda n: host in (n.get("NodeManagerAddress"), n.get("NodeManagerHostname")),
    ):
        for node in nodes:
            if match(node):
                return str(node["NodeID"])
    raise ValueError(
        f"the host discovery reported host {host!r}, which names no alive Ray node. Report hosts as Ray node "
        f"ids, node IPs or host names, or start the node with a resource 'node:{host}' "
        f"(ray start --resources='{{\"node:{host}\": 1}}')"
    )


class _CheckedDiscovery:
    """Wraps the user's discovery: checks what it returns and keeps its first error, so that a
    broken discovery is reported as itself rather than as "the job has been shut down"."""

    def __init__(self, discovery: Any):
        self.discovery = discovery
        self.error: Optional[BaseException] = None

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        try:
            hosts = self.discovery.find_available_hosts_and_slots()
            if not isinstance(hosts, dict) or not all(
                    isinstance(h, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
                    for h, n in hosts.items()):
                raise TypeError(
                    f"{type(self.discovery).__name__}.find_available_hosts_and_slots() must return a dict of "
                    f"host name to slot count (int >= 0), got {hosts!r}"
                )
            return hosts
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise
