"""``TorchConfig`` and the backend that sets up ``torch.distributed`` on the workers.

Nothing here imports torch at module level: the plugin is loaded by every
``import sgd``-using process, and torch is only needed on the workers.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import ray

from sgd.backend import (
    Backend,
    BackendConfig,
    free_address,
    on_worker_interrupt,
    on_worker_reset,
    on_worker_run_error,
    share_cuda_visible_devices,
)
from sgd_torch.sockets import OpenedSockets

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


# --- functions run on the workers ------------------------------------------------


def _set_env(env: Dict[str, str]) -> None:
    os.environ.update(env)


def _init_process_group(backend: str, init_method: str, rank: int, world_size: int, timeout_s: int,
                        release_on_error: bool = False) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    _recording_sockets(dist.init_process_group)(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    on_worker_interrupt(_interrupt_process_group)
    if release_on_error:
        on_worker_run_error(_destroy_process_group)


#: The sockets the current process group opened on this worker (what an interrupt shuts).
_GROUP_SOCKETS = OpenedSockets()


def _recording_sockets(init: Any) -> Any:
    """``init`` (``init_process_group``) that records the sockets the group opens (its store
    and its connections to the peers): what an interrupt shuts (see _interrupt_process_group)."""
    return _GROUP_SOCKETS.recording(init)


def _interrupt_process_group() -> None:
    """Make a collective blocked on a lost peer fail now (sgd.elastic's interrupt), so the
    worker comes to the reset barrier instead of waiting out ``timeout_s``.

    gloo: shut down (not close: the group still owns them) the connections the group opened;
    every pending and later operation on them fails at once, and so do the collectives of the
    peers connected to this worker. Listening sockets are left alone (gloo's listener thread
    aborts on one). Destroying the group is not enough: its connections close only once nothing
    refers to it, and a DDP model or a failed step's frames do. NCCL: abort the communicators."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()
        return
    _GROUP_SOCKETS.shut_down()


def _track_own_group(timeout_s: int) -> None:
    """On a worker whose training code creates the process group itself: record the sockets
    of the group it creates (so an interrupt can fail a blocked collective), and on a reset in
    place build it again, with the same backend, from the environment the re-formed group got."""
    import torch.distributed as dist

    global _OWN_GROUP_TIMEOUT_S
    _OWN_GROUP_TIMEOUT_S = timeout_s
    if not getattr(dist.init_process_group, "_sgd_tracked", False):
        dist.init_process_group = _recording_sockets(dist.init_process_group)
    on_worker_interrupt(_interrupt_process_group)
    on_worker_reset(_rebuild_own_group)


_OWN_GROUP_TIMEOUT_S = 1800


def _rebuild_own_group() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return  # the code has not created one (yet): nothing to build again
    backend = dist.get_backend()
    dist.destroy_process_group()
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=_OWN_GROUP_TIMEOUT_S))


#: torch's global switches as this worker process had them before its first run.
_FRESH_STATE: Optional[Tuple[Any, bool, bool]] = None


def _reset_run_state() -> None:
    """Give every run on this worker what a fresh process would give it: torch's default
    CPU random generator state (so unseeded model initialisation is the same as on new
    workers), deterministic algorithms and cudnn.benchmark as they were. The first run on a
    process records them; later runs (a re-run, the next Tune trial on reused workers)
    restore them."""
    global _FRESH_STATE
    import torch

    if _FRESH_STATE is None:
        _FRESH_STATE = (torch.get_rng_state(), torch.are_deterministic_algorithms_enabled(),
                        bool(torch.backends.cudnn.benchmark))
        return
    rng, deterministic, benchmark = _FRESH_STATE
    torch.set_rng_state(rng)
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        # Only when it changed: each call (torch 2.13) leaves references to the default
        # process group behind, which then outlives destroy_process_group (its connections
        # stay open: see _destroy_process_group).
        torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark


def _destroy_process_group() -> None:
    """Also run, for gloo, when a training function raised (``on_worker_run_error``): the
    group's connections close, so a peer blocked in a collective with this worker fails at
    once instead of at the timeout, and the failure spreads through the group (a worker that
    died closes its connections; a survivor next to it fails and closes its own...). The
    survivors' runs end within milliseconds: they are kept (``keeps_survivors``).

    The connections close only when nothing refers to the group any more. Calling
    ``torch.use_deterministic_algorithms`` after the group exists leaves references behind
    (torch 2.13); then a survivor that does not neighbour the dead worker in a collective
    waits until it is replaced (``SGD_SURVIVOR_PATIENCE_S``)."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _start_run() -> bool:
    """Before a run on a worker: reset torch's state (:func:`_reset_run_state`); whether the
    process group sgd set up is still there (a failed run destroys it)."""
    _reset_run_state()
    import torch.distributed as dist

    from sgd_torch.train_loop_utils import get_device

    # Hugging Face Accelerate reads the device from here (Ray Train sets it too).
    os.environ["ACCELERATE_TORCH_DEVICE"] = str(get_device())
    return dist.is_available() and dist.is_initialized()


# --- driver side -----------------------------------------------------------------


class TorchBackend(Backend):
    """The ``"torch"`` backend's lifecycle: ``MASTER_ADDR``/``RANK``... on every worker and
    one ``torch.distributed`` process group (gloo, or NCCL with GPUs); tensors and modules
    travel to the driver as CPU tensors.

    Public so that backends built on torch (sgd-horovod) can reuse its data handling.
    """

    checkpoint_codec = "torch"
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


def _to_cpu(data: Any) -> Any:
    import torch

    if isinstance(data, (int, float, str, bool, type(None))):
        return data
    if isinstance(data, torch.Tensor):
        if _is_dtensor(data):
            raise TypeError(_SHARDED_STATE)
        return data.detach().cpu() if data.device.type != "cpu" else data.detach()
    if isinstance(data, dict):
        return {k: _to_cpu(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_to_cpu(v) for v in data]
    if isinstance(data, tuple) and not hasattr(data, "_fields"):
        return tuple(_to_cpu(v) for v in data)
    if isinstance(data, torch.nn.Module):
        return _module_to_cpu(data)
    return data


class _NumpyTensor:
    """A CPU tensor travelling as a numpy array: Ray moves those through its object
    store without copies, while a tensor is serialised with an in-memory torch.save."""

    __slots__ = ("array", "requires_grad")

    def __init__(self, array: Any, requires_grad: bool):
        self.array = array
        self.requires_grad = requires_grad

    def __reduce__(self):  # keep pickle protocol 5 out-of-band buffers for the array
        return (_NumpyTensor, (self.array, self.requires_grad))


def _to_transport(data: Any) -> Any:
    import torch

    if isinstance(data, torch.Tensor):
        if data.layout != torch.strided or data.dtype in (torch.bfloat16,) or data.is_quantized:
            return data  # numpy cannot hold it; normal pickling
        try:
            return _NumpyTensor(data.detach().contiguous().numpy(), data.requires_grad)
        except (TypeError, RuntimeError):
            return data
    if isinstance(data, dict):
        return {k: _to_transport(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_to_transport(v) for v in data]
    if isinstance(data, tuple) and not hasattr(data, "_fields"):
        return tuple(_to_transport(v) for v in data)
    return data


def _from_transport(data: Any) -> Any:
    if isinstance(data, _NumpyTensor):
        import numpy as np
        import torch

        # The array may be a read-only view of Ray's object store: copy it out.
        tensor = torch.from_numpy(np.array(data.array, copy=True))
        return tensor.requires_grad_(data.requires_grad) if data.requires_grad else tensor
    if isinstance(data, dict):
        return {k: _from_transport(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_from_transport(v) for v in data]
    if isinstance(data, tuple) and not hasattr(data, "_fields"):
        return tuple(_from_transport(v) for v in data)
    return data


#: Why a sharded (FSDP2) state cannot go into a whole-state report or checkpoint, and the ways out.
_SHARDED_STATE = (
    "this state holds DTensor shards of an FSDP2 model (prepare_model(parallel_strategy='fsdp')): each "
    "worker has only its part, and only rank 0's checkpoint is kept. Put "
    "torch.distributed.checkpoint.state_dict.get_model_state_dict(model, options=StateDictOptions("
    "full_state_dict=True, cpu_offload=True)) in the checkpoint, called on every worker (it gathers the "
    "shards on rank 0)"
)


def _is_dtensor(tensor: Any) -> bool:
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def _module_to_cpu(module: Any) -> Any:
    import copy

    import torch

    if isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        module = module.module
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(module, FullyShardedDataParallel):
        raise TypeError(
            "an FSDP model holds only this worker's shard and cannot travel whole: put "
            "model.state_dict() in the report or checkpoint instead, called on every worker "
            "(it gathers the shards)"
        )
    if isinstance(module, FSDPModule):
        raise TypeError(_SHARDED_STATE)
    on_device = any(t.device.type != "cpu" for t in list(module.parameters()) + list(module.buffers()))
    # Copy rather than move: the worker keeps training its model on its device.
    return copy.deepcopy(module).cpu() if on_device else module
