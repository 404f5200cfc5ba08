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
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from sgd_testing.fixtures import wait_for
from sgd_testing.host_mounts import in_private_namespace, shared_paths

#: The head's address (the driver's host).
HEAD_IP = "127.0.0.2"
#: Environment every process of the cluster gets (and the driver, through :meth:`HostCluster.connect`).
CLUSTER_ENV = {
    "RAY_AUTH_MODE": "disabled",
    # A lost host is declared dead by the GCS after health_check_failure_threshold missed
    # checks; Ray's defaults (period 3 s, threshold 5) stand, so tests see Ray's real timing.
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
}


def namespaces_unavailable() -> Optional[str]:
    """Why worker hosts cannot get private mount namespaces here (``None`` when they can)."""
    if sys.platform != "linux":
        return f"private mount namespaces need Linux (this is {sys.platform})"
    for tool in ("unshare", "setsid", "mount"):
        if not _which(tool):
            return f"the '{tool}' command is missing (util-linux)"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs sgdprobe /mnt"],
        capture_output=True, text=True,
    )
    if probe.returncode != 0:
        return ("cannot create a private mount namespace with a tmpfs (unshare -m needs root or "
                f"CAP_SYS_ADMIN): {probe.stderr.strip() or probe.returncode}")
    return None


def _which(tool: str) -> Optional[str]:
    import shutil

    return shutil.which(tool)


def free_port(ip: str) -> int:
    """A TCP port free on ``ip`` now."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _port_in_use(ip: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return True
    return False


class Host:
    """One host of a :class:`HostCluster`: a ``ray start --block`` process group."""

    def __init__(self, cluster: HostCluster, ip: str, num_cpus: int, resources: Optional[Dict[str, float]],
                 private: bool, head: bool):
        self.cluster = cluster
        self.ip = ip
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.private = private
        self.head = head
        self.proc: Optional[subprocess.Popen] = None
        #: the Ray node id of the current incarnation (a restarted host gets a new one).
        self.node_id: Optional[str] = None
        self.log_path = cluster.base_dir / f"host-{ip}.log"
        #: whether :meth:`drain` was called on this incarnation (Ray cannot undo a drain).
        self.drained = False
        self._mnt_ns: Optional[str] = None

    def __repr__(self) -> str:
        state = "up" if self.alive else "down"
        return f"Host({self.ip}, cpus={self.num_cpus}, {'head' if self.head else 'worker'}, {state})"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- start and stop ------------------------------------------------------------------

    def _command(self) -> List[str]:
        ray = str(Path(sys.executable).with_name("ray"))
        args = [ray, "start", "--block", f"--node-ip-address={self.ip}", f"--num-cpus={self.num_cpus}",
                "--num-gpus=0", "--disable-usage-stats"]
        if self.resources:
            import json

            args.append(f"--resources={json.dumps(self.resources)}")
        if self.head:
            args += ["--head", f"--port={self.cluster.gcs_port}", "--include-dashboard=false",
                     f"--temp-dir={self.cluster.base_dir / 'ray'}",
                     f"--ray-client-server-port={free_port(self.ip)}"]
        else:
            args.append(f"--address={self.cluster.address}")
        return args

    def start(self) -> None:
        """Start the host (again) and wait until the head sees it alive."""
        if self.alive:
            raise RuntimeError(f"host {self.ip} is already running")
        before = set(self.cluster.node_ids(alive_only=False)) if not self.head else set()
        self.drained = False
        cmd = self._command()
        if self.private:
            # A private /tmp, /dev/shm and results directory: this host's disk is its own, with
            # the interpreter, its environment and the code shared (sgd_testing.host_mounts).
            results = Path.home() / "sgd_results"
            results.mkdir(parents=True, exist_ok=True)
            cmd = in_private_namespace(cmd, ("/tmp", "/dev/shm", str(results)), self.cluster.shared,
                                       stage=str(self.cluster.base_dir / f"mounts-{self.ip}"), label=f"sgd-{self.ip}")
        env = {**os.environ, **CLUSTER_ENV, **self.cluster.auth_env(), **self.cluster.env}
        env.pop("RAY_ADDRESS", None)
        log = open(self.log_path, "ab")
        try:
            # Its own session: the host's processes are one process group, stopped as one.
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, cwd=str(self.cluster.base_dir))
        finally:
            log.close()
        if self.private:
            self._mnt_ns = wait_for(self._namespace, timeout=10, message=f"host {self.ip}'s namespace")
        if self.head:
            wait_for(lambda: self._reachable(self.cluster.gcs_port) or self._check_exited(), timeout=60,
                     message=f"head {self.ip}:{self.cluster.gcs_port} did not start; see {self.log_path}")
        self.node_id = wait_for(lambda: self._new_node(before) or self._check_exited(), timeout=90,
                                message=f"host {self.ip} did not join the cluster; see {self.log_path}")

    def _namespace(self) -> Optional[str]:
        """The mount namespace of the host's ray process, once unshare has exec'd into it."""
        self._check_exited()
        assert self.proc is not None
        with contextlib.suppress(OSError):
            ns = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
            if ns != os.readlink("/proc/self/ns/mnt"):
                return ns
        return None

    def _check_exited(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise RuntimeError(f"host {self.ip}: 'ray start' exited with {self.proc.returncode}:\n{tail}")
        return False

    def _reachable(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((self.ip, port)) == 0

    def _new_node(self, before: set) -> Optional[str]:
        for node in self.cluster.nodes():
            if node["alive"] and node["ip"] == self.ip and node["node_id"] not in before:
                return str(node["node_id"])
        return None

    def pids(self) -> List[int]:
        """Every process of this host: its process group and, for a worker host, every process
        in its mount namespace (a process that left the group is still on the host)."""
        if self.proc is None:
            return []
        pgid = self.proc.pid
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                if os.getpgid(pid) == pgid or (self._mnt_ns and os.readlink(f"/proc/{pid}/ns/mnt") == self._mnt_ns):
                    found.append(pid)
            except (OSError, ProcessLookupError):
                continue
        return found

    def kill(self, wait: bool = True) -> float:
        """Lose the host at once: SIGKILL every process on it, as when a machine loses power.

        :param wait: return only once every process of the host is gone (reaped); ``False``
            returns once each was signalled (a benchmark timing what follows the kill).
        :returns: ``time.time()`` when the signal was sent.
        """
        if self.proc is None:
            raise RuntimeError(f"host {self.ip} was never started")
        at = time.time()
        for _ in range(3):  # a process forked while we were signalling gets the next pass
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not wait:
                return at
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        wait_for(lambda: not self.pids(), timeout=10, message=f"processes of host {self.ip} survived SIGKILL")
        return at

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the host gently (SIGTERM to ``ray start --block``, which stops its node), then
        make sure nothing of it is left."""
        self.signal_stop()
        self.finish_stop(time.monotonic() + timeout)

    def signal_stop(self) -> None:
        """The first half of :meth:`stop`: ask the host to stop, without waiting."""
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def finish_stop(self, deadline: float) -> None:
        """The second half of :meth:`stop`: wait until ``deadline`` (``time.monotonic()``) for
        the host to stop, then kill what is left of it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if self.proc is not None and self.pids():
            self.kill()

    def drain(self, reason: str = "preemption", deadline_s: float = 30.0, message: str = "sgd test") -> None:
        """Tell Ray this host is going away (``ray drain-node``), as a cloud preemption notice
        or KubeRay's scale-down does: reason ``preemption`` (Ray's ``DRAIN_NODE_REASON_PREEMPTION``)
        or ``idle-termination``, with a deadline ``deadline_s`` seconds from now."""
        if self.node_id is None:
            raise RuntimeError(f"host {self.ip} has no node id (not started)")
        reasons = {"preemption": "DRAIN_NODE_REASON_PREEMPTION",
                   "idle-termination": "DRAIN_NODE_REASON_IDLE_TERMINATION"}
        if reason not in reasons:
            raise ValueError(f"reason must be one of {sorted(reasons)}, got {reason!r}")
        ray = str(Path(sys.executable).with_name("ray"))
        env = {**os.environ, **CLUSTER_ENV, **self.cluster.auth_env(), **self.cluster.env}
        proc = subprocess.run(
            [ray, "drain-node", f"--address={self.cluster.address}", f"--node-id={self.node_id}",
             f"--reason={reasons[reason]}", f"--reason-message={message}",
             f"--deadline-remaining-seconds={int(deadline_s)}"],
            capture_output=True, text=True, env=env, timeout=60,
        )
        self.drained = proc.returncode == 0
        if proc.returncode != 0:
            raise RuntimeError(f"ray drain-node {self.ip} failed ({proc.returncode}): "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")


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
        if ray.is_initialized():
            ray.shutdown()
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


def _refresh_ray_config() -> None:
    """Make this process's Ray read its settings (the auth mode) from the environment again:
    Ray caches them at the first ``ray.init`` and keeps them across ``ray.shutdown``."""
    with contextlib.suppress(Exception):
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")


@contextlib.contextmanager
def host_cluster_for_test(num_hosts: int = 2, cpus_per_host: int = 2, **kwargs: Any) -> Iterator[HostCluster]:
    """A connected :class:`HostCluster` for one test (or module): the session's local cluster
    is shut down first (a driver is connected to one cluster at a time) and this one after."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    cluster = HostCluster(num_hosts=num_hosts, cpus_per_host=cpus_per_host, **kwargs)
    cluster.start()
    try:
        cluster.connect()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()
