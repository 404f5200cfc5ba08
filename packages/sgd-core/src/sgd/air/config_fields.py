"""Ray Train 2.60's additions to the AIR configs: :class:`LoggingConfig`, and the checks of
``ScalingConfig(label_selector=...)`` and ``RunConfig(storage_filesystem=...)``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from sgd._common.public import public_module
from sgd.checkpoint.storage import filesystem_uri, is_uri

#: Ray's resource that every node with an accelerator of type ``T`` has: ``accelerator_type:T``.
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"


def check_label_selector(selector: Any, max_workers: int) -> None:
    """:raises ValueError: ``selector`` is not ``None``, a ``{str: str}`` dict, or a list of
    ``max_workers`` such dicts."""

    def is_selector(s: Any) -> bool:
        return isinstance(s, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in s.items())

    if selector is None or is_selector(selector):
        return
    if isinstance(selector, list) and all(is_selector(s) for s in selector):
        if len(selector) != max_workers:
            raise ValueError(f"label_selector as a list needs one dict per worker ({max_workers}, the max_workers), "
                             f"got {len(selector)}; or pass one dict for every worker")
        return
    raise ValueError(f"label_selector must be a dict of str to str (Ray node labels), or a list of such dicts, one "
                     f"per worker; got {selector!r}")


def check_storage_filesystem(fs: Any, storage_path: Optional[str]) -> None:
    """:raises TypeError: ``fs`` is not a ``pyarrow.fs.FileSystem``.
    :raises ValueError: ``fs`` without ``storage_path``, or ``storage_path`` still a URI."""
    if fs is None:
        return
    try:
        import pyarrow.fs as pafs
    except ImportError as exc:  # pragma: no cover - pyarrow comes with Ray Data
        raise ImportError("RunConfig(storage_filesystem=...) needs pyarrow: pip install pyarrow") from exc
    if not isinstance(fs, pafs.FileSystem):
        raise TypeError(f"RunConfig(storage_filesystem=...) takes a pyarrow.fs.FileSystem, got {type(fs).__name__}")
    if storage_path is None:
        raise ValueError("RunConfig(storage_filesystem=...) needs storage_path: the folder on that filesystem "
                         "(without its URI prefix, e.g. 'bucket/runs')")
    if is_uri(str(storage_path)):
        raise ValueError(f"with storage_filesystem, storage_path is a path on that filesystem, without the URI "
                         f"prefix: got {storage_path!r}; pass {str(storage_path).split('://', 1)[1]!r}")


@public_module("sgd.air")
@dataclass
class LoggingConfig:
    """Ray Train 2.60's logging settings (``RunConfig(logging_config=...)``).

    :param log_level: the level of sgd's logger (``"sgd"``) in the driver, set when ``fit()``
        starts: a name of :mod:`logging`'s levels (``"DEBUG"``, ``"INFO"``..., any case).
        Default ``"INFO"``. (Ray also sets it in the workers; sgd's workers keep their own.)
    """

    log_level: str = "INFO"

    def __post_init__(self) -> None:
        names = sorted(n for n in logging.getLevelNamesMapping() if n != "NOTSET") + ["NOTSET"]
        if not isinstance(self.log_level, str) or self.log_level.upper() not in names:
            raise ValueError(f"LoggingConfig(log_level={self.log_level!r}) is not a logging level; "
                             f"one of {', '.join(names)}")
        self.log_level = self.log_level.upper()


def storage_location(storage_path: Optional[str], storage_filesystem: Any) -> Optional[str]:
    """``RunConfig``'s storage as one string: ``storage_path`` itself (a local folder or a URI),
    or, with a ``storage_filesystem``, a URI that sgd's checkpoint storage resolves to that
    filesystem object (:func:`sgd.checkpoint.storage.filesystem_uri`); a
    ``pyarrow.fs.LocalFileSystem`` leaves ``storage_path`` a local folder."""
    if storage_filesystem is None or storage_path is None:
        return storage_path
    import pyarrow.fs as pafs


    if isinstance(storage_filesystem, pafs.LocalFileSystem):
        return storage_path
    return filesystem_uri(storage_filesystem, str(storage_path))


def check_ray_settings(scaling_config: Any, run_config: Any) -> None:
    """Raise ``ValueError`` for Ray Train 2.60 settings sgd cannot honour, before anything
    starts (``make_trainer()`` calls it)."""
    scaling_config.check_supported()
    if scaling_config.label_selector is not None:
        raise ValueError(
            "ScalingConfig(label_selector=...) is not supported by sgd yet: its workers are placed by resources "
            "only. Give the nodes a custom resource (ray start --resources='{\"spot\": 1000}') and ask for it with "
            "resources_per_worker={'spot': 1}, or accelerator_type=... for an accelerator type.")
    env = run_config.worker_runtime_env
    if env:
        raise ValueError(
            "RunConfig(worker_runtime_env=...) is not supported by sgd yet: set the runtime environment for the "
            "whole job instead (ray.init(runtime_env=...) or the job's submission), which the workers inherit.")
