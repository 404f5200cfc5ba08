"""How the ``"torch"`` backend's data travels from the workers to the driver.

Tensors and modules go as CPU tensors (a module copied off its device, never moved); a
checkpoint's CPU tensors as numpy arrays, which Ray's object store moves without copies. A
sharded (FSDP) state cannot travel whole: the error says what to report instead. Nothing here
imports torch at module level.
"""

from __future__ import annotations

import sys
from typing import Any

#: Values that never hold a tensor, checked by exact type (the common report's values).
_PLAIN = frozenset({int, float, str, bool, type(None)})


def _to_cpu(data: Any) -> Any:
    if type(data) in _PLAIN:
        return data
    if type(data) is dict and all(map(_PLAIN.__contains__, map(type, data.values()))):
        return data  # a report of plain values (every report of most runs): nothing to move
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


# Pickles name it by the module it was first defined in (sgd_torch.config re-exports it).
_NumpyTensor.__module__ = "sgd_torch.config"


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
