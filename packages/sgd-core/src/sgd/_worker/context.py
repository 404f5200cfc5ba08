"""What a worker is told about its place in the job: its ranks and run (``WorkerContext``), and a
host of the job going away (``PreemptionInfo``).

Both travel from the driver to the workers pickled, and user code reads them
(``sgd.get_context()``, ``sgd.get_preemption_info()``); they keep ``sgd._worker.session``, where
they were defined first, as their ``__module__``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sgd._common.public import public_module
from sgd._worker.storage_context import StorageContext


@public_module("sgd._worker.session")
@dataclass
class WorkerContext:
    """Where this worker sits in the group. Set by the worker group on start."""

    world_rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node_rank: int = 0
    local_world_size: int = 1

    # Method names follow Ray Train's TrainContext so code moves over unchanged.
    def get_world_rank(self) -> int:
        return self.world_rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    # Which run this is (set at the start of each run).
    experiment_name: Optional[str] = None
    trial_dir: Optional[str] = None
    trial_name: Optional[str] = None
    trial_id: Optional[str] = None

    def get_experiment_name(self) -> Optional[str]:
        """The name of the trainer's ``logdir`` (``RunConfig(name=...)`` for the AIR trainers)."""
        return self.experiment_name

    def get_trial_dir(self) -> Optional[str]:
        """This run's directory (``logdir/run_NNN``), a path on the driver's node."""
        return self.trial_dir

    def get_trial_name(self) -> Optional[str]:
        """The Ray Tune trial's name when the run is a Tune trial, else ``None``."""
        return self.trial_name

    def get_trial_id(self) -> Optional[str]:
        """The Ray Tune trial's id when the run is a Tune trial, else ``None``."""
        return self.trial_id

    def get_storage(self) -> StorageContext:
        """Where this run is kept, as Ray Train's ``get_context().get_storage()`` (a
        :class:`~sgd.session.StorageContext`: ``storage_filesystem``, ``storage_fs_path``,
        ``experiment_dir_name``, ``experiment_fs_path``...), on the driver's disk.

        :raises RuntimeError: outside a run (no run folder to tell).
        """
        if self.trial_dir is None:
            raise RuntimeError("get_context().get_storage() is for a training function run by a trainer: there is "
                               "no run folder here")
        return StorageContext.for_run_dir(self.trial_dir)

    #: Local mode only (``num_workers=0``): the CUDA device indexes of the driver's process the
    #: function may use (``(0,)`` with ``use_gpu=True``, ``()`` without). ``None`` in a worker
    #: actor, whose GPUs are the ones Ray gave it (``CUDA_VISIBLE_DEVICES``).
    local_gpus: Optional[Tuple[int, ...]] = None

    # How this worker reaches the driver's disk (set at the start of each run).
    driver_node_id: Optional[str] = None
    #: A ``DriverFileServer`` actor's handle, on runs with workers on other hosts.
    driver_files: Any = None
    #: The number of the telling of this run's folders to that server (its requests wait for it).
    driver_files_told: int = 0

    # What ``sgd.collective`` needs (set at the start of each run; see sgd._worker.collective):
    #: the group's collective actor's handle (sent once per worker process)...
    collective: Any = None
    #: ...and this run's ``(group key, token, timeout_s, warn_interval_s)``.
    collective_run: Optional[Tuple[str, int, Optional[float], float]] = None


@public_module("sgd._worker.session")
@dataclass(frozen=True)
class PreemptionInfo:
    """A host of this training job is going away (``sgd.get_preemption_info()``).

    Ray marked the host as draining (``ray drain-node``, a cloud preemption notice, KubeRay's
    scale-down). sgd moves the workers off it at the next checkpoint (or, when none comes, a
    few seconds before the deadline, from the latest one), without counting a failure.

    Ray Train 2.60's names are there too: ``deadline_ms``, ``preempted_node_to_ranks``,
    ``preempted_node_ids``, ``preempted_ranks``.
    """

    #: when the host will be gone (``time.time()`` seconds; ``math.inf`` when the notice gave no deadline).
    deadline: float
    #: the draining host's address and Ray node id.
    node_ip: str
    node_id: str
    #: Ray Train 2.60's: every draining host of the job (Ray node id) → the world ranks of the
    #: workers on it.
    preempted_node_to_ranks: Dict[str, List[int]] = field(default_factory=dict, hash=False)

    @property
    def deadline_ms(self) -> Optional[int]:
        """Ray Train 2.60's: :attr:`deadline` in UNIX milliseconds, ``None`` when there is none."""
        return None if math.isinf(self.deadline) else int(self.deadline * 1000)

    @property
    def preempted_node_ids(self) -> List[str]:
        """Ray Train 2.60's: the draining hosts' Ray node ids, sorted."""
        return sorted(self.preempted_node_to_ranks) or [self.node_id]

    @property
    def preempted_ranks(self) -> List[int]:
        """Ray Train 2.60's: the world ranks of the workers on the draining hosts, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})

    @property
    def seconds_left(self) -> float:
        """Seconds until the deadline (never below 0)."""
        return max(0.0, self.deadline - time.time())
