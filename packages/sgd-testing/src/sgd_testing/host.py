"""One host of a :class:`~sgd_testing.hosts.HostCluster`: a ``ray start --block`` process group.

A worker host runs in its own session (``setsid``) and, with ``private``, its own mount
namespace (:mod:`sgd_testing.host_mounts`). :class:`Host` starts it (again) and waits until the
head sees it, finds every process on it (its process group and its namespace, never by name),
and loses it at once (``kill``), stops it gently (``stop``) or drains it (``drain``). Public as
``sgd_testing.hosts.Host``, its ``__module__``.
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
from typing import TYPE_CHECKING, Dict, List, Optional

from sgd_testing.fixtures import wait_for
from sgd_testing.host_machine import CLUSTER_ENV, free_port
from sgd_testing.host_mounts import in_private_namespace

if TYPE_CHECKING:
    from sgd_testing.hosts import HostCluster


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
                    if not _is_zombie(pid):  # dead, waiting for its parent (often init) to reap it
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
            if not self._signal_all(signal.SIGKILL):
                break
            if not wait:
                return at
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        # A process forked after the last pass (a worker the raylet was starting) is signalled too.
        wait_for(lambda: not self._signal_all(signal.SIGKILL), timeout=10,
                 message=f"processes of host {self.ip} survived SIGKILL")
        return at

    def _signal_all(self, sig: int) -> List[int]:
        """Send ``sig`` to every process of the host; the ones that were there."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        return pids

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


Host.__module__ = "sgd_testing.hosts"


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and only waits to be reaped (state ``Z`` in ``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # gone meanwhile
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"Z"
