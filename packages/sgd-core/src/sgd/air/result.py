"""What ``fit()`` returns: :class:`Result`, read from a run directory: rank 0's reports as it
made them (``metrics``, the checkpoints'), and each with Ray Train's result fields
(:data:`RAY_RESULT_FIELDS`) added in ``metrics_dataframe``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Type, Union

from sgd._common.protocol import detailed_metrics_enabled, reported_only, strip_detailed
from sgd._common.public import public_module
from sgd.checkpoint import Checkpoint
from sgd.runs import checkpoints, find_run, read_settings, result_rows, run_status


@public_module("sgd.air")
@dataclass
class Result:
    """What ``fit()`` returns; a failed ``fit()`` raises with one as the exception's ``.result``
    (then ``error`` is set).

    :ivar metrics: the last report of rank 0, exactly the dict it reported (``None`` if there was
        none), as Ray 2.60's ``Result.metrics``: no field added (``training_iteration``,
        ``timestamp``, ``done``, ``config``... are in :attr:`metrics_dataframe`; sgd's own
        ``_training_iteration``, ``_timestamp``... are left out). Unlike Ray 2.60, whose
        ``metrics`` are those of the last report *with a checkpoint*, this is rank 0's last
        report even when it carried no checkpoint.
    :ivar checkpoint: the latest persisted checkpoint, or ``None``.
    :ivar best_checkpoints: ``(checkpoint, metrics)`` for every kept checkpoint in Ray's order:
        ascending by the ``CheckpointConfig`` score (the worst first, the best last; NaN or a
        missing score ranks worst); without a score attribute, by recency (oldest first). Each
        ``metrics`` is the dict rank 0 reported with that checkpoint, nothing added (for one
        saved by ``sgd.save_checkpoint``, the report it went with).
    :ivar error: the exception that ended training, or ``None``. ``fit()`` raises it (a
        :class:`sgd.TrainingFailedError`, whose ``.result`` is this result) rather than returning a
        failed result.
    :ivar return_value: the training function's return value on rank 0, as Ray 2.60's
        ``Result.return_value``: ``None`` if it returned nothing, its value did not pickle, or
        training did not finish (or the result was read back with :meth:`from_path`).
    :ivar path: the run's folder on the driver's disk: ``<storage_path>/<name>`` (Ray 2.60's
        layout; under the results root when ``storage_path`` is a URI, to which the checkpoints
        are mirrored), or ``<logdir>/run_NNN`` for a Tune trial's run or a ``Trainer``'s.
    """

    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional[Checkpoint]
    error: Optional[BaseException] = None
    path: Optional[str] = None
    best_checkpoints: List[Tuple[Checkpoint, Dict[str, Any]]] = field(default_factory=list)
    return_value: Optional[Any] = None
    _rows: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        """One row per report of rank 0, as a ``pandas.DataFrame`` (needs pandas): what it
        reported, sgd's ``_training_iteration``, ``_timestamp``, ``_time_this_iter_s`` and Ray
        Train's result fields: ``training_iteration``, ``time_this_iter_s``, ``time_total_s``,
        ``timestamp``, ``date``, ``hostname``, ``node_ip``, ``pid`` (of rank 0's process; the
        underscore ``_date``... only with ``SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS=1``),
        ``done`` (``True`` in the last row when the run finished without error), ``trial_id``
        (the Ray Tune trial's id, else the run folder's name), and ``config`` (the run's config)
        in the last row. AIR's ``result.metrics["training_iteration"]`` is
        ``result.metrics_dataframe["training_iteration"].iloc[-1]``."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError("Result.metrics_dataframe needs pandas: pip install pandas") from exc
        return pd.DataFrame(self._rows)

    @property
    def config(self) -> Optional[Dict[str, Any]]:
        """The run's ``train_loop_config`` (the last row of :attr:`metrics_dataframe`'s
        ``config``; for a ``Result`` made by hand, ``metrics["config"]``), as Ray AIR's
        ``Result.config``; ``None`` without a report. (Ray 2.60 deprecated it.)"""
        source = self._rows[-1] if self._rows else self.metrics or {}
        return source.get("config")

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` :attr:`path` is on, as Ray's ``Result.filesystem``: a
        ``LocalFileSystem``, since sgd keeps a run's folder on the driver's disk (checkpoints
        mirrored to a storage URI or ``RunConfig(storage_filesystem=...)`` are copies)."""
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem()

    def get_best_checkpoint(self, metric: str, mode: str) -> Optional[Checkpoint]:
        """The kept checkpoint whose reported ``metric`` is the highest (``mode="max"``) or the
        lowest (``"min"``), as Ray's ``Result.get_best_checkpoint``. Checkpoints reported without
        the metric are left out; ``metric`` may name a nested value (``"eval/loss"`` is
        ``metrics["eval"]["loss"]``). Of equal values, the first in :attr:`best_checkpoints` wins.

        :raises RuntimeError: the run kept no checkpoint, or none was reported with ``metric``
            (the message lists the metrics there are).
        :raises ValueError: ``mode`` is not ``"max"`` or ``"min"``.
        """
        if not self.best_checkpoints:
            raise RuntimeError("No checkpoint exists in the trial directory! (the run kept no checkpoint)")
        if mode not in ("max", "min"):
            raise ValueError(f'Unsupported mode: {mode}. Please choose from ["min", "max"]!')
        scored = [(c, v) for c, m in self.best_checkpoints
                  if (v := _lookup(metric, m)) is not None]
        if not scored:
            names = sorted({k for _, m in self.best_checkpoints for k in m} | set(self.metrics or {}))
            raise RuntimeError(f"Invalid metric name {metric}! No kept checkpoint was reported with it. "
                               f"You may choose from the following metrics: {names}.")
        pick = max if mode == "max" else min
        return pick(scored, key=lambda cv: cv[1])[0]

    @classmethod
    def from_path(cls, path: Union[str, os.PathLike], storage_filesystem: Any = None, *,
                  error: Optional[BaseException] = None, checkpoint_cls: Type[Checkpoint] = Checkpoint) -> Result:
        """The result of the run in ``path``, read from disk: ``result.path`` (an AIR trainer's
        ``storage_path/name``, or a ``run_NNN``), or a folder of numbered runs (a ``Trainer``'s
        logdir, an AIR experiment written before 2026-11-29), which stands for its latest run.

        :param storage_filesystem: Ray 2.60's argument: ``None`` or a local ``pyarrow.fs``
            filesystem (``LocalFileSystem``, or a ``SubTreeFileSystem`` over one). sgd keeps a
            run's results on the driver's disk and mirrors only its checkpoints to a storage URI,
            so a run is read from its local folder.
        :param error: the exception that ended the run (``fit()`` passes it).
        :param checkpoint_cls: the class of ``checkpoint`` and ``best_checkpoints``
            (``sgd_torch.TorchCheckpoint`` for a ``TorchTrainer``'s result).
        :raises sgd.RunNotFoundError: ``path`` holds no sgd run (also a ``FileNotFoundError``
            and, as Ray raises, a ``RuntimeError``); the message says what a run folder holds.
        :raises sgd.RunFormatError: the run was written by a newer sgd (a ``ValueError``).
        :raises ValueError: ``path`` is a remote URI, or ``storage_filesystem`` not a local one.
        """
        run = find_run(local_path(path, storage_filesystem))

        rows = [r[0] for r in result_rows(run)]
        reported = [reported_only(r) for r in rows]  # before Ray's fields go into the rows
        by_iteration = {r.get("_training_iteration"): m for r, m in zip(rows, reported)}
        _add_ray_fields(run, rows, finished=error is None)
        kept = []
        found = checkpoints(run)
        for c in found:
            # sgd.save_checkpoint stores no metrics: the report it followed stands in.
            metrics = (reported_only(c["metrics"]) if isinstance(c["metrics"], dict)
                       else dict(by_iteration.get(c["iteration"], {})))
            kept.append((checkpoint_cls.from_directory(c["path"]), metrics))
        latest = kept[-1][0] if kept else None
        # Ray's order: ascending by score (worst first, the best last; by recency: oldest first).
        ranked = sorted(zip(found, kept), key=lambda fk: (
            fk[0]["score"] if isinstance(fk[0]["score"], (int, float)) else -math.inf,
            fk[0]["id"] if isinstance(fk[0]["id"], int) else -1))
        return cls(
            metrics=reported[-1] if reported else None,
            checkpoint=latest,
            error=error,
            path=str(run),
            best_checkpoints=[k for _, k in ranked],
            _rows=rows,
        )

    def __repr__(self) -> str:
        return (f"Result(metrics={self.metrics!r}, checkpoint={self.checkpoint!r}, "
                f"error={self.error!r}, path={self.path!r})")


def local_path(path: Union[str, os.PathLike], storage_filesystem: Any = None) -> Path:
    """``path`` on this machine's disk: a plain path, a ``file://`` URI, or a path of a local
    ``pyarrow.fs`` filesystem (a ``SubTreeFileSystem`` adds its base path).

    :raises ValueError: a remote URI or filesystem (sgd mirrors only checkpoints there).
    """
    where = os.fspath(path)
    fs = storage_filesystem
    if fs is not None and type(fs).__name__ == "SubTreeFileSystem":
        where, fs = os.path.join(fs.base_path, where.lstrip("/")), fs.base_fs
    if fs is not None and type(fs).__name__ != "LocalFileSystem":
        raise ValueError(f"Result.from_path reads a run from the driver's disk, not from {type(fs).__name__}: sgd "
                         "mirrors only a run's checkpoints to remote storage. Pass the run's local folder "
                         "(result.path) without storage_filesystem.")
    if where.startswith("file://"):
        from urllib.parse import unquote, urlparse

        where = unquote(urlparse(where).path)
    elif "://" in where:
        raise ValueError(f"Result.from_path({where!r}): sgd keeps a run's results on the driver's disk and mirrors "
                         "only its checkpoints to remote storage; pass the run's local folder (result.path).")
    return Path(where).expanduser()


def _lookup(key: str, values: Any) -> Any:
    """``values[key]``, else ``key`` split at ``/`` looked up level by level (an int indexes a
    list), else ``None``, as Ray's ``unflattened_lookup``."""
    if isinstance(values, dict) and key in values:
        return values[key]
    for part in key.split("/"):
        try:
            values = values[part] if isinstance(values, dict) else values[int(part)]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return values


#: Ray Train's result field → the autofilled sgd key it is read from.
RAY_RESULT_FIELDS = {
    "training_iteration": "_training_iteration",
    "time_this_iter_s": "_time_this_iter_s",
    "time_total_s": "_time_total_s",
    "timestamp": "_timestamp",
    "date": "_date",
    "hostname": "_hostname",
    "node_ip": "_node_ip",
    "pid": "_pid",
}


def _add_ray_fields(run: Path, rows: List[Dict[str, Any]], finished: bool) -> None:
    """Give each of rank 0's rows Ray Train's result fields (see :attr:`Result.metrics_dataframe`),
    in place."""

    try:
        settings = read_settings(run)
    except (OSError, ValueError):
        settings = {}
    config = settings.get("run_config") or {}
    trial_id = settings.get("trial_id") or run.name
    done = finished and run_status(run) == "FINISHED"
    detailed = detailed_metrics_enabled()
    for i, row in enumerate(rows):
        for ray_key, key in RAY_RESULT_FIELDS.items():
            if key in row:
                row.setdefault(ray_key, row[key])
        if not detailed:
            strip_detailed([row])
        row.setdefault("done", done and i == len(rows) - 1)
        row.setdefault("trial_id", trial_id)
    if rows:
        rows[-1].setdefault("config", config)
