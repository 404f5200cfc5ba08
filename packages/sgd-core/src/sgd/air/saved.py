"""The AIR trainer's side of ``air_trainer.json`` (written by :mod:`sgd.storage.saved_trainer`):
the config classes the file may name, backend configs kept by their registered name, and the
trainer classes ``restore()`` may find there."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from sgd.air.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from sgd.air.config_fields import LoggingConfig
from sgd.backend import BackendConfig
from sgd.checkpoint import CheckpointStrategy
from sgd.data import DataConfig, DatasetConfig


def subclasses(cls: type) -> List[type]:
    found: List[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *subclasses(sub)]
    return found


def backend_name(config: Any) -> Optional[str]:
    """The name ``config``'s class is registered under as a backend, else ``None``."""
    from sgd.plugins import available_backends

    if not isinstance(config, BackendConfig):
        return None
    for name, spec in available_backends().items():
        if spec.config_cls is type(config):
            return name
    return None


def config_of_backend(name: str, fields: Dict[str, Any]) -> BackendConfig:
    from sgd.plugins import resolve_backend

    return resolve_backend(name).config_cls(**fields)


#: The config classes air_trainer.json may hold (by module and name; nothing else is built from it).
SAVED_CONFIGS: Tuple[type, ...] = (
    ScalingConfig, RunConfig, CheckpointConfig, FailureConfig, DatasetConfig, CheckpointStrategy, BackendConfig,
    LoggingConfig, DataConfig)
