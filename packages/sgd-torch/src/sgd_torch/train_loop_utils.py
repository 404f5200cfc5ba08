"""Helpers called inside a training function: devices, DDP, distributed samplers."""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from sgd_torch.loaders import DeviceLoader, with_distributed_sampler

_DeviceLoader = DeviceLoader  # its name until 2026-11: kept for pickles that name it

#: ``(run, GradScaler or None)`` set by :func:`accelerate(amp=True) <accelerate>`; it holds
#: only for that run (workers outlive runs): see :func:`_amp`.
_amp_state: Optional[Tuple[Any, Optional[Any]]] = None


def _current_run() -> Any:
    from sgd.session import get_session

    return get_session()  # None outside an sgd worker


def _amp() -> Tuple[bool, Optional[Any]]:
    """Whether mixed precision is on for the running training function, and its scaler."""
    if _amp_state is None or _amp_state[0] is not _current_run():
        return False, None
    return True, _amp_state[1]


def _world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def get_device() -> torch.device:
    """This worker's device: its own GPU when it has one, else the CPU.

    Workers on one node see all of the node's sgd GPUs (``CUDA_VISIBLE_DEVICES``
    is shared so NCCL can use peer-to-peer); each picks the one Ray gave it.
    """
    return get_devices()[0]


def get_devices() -> List[torch.device]:
    """All of this worker's devices: each GPU Ray gave it (several with
    ``resources_per_worker={"GPU": 2}``), in order, else ``[cpu]``. The first is
    :func:`get_device`."""
    run = _current_run()
    local = run.context.local_gpus if run is not None else None
    if local is not None:  # local mode (num_workers=0): the driver's own GPUs when use_gpu=True
        if not local:
            return [torch.device("cpu")]
        if torch.cuda.device_count() < len(local):
            raise RuntimeError(
                f"Trainer(num_workers=0, use_gpu=True) runs the function in the driver's process, which sees "
                f"{torch.cuda.device_count()} CUDA GPU(s) and needs {len(local)}; run where the driver has a GPU, "
                "or use num_workers=1 for a worker on a node with one")
        return [torch.device("cuda", i) for i in local]
    if not torch.cuda.is_available():
        return [torch.device("cpu")]
    own = [g for g in os.environ.get("SGD_OWN_GPU_IDS", "").split(",") if g]
    visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if own and visible and own[0] in visible:
        return [torch.device("cuda", visible.index(g)) for g in own if g in visible]
    if own or visible:
        return [torch.device("cuda", 0)]
    return [torch.device("cpu")]


PARALLEL_STRATEGIES = ("ddp", "fsdp", "fsdp1", None)


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool = True,
    wrap_ddp: bool = True,
    ddp_kwargs: Optional[Dict[str, Any]] = None,
    *,
    parallel_strategy: Optional[str] = "ddp",
    parallel_strategy_kwargs: Optional[Dict[str, Any]] = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and, when more than one worker takes part,
    wrap it for data-parallel training.

    :param parallel_strategy: ``"ddp"`` (``DistributedDataParallel``: every worker holds the
        whole model), ``"fsdp"`` (FSDP2, ``torch.distributed.fsdp.fully_shard``: parameters,
        gradients and optimizer state sharded across the workers; applied to each layer, then
        to the whole model, see below), ``"fsdp1"`` (the older ``FullyShardedDataParallel``
        wrapper, for code that depends on it), or ``None`` (no wrapper), as in Ray Train.
    :param parallel_strategy_kwargs: keyword arguments for the wrapper's constructor, or for
        every ``fully_shard`` call with ``"fsdp"`` (``mesh``, ``reshard_after_forward``,
        ``mp_policy``, ``offload_policy``...).

    With ``"fsdp"`` the layers are the items of the outermost ``nn.ModuleList`` /
    ``nn.Sequential`` containers in the model (transformer blocks, the layers of an MLP), or,
    when it has none, its direct children that hold parameters: each becomes one shard unit
    (its parameters are gathered for its forward and backward only), then the whole model is.
    The model stays the same object (its class becomes ``FSDP<Class>``), its parameters
    become ``DTensor`` shards. Its state goes into a checkpoint whole with
    ``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))``
    called on every worker (it gathers the shards on rank 0).
    :param wrap_ddp: Ray SGD's switch: ``False`` is ``parallel_strategy=None``.
    :param ddp_kwargs: Ray SGD's name for ``parallel_strategy_kwargs`` of DDP.
    :raises ValueError: an unknown ``parallel_strategy``.
    """
    if parallel_strategy not in PARALLEL_STRATEGIES:
        raise ValueError(
            f"parallel_strategy={parallel_strategy!r} is not one of 'ddp', 'fsdp', 'fsdp1' or None"
        )
    if not wrap_ddp:
        parallel_strategy = None
    kwargs = dict(ddp_kwargs or {}, **(parallel_strategy_kwargs or {}))
    device = get_device()
    if move_to_device:
        model = model.to(device)
    if _amp()[0]:
        _autocast_forward(model, device)
    if parallel_strategy is None:
        return model
    if _world_size() <= 1:
        if parallel_strategy == "ddp":
            # sgd_torch.elastic.TorchState wraps it once the group grows
            setattr(model, "_sgd_ddp_kwargs", dict(kwargs))  # noqa: B010 (nn.Module's typed __setattr__)
        return model
    if parallel_strategy == "fsdp":
        return _fully_shard(model, kwargs)
    if parallel_strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        kwargs.setdefault("device_id", device)
        return FullyShardedDataParallel(model, **kwargs)
    from torch.nn.parallel import DistributedDataParallel

    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index])
        kwargs.setdefault("output_device", device.index)
    ddp = DistributedDataParallel(model, **kwargs)
    # sgd_torch.elastic.TorchState wraps the module again after a reset
    setattr(ddp, "_sgd_ddp_kwargs", dict(kwargs))  # noqa: B010 (nn.Module's typed __setattr__)
    return ddp


def shard_units(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The submodules ``prepare_model(parallel_strategy="fsdp")`` shards one by one: the items
    of the outermost ``nn.ModuleList`` / ``nn.Sequential`` containers that hold parameters,
    else the model's direct children that do. Never nested in one another."""
    containers = (torch.nn.ModuleList, torch.nn.Sequential)

    def holds_parameters(module: torch.nn.Module) -> bool:
        return any(True for _ in module.parameters())

    units: List[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            if isinstance(child, containers):
                units.extend(item for item in child if holds_parameters(item))
            else:
                visit(child)

    if isinstance(model, containers):
        units = [item for item in model if holds_parameters(item)]
    else:
        visit(model)
    if not units:
        units = [child for child in model.children() if holds_parameters(child)]
    return units


def _fully_shard(model: torch.nn.Module, kwargs: Dict[str, Any]) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for unit in shard_units(model):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _autocast_forward(model: torch.nn.Module, device: torch.device) -> None:
    """Run ``model``'s forward under ``torch.autocast`` (float16 on GPU, bfloat16 on CPU).

    The wrapper is an :class:`AutocastForward` object, not a closure, so the model still
    pickles (``pickle``, ``torch.save``, Ray's object store) and loads with it.
    """
    if isinstance(model.__dict__.get("forward"), AutocastForward):
        return  # prepare_model called twice on one model: autocast once
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    model.forward = AutocastForward(model, device.type, dtype)  # type: ignore[method-assign]


class AutocastForward:
    """A module's forward run under ``torch.autocast``: what :func:`prepare_model` sets as
    ``model.forward`` after :func:`accelerate(amp=True) <sgd_torch.accelerate>`.

    A module-level class holding the module, the device type and the dtype, so a model
    carrying it pickles and loads (by reference to this class, as any torch model's class),
    and runs under autocast after loading too. :func:`strip_autocast` takes it off again
    (``TorchCheckpoint.from_model`` stores the model without it).

    :param module: the model.
    :param device_type: ``"cuda"`` or ``"cpu"``.
    :param dtype: the autocast dtype.
    :param forward: the forward it wraps; ``None`` is the class's own ``forward``.
    """

    def __init__(self, module: torch.nn.Module, device_type: str, dtype: torch.dtype, forward: Any = None):
        if forward is None:
            forward = module.__dict__.get("forward")  # a forward the caller set on the instance
        self.module = module
        self.device_type = device_type
        self.dtype = dtype
        self.wrapped = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = self.wrapped if self.wrapped is not None else type(self.module).forward.__get__(self.module)
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            return forward(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (AutocastForward, (self.module, self.device_type, self.dtype, self.wrapped))

    def __repr__(self) -> str:
        return f"AutocastForward({type(self.module).__name__}.forward, {self.device_type}, {self.dtype})"


def strip_autocast(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` without the autocast wrapper :func:`prepare_model` set on it (in place; returned)."""
    wrapper = model.__dict__.get("forward")
    if isinstance(wrapper, AutocastForward):
        if wrapper.wrapped is None:
            del model.__dict__["forward"]
        else:
            model.forward = wrapper.wrapped  # type: ignore[method-assign]
    return model


def prepare_data_loader(
    data_loader: DataLoader, add_dist_sampler: bool = True, move_to_device: bool = True, auto_transfer: bool = True
) -> Any:
    """Give each worker its own part of ``data_loader``'s dataset (``DistributedSampler``)
    and move batches to the worker's device.

    Shuffling is kept if the loader shuffled. The sampler's epoch advances on
    every pass over the returned loader, so each epoch shuffles differently. After a
    restart the training function runs in a new process where the count starts at 0
    again: call ``loader.set_epoch(epoch)`` with the epoch it resumes at.

    :param auto_transfer: on a GPU, copy the next batch to the device on a CUDA stream of its
        own while the current one trains (Ray Train's ``auto_transfer``; batches from pinned
        memory overlap fully); ``False``: each batch is copied when it is taken. Ignored on
        the CPU and with ``move_to_device=False``.
    """
    if add_dist_sampler and _world_size() > 1:
        data_loader = with_distributed_sampler(data_loader, _world_size(), dist.get_rank())
    device = get_device()
    return DeviceLoader(data_loader, device if move_to_device and device.type != "cpu" else None,
                        auto_transfer=auto_transfer)


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, NumPy and torch and ask torch for deterministic algorithms.

    Call it at the top of the training function, before building models and
    loaders. Deterministic algorithms can be slower.
    """
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def accelerate(amp: bool = False) -> None:
    """Turn on automatic mixed precision: models prepared afterwards run their forward under
    ``torch.autocast`` (float16 on GPU, bfloat16 on CPU); :func:`prepare_optimizer` and
    :func:`backward` scale the loss on GPU. Call it before :func:`prepare_model`."""
    global _amp_state
    scaler = torch.amp.GradScaler("cuda") if amp and get_device().type == "cuda" else None
    _amp_state = (_current_run(), scaler) if amp else None


class _ScaledOptimizer:
    """An optimizer whose ``step`` goes through the AMP ``GradScaler``."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Any):
        self._optimizer = optimizer
        self._scaler = scaler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def step(self, closure: Any = None) -> Any:
        result = self._scaler.step(self._optimizer)
        self._scaler.update()
        return result


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> Any:
    """Wrap ``optimizer`` for mixed precision when :func:`accelerate` turned it on."""
    scaler = _amp()[1]
    return _ScaledOptimizer(optimizer, scaler) if scaler is not None else optimizer


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``, scaled when mixed precision is on."""
    scaler = _amp()[1]
    if scaler is not None:
        scaler.scale(tensor).backward()
    else:
        tensor.backward()


__all__ = [
    "accelerate",
    "backward",
    "enable_reproducibility",
    "get_device",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]

