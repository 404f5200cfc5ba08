"""The machine every host of a :class:`~sgd_testing.hosts.HostCluster` shares.

The loopback addresses and ports the hosts listen on, the environment every Ray process of the
cluster gets (the auth mode, which the driver and every host must agree on), and whether this
machine can give a worker host a private mount namespace. Public as names of
:mod:`sgd_testing.hosts`.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from typing import Optional

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


def _refresh_ray_config() -> None:
    """Make this process's Ray read its settings (the auth mode) from the environment again:
    Ray caches them at the first ``ray.init`` and keeps them across ``ray.shutdown``."""
    with contextlib.suppress(Exception):
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
