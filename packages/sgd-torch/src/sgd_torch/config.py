"""``TorchConfig`` and the backend that sets up ``torch.distributed`` on the workers.

Nothing here imports torch at module level: the plugin is loaded by every
``import sgd``-using process, and torch is only needed on the workers. What the backend runs
on the workers is in :mod:`sgd_torch.process_group`; how its data travels to the driver, in
:mod:`sgd_torch.transport`.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Tuple

import ray

from sgd.backend import Backend, BackendConfig, free_address, share_cuda_visible_devices
from sgd_torch.process_group import (
    GROUP_NOTE,
    _destroy_process_group,
    _init_process_group,
    _set_env,
    _start_run,
    _track_own_group,
)
from sgd_torch.transport import _from_transport, _to_cpu, _to_transport
from sgd_torch.transport import _NumpyTensor as _NumpyTensor

if TYPE_CHECKING:
    from sgd.backend import Workers

logger = logging.getLogger("sgd.torch")

_INIT_METHODS = ("env", "tcp")


@dataclass
class TorchConfig(BackendConfig):
    """Configuration of the ``"torch"`` backend.

    :param backend: ``torch.distributed`` backend; ``None`` means ``"nccl"``
        when workers have GPUs, else ``"gloo"``.
    :param init_method: ``"env"`` (``MASTER_ADDR``/``MASTER_PORT``) or ``"tcp"``
        (``tcp://addr:port``).
    :param timeout_s: timeout of collective operations, in seconds.
    :param init_process_group: create the default process group on every worker (the
        default). ``False`` only sets the torchrun environment variables (``MASTER_ADDR``,
        ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...) and leaves
        ``torch.distributed.init_process_group("env://")`` to the training code, as under
        ``torchrun`` (``sgd run`` uses this). A group the code leaves behind is destroyed
        before the next run and at shutdown.
    :param keep_survivors: after a worker died, keep the workers that survived (only the
        dead are replaced; the process group is built again on all) — with gloo; NCCL always
        replaces every worker. ``False`` replaces every worker, for code that keeps state
        across runs in its process (a module-level model or cache bound to the old process
        group) that must not outlive a failure, as ``sgd_torch.v1`` does. With it (and gloo),
        a worker whose training function raised destroys its process group at once, so that
        peers blocked in a collective with it fail within milliseconds rather than at
        ``timeout_s``; the next run builds a new group.
    """

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: int = 1800
    init_process_group: bool = True
    keep_survivors: bool = True

    def __post_init__(self) -> None:
        if self.init_method not in _INIT_METHODS:
            raise ValueError(f"init_method must be 'env' or 'tcp', got {self.init_method!r}")
        if self.backend is not None and self.backend not in ("gloo", "nccl", "mpi", "xccl", "ucc"):
            raise ValueError(f"unknown torch.distributed backend {self.backend!r}; use 'gloo' or 'nccl'")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not isinstance(self.init_process_group, bool):
            raise ValueError(f"init_process_group must be True or False, got {self.init_process_group!r}")
        if not isinstance(self.keep_survivors, bool):
            raise ValueError(f"keep_survivors must be True or False, got {self.keep_survivors!r}")

    @property
    def backend_cls(self) -> type:
        return TorchBackend

    @property
    def name(self) -> str:
        return "torch"


# --- driver side -----------------------------------------------------------------


def _kept_their_group(worker_group: Workers) -> bool:
    """Whether every worker noted at the end of the group's last run (which ended cleanly) that
    its process group was still there (``Workers.run_notes``, from sgd-core 2026-11-26 on)."""
    notes = getattr(worker_group, "run_notes", None)
    if not notes or len(notes) != len(worker_group):
        return False
    return all(n is not None and n.get(GROUP_NOTE) is True for n in notes)


class TorchBackend(Backend):
    """The ``"torch"`` backend's lifecycle: ``MASTER_ADDR``/``RANK``... on every worker and
    one ``torch.distributed`` process group (gloo, or NCCL with GPUs); tensors and modules
    travel to the driver as CPU tensors.

    Public so that backends built on torch (sgd-horovod) can reuse its data handling.
    """

    checkpoint_codec = "torch"
    #: on_start made every worker's group since the last run began (the next run asks nothing)
    _groups_just_made = False
    preload_modules = ("torch.distributed",)
    #: GPUs of one node are shared by its workers (sgd-core does it before ``on_start``).
    share_cuda_visible_devices = True

    def on_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, TorchConfig)
        use_gpu = worker_group.num_gpus_per_worker > 0
        backend = backend_config.backend or ("nccl" if use_gpu else "gloo")
        addr, port = self._set_rendezvous_env(worker_group)
        if not backend_config.init_process_group:
            # The training code calls init_process_group("env://") itself; a run in
            # sgd.elastic.run has it built again at the new size on a reset (see _track_own_group).
            worker_group.execute(_track_own_group, backend_config.timeout_s)
            return
        init_method = "env://" if backend_config.init_method == "env" else f"tcp://{addr}:{port}"
        n = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank, _init_process_group, backend, init_method, rank, n, backend_config.timeout_s,
                    backend == "gloo" and backend_config.keep_survivors,
                )
                for rank in range(n)
            ]
        )
        # Every worker has its group now: the next run needs no call to find out (as after a run
        # that ended with every group in place), a round of N calls fewer on a trainer's first run.
        self._groups_just_made = True

    @staticmethod
    def _set_rendezvous_env(worker_group: Workers) -> Tuple[str, int]:
        """torchrun's variables on every worker, with a new free port on rank 0's node."""
        addr, port = worker_group.execute_single(0, free_address)
        n = len(worker_group)
        refs = []
        for rank, ctx in enumerate(worker_group.contexts):
            env = {
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(ctx.local_rank),
                "LOCAL_WORLD_SIZE": str(ctx.local_world_size),
                "NODE_RANK": str(ctx.node_rank),
                "GROUP_RANK": str(ctx.node_rank),
            }
            refs.append(worker_group.execute_single_async(rank, _set_env, env))
        ray.get(refs)  # every worker has its env before any of them starts the rendezvous
        return addr, port

    @staticmethod
    def share_cuda_devices(worker_group: Workers) -> None:
        """Kept for callers of earlier versions: :func:`sgd.backend.share_cuda_visible_devices`,
        which sgd-core now runs for every backend with ``share_cuda_visible_devices = True``."""
        share_cuda_visible_devices(worker_group)

    def on_training_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, TorchConfig)
        just_made, self._groups_just_made = self._groups_just_made, False
        if backend_config.init_process_group and (just_made or _kept_their_group(worker_group)):
            # Every worker has its process group: on_start made it, or the last run ended with it
            # in place (a run-end note). No call to them: each run resets torch's state by itself
            # (a run context).
            return
        # Nothing of the previous run on these workers reaches this one (see _reset_run_state;
        # sgd_torch.accelerate's switch is per run already).
        grouped = worker_group.execute(_start_run)
        if backend_config.init_process_group and not all(grouped):
            # A run that failed on these workers destroyed its process group (gloo): a new one.
            self.on_start(worker_group, backend_config)
        if not backend_config.init_process_group:
            # The previous run's code may have left its own group: the next run's
            # init_process_group would fail with "already initialized". And each run
            # rendezvouses at a new port: on the previous one, a rank could meet the old
            # group's store (still held by a reference somewhere) and its stale keys, and
            # wait forever in all_reduce for a peer that is in another group.
            worker_group.execute(_destroy_process_group)
            self._set_rendezvous_env(worker_group)

    def on_shutdown(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        worker_group.execute(_destroy_process_group)

    def keeps_survivors(self, worker_group: Workers, backend_config: BackendConfig) -> bool:
        """With gloo, a worker that survived a peer's death is kept: :meth:`on_start` destroys
        its process group and builds a new one with the replaced worker. NCCL communicators
        cannot be torn down safely after a peer died: every worker is replaced."""
        if not isinstance(backend_config, TorchConfig):
            return False  # a subclass configured otherwise: the safe default
        use_gpu = worker_group.num_gpus_per_worker > 0
        gloo = (backend_config.backend or ("nccl" if use_gpu else "gloo")) == "gloo"
        return backend_config.keep_survivors and gloo

    def reuses_processes(self, backend_config: BackendConfig) -> bool:
        """A process is clean for another torch group once :meth:`on_shutdown` destroyed its
        process group (sgd.keep_workers)."""
        return isinstance(backend_config, TorchConfig)

    def reforms_in_place(self, worker_group: Workers, backend_config: BackendConfig) -> bool:
        """The process group is built again in live processes, gloo or NCCL: by :meth:`on_start`
        when sgd sets it up; with ``init_process_group=False`` (``sgd run``), by each survivor
        at its reset, as the code created it."""
        return isinstance(backend_config, TorchConfig)

    @staticmethod
    def encode_data(data: Any) -> Any:
        if "torch" not in sys.modules:  # nothing can hold a tensor
            return data
        return _to_cpu(data)

    @classmethod
    def encode_checkpoint(cls, state: Any) -> Any:
        if "torch" not in sys.modules:
            return state
        return _to_transport(_to_cpu(state))

    @staticmethod
    def decode_checkpoint(state: Any) -> Any:
        return _from_transport(state)


#: The name this class had before it was public.
_TorchBackend = TorchBackend
