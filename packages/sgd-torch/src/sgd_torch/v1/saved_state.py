"""The state of Ray SGD v1's ``TorchTrainer`` in a file, and a state checked before it is loaded.

``TorchTrainer.save`` writes ``trainer.pt`` with :mod:`sgd_torch.codec`; :func:`_load_state_file`
reads it back (``torch.load(weights_only=True)`` unless trusted) and
:func:`_check_same_layout` fails on the driver when a state cannot fit the trainer's operators.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch


def _check_same_layout(current: Dict[str, Any], new: Dict[str, Any], operator_name: str) -> None:
    """Fail on the driver, before any worker loads it, when ``new`` cannot fit this trainer's
    operators: another number of models / optimizers / schedulers, or other parameters."""
    for what in ("model", "optimizer", "scheduler"):
        mine, theirs = current.get(f"{what}s") or [], new.get(f"{what}s") or []
        if len(mine) != len(theirs):
            raise ValueError(
                f"the state holds {len(theirs)} {what}(s) but {operator_name} registered {len(mine)}; "
                "restore it into a trainer built with the same creators / operator class."
            )
    for index, (mine, theirs) in enumerate(zip(current["models"], new["models"])):
        shapes = {k: tuple(v.shape) for k, v in mine.items() if isinstance(v, torch.Tensor)}
        other = {k: tuple(v.shape) for k, v in theirs.items() if isinstance(v, torch.Tensor)}
        if shapes != other:
            diff = sorted(set(shapes.items()) ^ set(other.items()))
            raise ValueError(
                f"model {index} of the state does not match {operator_name}'s (differs in {diff[:4]}); "
                "restore it into a trainer built with the same creators / operator class."
            )


def _load_state_file(path: Union[str, os.PathLike], trusted: Optional[bool] = None) -> Dict[str, Any]:
    from sgd_torch import codec

    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "trainer.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no sgd_torch.v1 checkpoint at {path}; pass a file written by TorchTrainer.save()")
    with open(path, "rb") as f:
        state = codec.load(f, trusted, str(path))
    if not isinstance(state, dict) or "models" not in state:
        raise ValueError(f"{path} was not written by TorchTrainer.save() (no models in it)")
    return state
