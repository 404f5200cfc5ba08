"""The state of a sharded checkpoint: models, optimizers and tensors as DCP state dicts.

:func:`sgd_torch.save_sharded_checkpoint` and :func:`sgd_torch.load_sharded_checkpoint` take
``{"model": model, "opt": optimizer}``; this module turns such a dict into what
``torch.distributed.checkpoint`` saves and loads (whatever the model's sharding), puts what was
loaded back into the objects, and checks a model against a checkpoint before loading it.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


def _dcp_state(state: Dict[str, Any]) -> Dict[str, Any]:
    if not isinstance(state, dict) or not state:
        raise TypeError(f"the state must be a non-empty dict of models, optimizers and tensors, got {state!r}")
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    out: Dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            out[key] = get_model_state_dict(value)
        elif isinstance(value, torch.optim.Optimizer):
            out[key] = get_optimizer_state_dict(_model_of(value, modules, key), value)
        elif isinstance(value, torch.Tensor):
            out[key] = value
        else:
            raise TypeError(
                f"state[{key!r}] is a {type(value).__name__}: a sharded checkpoint holds models, optimizers and "
                "tensors; pass plain values as metadata (save_sharded_checkpoint(state, step=3))")
    return out


def _model_of(optimizer: torch.optim.Optimizer, modules: List[torch.nn.Module], key: str) -> torch.nn.Module:
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if wanted <= {id(p) for p in module.parameters()}:
            return module
    raise TypeError(f"state[{key!r}] is an optimizer whose model is not in the same dict; pass both: "
                    f"{{'model': model, {key!r}: optimizer}}")


def _apply(state: Dict[str, Any], loaded: Dict[str, Any]) -> None:
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            set_model_state_dict(value, loaded[key])
        elif isinstance(value, torch.optim.Optimizer):
            set_optimizer_state_dict(_model_of(value, modules, key), value, loaded[key])
        # tensors were loaded in place by dcp.load


def _check_against(target: Dict[str, Any], saved: Dict[str, Any], where: str) -> None:
    """Every tensor of the models (and plain tensors) is in the checkpoint, with its shape."""
    for key, value in target.items():
        items = value.items() if isinstance(value, dict) and not _is_optimizer_state(value) else []
        pairs = [(f"{key}.{name}", t) for name, t in items] if items else [(key, value)]
        for fqn, tensor in pairs:
            if not isinstance(tensor, torch.Tensor):
                continue
            entry = saved.get(fqn)
            if entry is None:
                raise ValueError(f"sharded checkpoint {where} has no {fqn!r} (the model has it, with shape "
                                 f"{tuple(tensor.shape)}); its keys start with: {sorted(saved)[:8]}")
            size = getattr(entry, "size", None)
            if size is not None and tuple(size) != tuple(tensor.shape):
                raise ValueError(f"sharded checkpoint {where}: {fqn!r} has shape {tuple(size)} in the checkpoint "
                                 f"and {tuple(tensor.shape)} in the model")


def _is_optimizer_state(value: Dict[str, Any]) -> bool:
    return set(value) == {"state", "param_groups"}
