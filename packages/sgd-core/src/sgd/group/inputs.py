"""What a run on actors needs besides its function: the dataset split for the group's size, the
file server on the driver's host for workers on hosts with disks of their own, and the group's
key in the driver's collective actor (``sgd.collective``).

All are made once and reused: shards for every restart of a run that can reuse them, the
file server and the collective key for every run of the group (each later run's folders are
added to the server; each run gets a new collective token).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, List, Optional, Set, Tuple

import ray

from sgd._worker.driver_files import start_server
from sgd.data import data_cpu_shortfall, shard_datasets, shards_survive_restart
from sgd.group.collective_actor import CollectiveRun, collective_actor, collective_run
from sgd.group.protocol import RunRequest
from sgd.worker_group import ResourcesUnavailableError, WorkerGroup


class RunInputs:
    """The shards of the current run and the group's file server."""

    def __init__(self) -> None:
        # (dataset, group size, its config, shards) of the current run
        self._shards: Optional[tuple] = None
        # the file server on the driver's host (once a worker runs elsewhere) and the folders
        # it serves so far ("w:" writable, "r:" readable)
        self._files: Any = None
        self._served: Set[str] = set()
        # how many times the server was told of new folders (the number of the last telling)
        self._told = 0
        # the driver's collective actor (sgd.collective), this group's key in it, its last run's token
        self._collective: Any = None
        self._collective_group = ""
        self._collective_token = 0

    def shards(self, request: RunRequest, wg: WorkerGroup) -> Optional[List[Any]]:
        """The dataset split for the group's size: made once per run and size (a restarted
        group of the same size reuses divided shards; see :meth:`restarted`)."""
        if request.dataset is None:
            return None
        n = len(wg)
        if self._shards is not None and self._shards[0] is request.dataset and self._shards[1] == n:
            return self._shards[3]
        shortfall = data_cpu_shortfall(request.dataset)
        if shortfall is not None:
            raise ResourcesUnavailableError(shortfall)
        hints = [m.node_id for m in wg.metadata]
        shards = shard_datasets(request.dataset, n, request.dataset_config, hints, list(wg.workers))
        self._shards = (request.dataset, n, request.dataset_config, shards)
        return shards

    def restarted(self) -> None:
        """The group was replaced. Ray Data's streaming split (split="coordinated") counts a dead
        consumer that had reached its epoch barrier and cannot forget it: a restarted group needs
        a new split. Divided and materialised shards are reused as they are."""
        if self._shards is not None:
            dataset, _, dataset_config, made = self._shards
            if not shards_survive_restart(dataset, dataset_config, made):
                self._shards = None

    def run_ended(self) -> None:
        self._shards = None

    def start_file_server(self, wg: WorkerGroup, driver_node: str) -> None:
        """Start the file server now if a worker runs on another host than the driver's, serving
        nothing yet: called while the group starts, so that its process is up by the first runs
        (which tell it of their folders) instead of being waited for by one of them."""
        if self._files is None and any(m.node_id != driver_node for m in wg.metadata):
            self._files = start_server(driver_node, [], [])

    def file_server(self, request: RunRequest, wg: WorkerGroup, driver_node: str) -> Tuple[Any, int]:
        """The file server on the driver's host when a worker's host is another one (a disk of
        its own): started once per group, told of new folders only when a run needs them; and
        the number of the telling the run's requests wait for (the run starts without waiting
        for it: see :mod:`sgd._worker.driver_files`)."""
        if self._files is None and all(m.node_id == driver_node for m in wg.metadata):
            return None, 0
        wanted = {*(f"w:{p}" for p in request.writable), *(f"r:{p}" for p in request.readable)}
        if self._files is None:
            self._files, self._told = start_server(driver_node, list(request.writable), list(request.readable)), 0
        elif not wanted <= self._served:
            self._told += 1
            self._files.allow.remote(list(request.writable), list(request.readable), self._told)
        self._served |= wanted
        return self._files, self._told

    def start_collective(self) -> None:
        """Take a key in the driver's collective actor, starting it if this is the driver's first
        group (not waited for: its process starts while the backend is set up)."""
        if self._collective is None:
            self._collective = collective_actor()
            self._collective_group = uuid.uuid4().hex[:16]

    def collective(self) -> Tuple[Any, CollectiveRun]:
        """The collective actor and what the next run's workers are told with it (a new token:
        see :func:`~sgd.group.collective_actor.collective_run`)."""
        self.start_collective()
        self._collective_token += 1
        return self._collective, collective_run(self._collective_group, self._collective_token)

    def shutdown(self) -> None:
        self._shards = None
        if self._collective is not None:
            actor, self._collective = self._collective, None
            with contextlib.suppress(Exception):  # not waited for: the actor serves the driver's other groups
                actor.forget.remote(self._collective_group)
        if self._files is not None:
            files, self._files, self._served = self._files, None, set()
            with contextlib.suppress(Exception):
                ray.kill(files, no_restart=True)
