"""How a worker's session reaches the driver's disk: the run directory, its checkpoint folder.

A worker on the driver's host shares its disk; a worker on a host of its own reaches it through
the run's file server (:mod:`sgd._worker.driver_files`): its checkpoints too
(:mod:`sgd.storage.staging`).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from sgd._worker.context import WorkerContext
from sgd._worker.driver_files import DriverFiles

_NODE_ID: Optional[str] = None


def _own_node_id() -> str:
    """The Ray node this worker process runs on (asked once: a process does not move)."""
    global _NODE_ID
    if _NODE_ID is None:
        import ray

        _NODE_ID = ray.get_runtime_context().get_node_id()
    return _NODE_ID


class _DriverDisk:
    """The driver's-disk part of :class:`sgd._worker.session.Session` (a mixin: it sets ``context``)."""

    context: WorkerContext

    @property
    def shares_driver_disk(self) -> bool:
        """Whether this worker runs on the driver's host, and so sees the run directory (and
        every path the driver passes) on its own disk. Workers elsewhere reach the driver's
        disk through :attr:`driver_files`."""
        if self.context.driver_node_id is None:
            return True  # not started by a trainer (tests, local use): one host
        return _own_node_id() == self.context.driver_node_id

    @property
    def driver_files(self) -> Any:
        """A :class:`sgd._worker.driver_files.DriverFiles` for a worker on another host than the
        driver's: ``upload(local, driver_path)`` into the run directory, ``read(driver_path,
        offset, length)`` of the run directory or the checkpoint the run started from."""
        server = self.context.driver_files
        if server is None:
            raise RuntimeError("this run has no file server on the driver's host (its workers share the driver's "
                               "disk, or it has no run directory)")
        return DriverFiles(server, self.context.driver_files_told)

    @property
    def checkpoint_dir(self) -> Optional[str]:
        """The run's checkpoint folder (``run_dir/checkpoints``) as the driver sees it, or
        ``None`` when the run has no directory. A worker on another host reaches it through
        :attr:`driver_files`."""
        target = getattr(self, "checkpoint_target", None)
        if target is not None:
            return str(target.directory)
        run_dir = self.context.get_trial_dir()
        return os.path.join(run_dir, "checkpoints") if run_dir else None
