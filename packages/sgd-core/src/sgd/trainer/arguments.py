"""The arguments of :class:`sgd.Trainer` and of its ``run``, checked and resolved: the logdir, the
backend (a name or a config), the timeouts; a run's checkpoint strategy, dataset configs and the
checkpoint it starts from."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from sgd.backend import BackendConfig
from sgd.checkpoint import Checkpoint, CheckpointStrategy
from sgd.data import DatasetConfig
from sgd.plugins import PluginManager, resolve_backend
from sgd.utils import results_root


def resolve_logdir(logdir: Optional[Union[str, os.PathLike]]) -> Path:
    if logdir is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        return (results_root() / f"train_{stamp}").resolve()
    path = Path(logdir).expanduser()
    if not path.is_absolute():
        path = results_root() / path
    return path.resolve()


def resolve_run_folder(run_dir: Optional[Union[str, os.PathLike]], logdir: Optional[Union[str, os.PathLike]]
                       ) -> Tuple[Optional[Path], Path]:
    """``Trainer(run_dir=, logdir=)`` resolved: the named run folder (or ``None``) and the logdir
    (a named folder's parent).

    :raises ValueError: both given, and ``logdir`` is not ``run_dir``'s parent.
    """
    if run_dir is None:
        return None, resolve_logdir(logdir)
    named = resolve_logdir(run_dir)
    if logdir is not None and resolve_logdir(logdir) != named.parent:
        raise ValueError(f"logdir={logdir!r} is not the parent of run_dir={run_dir!r}; pass one of them")
    return named, named.parent


def backend_config_of(backend: Any, pm: Optional[PluginManager] = None) -> BackendConfig:
    if isinstance(backend, BackendConfig):
        return backend
    if isinstance(backend, str):
        return resolve_backend(backend, pm).config_cls()
    raise TypeError(
        f"backend must be a backend name (str) or a BackendConfig instance, got {type(backend).__name__}"
    )


def check_placement_timeout(placement_timeout_s: Any) -> Optional[float]:
    """``placement_timeout_s`` as a float (``None`` stays ``None``).

    :raises ValueError: not a number of seconds >= 0.
    """
    if placement_timeout_s is not None and (
        isinstance(placement_timeout_s, bool) or not isinstance(placement_timeout_s, (int, float))
        or not placement_timeout_s >= 0
    ):
        raise ValueError(
            f"placement_timeout_s must be a number of seconds >= 0 or None, got {placement_timeout_s!r}")
    return None if placement_timeout_s is None else float(placement_timeout_s)


def seconds_or_none(value: Any, name: str) -> Optional[float]:
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not seconds > 0:
        raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value!r}")
    return seconds


def checkpoint_dict(checkpoint: Any) -> Optional[dict]:
    """The ``checkpoint=`` argument of ``run`` (a dict, an :class:`sgd.Checkpoint` or a path) as a dict."""
    if checkpoint is None or isinstance(checkpoint, dict):
        return checkpoint
    if isinstance(checkpoint, Checkpoint):
        return checkpoint.to_dict()
    if isinstance(checkpoint, (str, os.PathLike)):
        return Checkpoint.from_directory(checkpoint).to_dict()
    raise TypeError(
        f"checkpoint must be a dict, an sgd.Checkpoint or a path, got {type(checkpoint).__name__}"
    )


def checkpoint_strategy_of(checkpoint_strategy: Any) -> CheckpointStrategy:
    """The ``checkpoint_strategy=`` argument of ``run`` (``None``: keep every checkpoint)."""
    strategy = checkpoint_strategy if checkpoint_strategy is not None else CheckpointStrategy()
    if not isinstance(strategy, CheckpointStrategy):
        raise TypeError(f"checkpoint_strategy must be an sgd.CheckpointStrategy, got {type(strategy).__name__}")
    return strategy


def check_dataset_config(dataset_config: Optional[Dict[str, DatasetConfig]]) -> None:
    """:raises TypeError: a value of the ``dataset_config=`` argument of ``run`` is not a :class:`sgd.DatasetConfig`."""
    if dataset_config is not None:
        bad = [k for k, v in dataset_config.items() if not isinstance(v, DatasetConfig)]
        if bad:
            raise TypeError(f"dataset_config values must be sgd.DatasetConfig (wrong for {bad})")
