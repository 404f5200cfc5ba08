"""Mixed precision for the v1 API with ``torch.amp`` (Ray SGD v1 used NVIDIA Apex).

On a GPU: forward passes under ``torch.autocast(dtype=float16)`` and a ``GradScaler`` for the
backward pass and the optimizer steps. On a CPU: ``torch.autocast(dtype=bfloat16)`` and no
scaler (bfloat16 has float32's exponent range, so gradients do not underflow).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager, Dict, Optional

import torch


def warn_apex_args(apex_args: Optional[Dict[str, Any]]) -> None:
    """Warn that ``apex_args`` does nothing (sgd uses ``torch.amp``, not Apex)."""
    if apex_args:
        warnings.warn(
            f"apex_args={apex_args!r} is ignored: sgd_torch.v1 runs use_fp16=True with torch.amp "
            "(autocast + GradScaler), not NVIDIA Apex. Drop apex_args to silence this warning.",
            UserWarning,
            stacklevel=3,
        )


class Amp:
    """The mixed-precision state of one operator: autocast settings and the gradient scaler.

    :param enabled: ``use_fp16``; when false every method is a plain pass-through.
    :param device: the device the models run on.
    """

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = bool(enabled)
        self.device_type = device.type
        self.dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.scaler: Optional[torch.amp.GradScaler] = (
            torch.amp.GradScaler("cuda") if self.enabled and device.type == "cuda" else None
        )

    def autocast(self) -> ContextManager[Any]:
        """A context for forward passes: ``torch.autocast`` when enabled, else nothing."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the scaler when there is one."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(self, optimizer: Any, update: bool = True) -> None:
        """``optimizer.step()``, through the scaler (which skips steps with inf/NaN gradients).

        :param update: also update the scale (once per iteration, after the last optimizer
            of the iteration stepped; pass ``False`` for the others).
        """
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        if update:
            self.scaler.update()

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
