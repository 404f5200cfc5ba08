"""The pieces of a Horovod Gloo job that sgd provides instead of ``horovodrun``.

- :func:`slot_plan`: each worker's Horovod rank, local rank and cross rank, grouped by Ray node.
- :class:`RendezvousService`: Horovod's own HTTP rendezvous server (the key-value store the
  workers' Gloo contexts meet through), run in the driver process.
- :func:`choose_interfaces`: the network interface each worker's Gloo binds to.

Nothing here imports Horovod at module level; the server imports it when started.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

logger = logging.getLogger("sgd.horovod")


@dataclass(frozen=True)
class Slot:
    """One worker's place in a Horovod job (the fields of Horovod's ``SlotInfo``).

    ``hostname`` names the worker's Ray node; Horovod uses it to group local ranks
    (its rendezvous scope ``local_<hostname>``), so it must be the same string on
    every worker of one node and differ between nodes.
    """

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def env(self) -> Dict[str, str]:
        """The ``HOROVOD_*`` variables Horovod's Gloo controller reads at ``hvd.init()``."""
        return {
            "HOROVOD_HOSTNAME": self.hostname,
            "HOROVOD_RANK": str(self.rank),
            "HOROVOD_SIZE": str(self.size),
            "HOROVOD_LOCAL_RANK": str(self.local_rank),
            "HOROVOD_LOCAL_SIZE": str(self.local_size),
            "HOROVOD_CROSS_RANK": str(self.cross_rank),
            "HOROVOD_CROSS_SIZE": str(self.cross_size),
        }


def slot_plan(node_ids: Sequence[str]) -> List[Slot]:
    """Horovod slots for workers in world-rank order, given each worker's node.

    Local ranks count the workers of one node in rank order; nodes are ordered by
    their first worker. ``cross_rank`` is the node's index among the nodes that
    have a worker with the same local rank, ``cross_size`` how many such nodes
    there are (Horovod's definition, as ``horovod.runner.common.util.hosts``
    computes it for a host list).

    >>> [(s.rank, s.local_rank, s.cross_rank, s.cross_size) for s in slot_plan(["a", "a", "b"])]
    [(0, 0, 0, 2), (1, 1, 0, 1), (2, 0, 1, 2)]
    """
    if not node_ids:
        raise ValueError("a Horovod job needs at least one worker")
    by_node: Dict[str, List[int]] = {}
    for rank, node in enumerate(node_ids):
        by_node.setdefault(node, []).append(rank)
    local_sizes = {node: len(ranks) for node, ranks in by_node.items()}
    node_order = list(by_node)
    slots = []
    for rank, node in enumerate(node_ids):
        local_rank = by_node[node].index(rank)
        # Nodes that have a worker at this local rank, in node order.
        peers = [n for n in node_order if local_sizes[n] > local_rank]
        slots.append(
            Slot(
                hostname=node,
                rank=rank,
                local_rank=local_rank,
                cross_rank=peers.index(node),
                size=len(node_ids),
                local_size=local_sizes[node],
                cross_size=len(peers),
            )
        )
    return slots


class RendezvousService:
    """Horovod's HTTP rendezvous server for one worker group, in this (the driver's) process.

    The workers' ``hvd.init()`` puts and gets their Gloo addresses through it under
    the scopes ``global``, ``local_<hostname>`` and ``cross_<local rank>``; the
    server clears a scope once every member has finished with it, so repeated
    ``hvd.init()`` / ``hvd.shutdown()`` cycles meet through the same server.
    :meth:`reset` clears everything (a new plan after a restart, or leftovers of
    a rendezvous that failed half-way).
    """

    def __init__(self, verbose: int = 0):
        self.verbose = verbose
        self.port: Optional[int] = None
        self._server: Any = None

    def start(self, plan: Sequence[Slot]) -> int:
        """Start listening (all interfaces, a free port) and accept ``plan``; returns the port."""
        from sgd_horovod._horovod import require_horovod

        http_server = require_horovod("horovod.runner.http.http_server", "on the driver")
        self._server = http_server.RendezvousServer(self.verbose)
        self.port = int(self._server.start())
        self.reset(plan)
        return self.port

    def reset(self, plan: Sequence[Slot]) -> None:
        """Forget every key and expect the workers of ``plan``."""
        if self._server is None:
            raise RuntimeError("the rendezvous server is not started")
        from horovod.runner.common.util.hosts import SlotInfo

        self._server.init([SlotInfo(**asdict(slot)) for slot in plan])

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        """Stop serving and close the socket. Safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            server.stop()
            httpd = getattr(server, "_httpd", None)  # Horovod's stop() leaves the socket open
            if httpd is not None:
                httpd.server_close()
        except Exception:  # never let teardown fail on the way out
            logger.debug("stopping the Horovod rendezvous server failed", exc_info=True)


# --- network interfaces ---------------------------------------------------------------------


def network_info() -> Dict[str, Any]:
    """Run on a worker: its node's IP and its interfaces with their IPv4 addresses."""
    import socket

    import ray

    interfaces: Dict[str, List[str]] = {}
    try:
        import psutil  # a dependency of Horovod, so present wherever Horovod is

        for name, addrs in psutil.net_if_addrs().items():
            interfaces[name] = [a.address for a in addrs if a.family == socket.AF_INET]
    except ImportError:
        interfaces = {name: [] for _, name in socket.if_nameindex()}
    return {"node_ip": ray.util.get_node_ip_address(), "interfaces": interfaces}


def choose_interfaces(
    infos: Sequence[Dict[str, Any]], nics: Optional[Sequence[str]], single_node: bool
) -> List[Optional[str]]:
    """The interface each worker's Gloo should use (``HOROVOD_GLOO_IFACE``), ``None`` for
    "let Gloo pick" (it resolves the host name).

    - ``nics`` given: the first of them that the worker has; a worker with none of them is
      an error (Gloo would fail or hang much later).
    - All workers on one node: the loopback interface (as ``horovodrun`` does for local jobs).
    - Otherwise: the interface that holds the worker's Ray node IP, the address other
      nodes already reach it on.
    """
    chosen: List[Optional[str]] = []
    for rank, info in enumerate(infos):
        interfaces: Dict[str, List[str]] = info["interfaces"]
        if nics:
            found = [n for n in nics if n in interfaces]
            if not found:
                raise ValueError(
                    f"HorovodConfig(nics={list(nics)}): worker rank {rank} (node IP {info['node_ip']}) has none "
                    f"of these network interfaces; it has {sorted(interfaces)}. Pass interfaces every worker's "
                    "node has, or nics=None to pick them automatically."
                )
            chosen.append(found[0])
            continue
        wanted = "127.0.0.1" if single_node else info["node_ip"]
        match = sorted(name for name, addrs in interfaces.items() if wanted in addrs)
        if not match:
            logger.warning(
                "worker rank %d: no network interface holds %s; Gloo picks one from the host name "
                "(pass HorovodConfig(nics=...) if the workers cannot connect)", rank, wanted,
            )
        chosen.append(match[0] if match else None)
    return chosen
