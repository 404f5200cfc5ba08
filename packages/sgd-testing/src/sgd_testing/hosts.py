"""A real multi-host Ray cluster on one machine: hosts with their own addresses and disks.

``ray.cluster_utils.Cluster`` starts every "node" in one process tree with one IP address, one
``/tmp`` and one disk, which hides whole classes of bugs (a path written on one node and read on
another, a port bound on the wrong address, a host that disappears with every process on it).
:class:`HostCluster` starts each host the way an operator does, with ``ray start --block``:

- the **head** at ``127.0.0.2`` with 0 CPUs: the driver's host (the test process runs there);
- **worker hosts** at ``127.0.0.3``, ``127.0.0.4``, ... with their own CPUs, each in its own
  session (``setsid``) and its own mount namespace (``unshare -m``) with a private ``/tmp``,
  ``/dev/shm`` and ``~/sgd_results``: nothing the driver writes there is visible to them and
  nothing they write there reaches the driver except through sgd. The interpreter, its
  environment and the checkout stay shared, also where they lie under ``/tmp``
  (:mod:`sgd_testing.host_mounts`).

Every address in ``127.0.0.0/8`` reaches this machine's loopback interface, so the hosts talk
over TCP exactly as separate machines would. A host is stopped through its own processes (its
process group, and every process in its mount namespace), never by name: other programs on the
machine may be running Ray too.

Creating mount namespaces needs root (``CAP_SYS_ADMIN``); :func:`namespaces_unavailable` says
why it cannot be done, and the ``host_cluster`` fixture skips with that reason.

Ray 2.5x and later turn token authentication on for a process once it ran a local
``ray.init()`` (or found ``~/.ray/auth_token`` at ``ray start``), and keep it across
``ray.shutdown``. Every process of the cluster and the driver must agree: they all get
``RAY_AUTH_MODE=disabled`` (a loopback-only test cluster), or ``token`` when this process's
Ray already uses it (the token file in the shared home serves every host). See docs/clusters.md.

This module holds the cluster; one host is :class:`Host` (:mod:`sgd_testing.host`), and what the
hosts share of the machine (addresses, ports, the environment, namespaces) is in
:mod:`sgd_testing.host_machine`. Every name is importable from here.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from sgd_testing.fixtures import wait_for
from sgd_testing.host import Host
from sgd_testing.host_machine import (
    CLUSTER_ENV,
    HEAD_IP,
    _port_in_use,
    _refresh_ray_config,
    free_port,
    namespaces_unavailable,
)
from sgd_testing.host_machine import _which as _which
from sgd_testing.host_mounts import shared_paths


class HostCluster:
    """A Ray cluster of a head (0 CPUs, the driver's host) and worker hosts, on one machine.

    :param num_hosts: worker hosts to start.
    :param cpus_per_host: logical CPUs each worker host declares.
    :param base_dir: where logs and the head's Ray session live (a fresh temporary folder by default).
    :param private: give worker hosts private mount namespaces (``/tmp``, ``/dev/shm``,
        ``~/sgd_results``); needs root.
    :param env: extra environment for every Ray process of the cluster.
    :param shared: more paths the worker hosts see as the driver does, besides those
        :func:`~sgd_testing.host_mounts.shared_paths` finds (the interpreter, ``sys.path``,
        editable checkouts, the working directory) when the cluster is made.

    Used as a context manager, or through the ``host_cluster`` pytest fixture::

        with HostCluster(num_hosts=2) as cluster:
            cluster.connect()                 # ray.init() from the head's address
            host = cluster.hosts[1]
            host.kill()                       # lose it at once
            cluster.restart(host)             # bring it back (a new node id)
    """

    def __init__(self, num_hosts: int = 2, cpus_per_host: int = 2, base_dir: Optional[Path] = None,
                 private: bool = True, env: Optional[Dict[str, str]] = None, head_ip: str = HEAD_IP,
                 shared: Sequence[str] = ()):
        import tempfile

        if num_hosts < 0:
            raise ValueError(f"num_hosts must be >= 0, got {num_hosts}")
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="sgdhc-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.private = private
        #: paths the worker hosts see as the driver does (mounted back where they lie in a private folder)
        self.shared = shared_paths(shared) if private else []
        self.env = dict(env or {})
        self.head_ip = head_ip
        self.gcs_port = free_port(head_ip)
        self.head = Host(self, head_ip, 0, None, private=False, head=True)
        self.hosts: List[Host] = []
        self._num_hosts = num_hosts
        self._cpus_per_host = cpus_per_host
        self._next_ip = int(head_ip.rsplit(".", 1)[1]) + 1
        self._gcs: Any = None
        self._saved_env: Dict[str, Optional[str]] = {}
        self._auth_mode: Optional[str] = None

    def auth_env(self) -> Dict[str, str]:
        """The auth mode every process of the cluster uses: the one this process's Ray already
        uses when a ``ray.init()`` here turned token authentication on (Ray keeps it across
        ``ray.shutdown``; the token file in the shared home serves every host), else disabled."""
        if self._auth_mode is None:
            self._auth_mode = "disabled"
            with contextlib.suppress(Exception):
                from ray._private.authentication.authentication_utils import is_token_auth_enabled

                if is_token_auth_enabled():
                    self._auth_mode = "token"
        return {"RAY_AUTH_MODE": self._auth_mode}

    @property
    def address(self) -> str:
        """The head's GCS address, ``ip:port`` (what ``ray.init(address=...)`` and ``RAY_ADDRESS`` take)."""
        return f"{self.head_ip}:{self.gcs_port}"

    def __enter__(self) -> HostCluster:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def start(self) -> None:
        """Start the head, then the worker hosts, each waited for until the head sees it alive."""
        if _port_in_use(self.head_ip, self.gcs_port):
            raise RuntimeError(f"port {self.gcs_port} on {self.head_ip} is in use; pick another cluster address")
        if self.private:
            why = namespaces_unavailable()
            if why:
                raise RuntimeError(why)
        try:
            self.head.start()
            for _ in range(self._num_hosts):
                self.add_host(self._cpus_per_host)
        except BaseException:
            self.shutdown()
            raise

    def add_host(self, num_cpus: int = 2, resources: Optional[Dict[str, float]] = None) -> Host:
        """Start one more worker host at the next free address."""
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        host = Host(self, ip, num_cpus, resources, private=self.private, head=False)
        self.hosts.append(host)
        host.start()
        return host

    def restart(self, host: Host) -> Host:
        """Bring a lost (or stopped) host back at the same address, with a fresh disk."""
        if host.alive:
            raise RuntimeError(f"host {host.ip} is still running")
        if host.proc is not None and host.pids():
            host.kill()  # killed without waiting: make sure nothing of it is left
        host.start()
        self.wait_for_resources()
        return host

    def heal(self) -> None:
        """Every worker host up and not draining: a lost host is started again, a draining one
        is stopped and started afresh (Ray has no way to undo a drain). Waits until Ray has
        declared the old nodes dead, so no test sees a node that is going."""
        old = []
        for host in self.hosts:
            if host.alive and host.drained:
                host.kill()
            if not host.alive:
                if host.node_id:
                    old.append(host.node_id)
                host.start()
        if old:
            wait_for(lambda: not set(old) & set(self.node_ids()), timeout=60,
                     message=f"Ray did not declare the lost nodes {old} dead")
        self.wait_for_resources(free=True)

    def nodes(self) -> List[Dict[str, Any]]:
        """The head's view of the nodes (one GCS call): node id, address, alive, resources."""
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        if self._gcs is None:
            self._gcs = GcsClient(address=self.address)
        out = []
        for node_id, info in self._gcs.get_all_node_info(timeout=10).items():
            out.append({"node_id": node_id.hex(), "ip": info.node_manager_address,
                        "alive": info.state == 0, "resources": dict(info.resources_total)})
        return out

    def node_ids(self, alive_only: bool = True) -> List[str]:
        return [n["node_id"] for n in self.nodes() if n["alive"] or not alive_only]

    def connect(self, **init_kwargs: Any) -> Any:
        """``ray.init`` this process as a driver on the head host."""
        import ray

        # Set, not defaulted: the driver and the hosts must agree on the auth mode (a driver
        # with token auth cannot be called back by workers of hosts without it: their actors
        # are cancelled before they start).
        for key, value in {**CLUSTER_ENV, **self.auth_env()}.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        _refresh_ray_config()
        from sgd_testing.fixtures import shutdown_ray

        shutdown_ray()
        init_kwargs.setdefault("log_to_driver", True)
        context = ray.init(address=self.address, _node_ip_address=self.head_ip, **init_kwargs)
        self.wait_for_resources()
        return context

    def wait_for_resources(self, timeout: float = 60, free: bool = False) -> None:
        """Wait until the connected driver's view of free resources has every live host (a host
        is alive for the GCS a moment before its resources are reported); with ``free``, until
        all of their CPUs are free (what an earlier test held is released)."""
        import ray
        from ray._private.state import available_resources_per_node

        if not ray.is_initialized():
            return
        want = {h.node_id: h.num_cpus for h in self.hosts if h.alive}

        def ready() -> bool:
            view = available_resources_per_node()
            return all(n in view and (not free or view[n].get("CPU", 0) >= cpus) for n, cpus in want.items())

        hosts = sorted(str(n) for n in want)
        wait_for(ready, timeout=timeout, message=f"the resources of hosts {hosts} did not show up"
                 + (" free" if free else ""))

    def shutdown(self) -> None:
        """Stop every host (the worker hosts together, then the head), whatever state each is
        in. A host gets 5 s to stop its node gently (its workers write what they hold) and is
        then killed: one at a time with a longer grace, a module's teardown took 24 s."""
        for group in (self.hosts, [self.head]):
            for host in group:
                with contextlib.suppress(Exception):
                    host.signal_stop()
            deadline = time.monotonic() + 5.0
            for host in group:
                with contextlib.suppress(Exception):
                    host.finish_stop(deadline)
        for key, value in self._saved_env.items():  # the driver's environment as connect() found it
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self._saved_env:
            self._saved_env.clear()
            _refresh_ray_config()
        if self._own_dir and not self.head.alive and not any(h.alive for h in self.hosts):
            import shutil

            shutil.rmtree(self.base_dir, ignore_errors=True)


@contextlib.contextmanager
def host_cluster_for_test(num_hosts: int = 2, cpus_per_host: int = 2, **kwargs: Any) -> Iterator[HostCluster]:
    """A connected :class:`HostCluster` for one test (or module): the session's local cluster
    is shut down first (a driver is connected to one cluster at a time) and this one after."""
    from sgd_testing.fixtures import shutdown_ray

    shutdown_ray()
    cluster = HostCluster(num_hosts=num_hosts, cpus_per_host=cpus_per_host, **kwargs)
    cluster.start()
    try:
        cluster.connect()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            shutdown_ray()
        cluster.shutdown()
