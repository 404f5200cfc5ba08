"""Deprecated home of the driver's checkpoint manager: it is :mod:`sgd.storage.manager` now (the
run directory's one writer). The names are looked up there on first use, so this package, which
sits below :mod:`sgd.storage`, imports nothing of it (no import circle)."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = ("CheckpointManager", "checkpoint_dir_name", "json_safe")


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"sgd.checkpoint.manager.{name} moved to sgd.storage.manager.{name}", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module("sgd.storage.manager"), name)
