"""Ray Train 2.60's report options: how a reported checkpoint is uploaded, how
:func:`sgd.get_all_reported_checkpoints` reads, what it returns, and the validation of checkpoints.

The names and values are Ray's (``ray.train.CheckpointUploadMode`` → ``sgd.CheckpointUploadMode``
...), so code written for Ray 2.60 runs with its imports renamed. What each option does in sgd is
said on :func:`sgd.report` and in docs/checkpoints-and-fault-tolerance.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Protocol, Union

__all__ = [
    "CheckpointUploadMode",
    "CheckpointConsistencyMode",
    "ReportedCheckpointStatus",
    "ReportedCheckpoint",
    "ValidationTaskConfig",
    "ValidationConfig",
    "ValidationFn",
]


class CheckpointUploadMode(enum.Enum):
    """How ``sgd.report(..., checkpoint=c)`` uploads ``c`` into the run's storage.

    - ``SYNC``: ``report`` returns once the checkpoint is written and committed (the default).
    - ``ASYNC``: ``report`` returns at once; the upload runs in a background thread of the worker
      while training goes on. Reports stay in order (a later report reaches the driver after it),
      the run does not end before the upload has landed, and a failed upload fails the run,
      leaving the previous checkpoint the latest. The checkpoint's folder must stay until the
      upload is done: by default it is deleted after it (``delete_local_checkpoint_after_upload``).
    - ``NO_UPLOAD``: a checkpoint already written into the run's checkpoint folder is committed
      in place (no copy); sgd copies in, as with ``SYNC``, one that lies anywhere else (Ray
      refuses it).
    """

    ASYNC = "ASYNC"
    SYNC = "SYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Whether the reported folder is deleted once uploaded when the caller does not say:
        only for ``ASYNC`` (Ray's default)."""
        return self is CheckpointUploadMode.ASYNC

    @classmethod
    def parse(cls, value: Any) -> CheckpointUploadMode:
        """``value`` as a member: a member, or its name (any case; ``None``: ``SYNC``).

        :raises ValueError: anything else, naming the members.
        """
        return _parse(cls, value, cls.SYNC, "checkpoint_upload_mode")


class CheckpointConsistencyMode(enum.Enum):
    """What :func:`sgd.get_all_reported_checkpoints` waits for before it reads.

    - ``COMMITTED``: every checkpoint this worker reported is uploaded and committed.
    - ``VALIDATED``: that, and every validation requested so far has finished (the default).
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"

    @classmethod
    def parse(cls, value: Any) -> CheckpointConsistencyMode:
        """``value`` as a member (a member or its name; ``None``: ``VALIDATED``).

        :raises ValueError: anything else, naming the members.
        """
        return _parse(cls, value, cls.VALIDATED, "consistency_mode")


class ReportedCheckpointStatus(enum.Enum):
    """Where a reported checkpoint stands.

    - ``COMMITTED``: saved; no validation was asked for.
    - ``PENDING_VALIDATION``: saved; its validation is running or queued.
    - ``VALIDATED``: saved and validated (the validation's metrics are in its metrics).
    - ``VALIDATION_TIMEOUT``: saved; its validation ran past ``ValidationTaskConfig.timeout_s``.
    - ``VALIDATION_FAILED``: saved; its validation raised (or did not return a dict).
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclass
class ReportedCheckpoint:
    """A checkpoint the run reported and kept, with its metrics.

    :param checkpoint: the checkpoint as committed in the run's storage.
    :param metrics: the report it came with (rank 0's, or the lowest rank's that passed one),
        exactly as reported (sgd's ``_training_iteration``, ``_timestamp``... left out), with the
        validation's metrics merged in once it is validated.
    :param status: a :class:`ReportedCheckpointStatus`.
    """

    checkpoint: Any  # an sgd.Checkpoint (this module sits below sgd.checkpoint: not imported)
    metrics: Dict[str, Any]
    status: ReportedCheckpointStatus


@dataclass
class ValidationTaskConfig:
    """One report's validation, passed as ``sgd.report(..., validation=ValidationTaskConfig(...))``.

    :param fn_kwargs: keyword arguments for the validation function, on top of (and winning over)
        the trainer's ``ValidationConfig.task_config.fn_kwargs``. The checkpoint is always the
        first positional argument.
    :param timeout_s: seconds the validation may run; ``None``: no limit.
    """

    fn_kwargs: Optional[Dict[str, Any]] = None
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if not isinstance(self.fn_kwargs, dict):
            raise TypeError(f"ValidationTaskConfig(fn_kwargs=...) takes a dict of keyword arguments, "
                            f"got {type(self.fn_kwargs).__name__}")
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool)
                                           or not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0):
            raise ValueError(f"ValidationTaskConfig(timeout_s=...) must be None (no limit) or a number of seconds "
                             f"greater than zero, got {self.timeout_s!r}")

    @classmethod
    def of(cls, value: Any) -> Any:
        """``value`` as an sgd ``ValidationTaskConfig``: one, ``None``, a bool, or Ray's own
        ``ray.train.ValidationTaskConfig`` (code that still imports it), converted.

        :raises TypeError: anything else.
        """
        if value is None or isinstance(value, (bool, cls)):
            return value
        if hasattr(value, "fn_kwargs") and hasattr(value, "timeout_s"):
            return cls(dict(value.fn_kwargs or {}), value.timeout_s)
        raise TypeError(f"expected an sgd.ValidationTaskConfig, got {type(value).__name__}")


class ValidationFn(Protocol):
    """The type of :class:`ValidationConfig`'s ``fn`` (Ray 2.60's ``ray.train.ValidationFn``):
    called with the committed checkpoint and the task's keyword arguments, it returns a dict of
    metrics merged into that checkpoint's."""

    def __call__(self, checkpoint: Any, **kwargs: Any) -> Dict[str, Any]: ...


class ValidationConfig:
    """How a trainer validates reported checkpoints (``DataParallelTrainer(validation_config=...)``).

    A report with ``validation=True`` (or a :class:`ValidationTaskConfig`) and a checkpoint has
    ``fn(checkpoint, **fn_kwargs)`` run on the committed checkpoint in a Ray task, beside training
    (one at a time, in report order); the dict it returns is merged into that checkpoint's metrics
    (what :func:`sgd.get_all_reported_checkpoints`, ``Result.best_checkpoints`` and the retention
    policy see). The run ends once every requested validation has ended.

    :param fn: ``fn(checkpoint, **kwargs) -> dict`` of metrics.
    :param task_config: the default :class:`ValidationTaskConfig` (its ``fn_kwargs`` and
        ``timeout_s``); a report's own config overrides it.
    :param ray_remote_kwargs: options for the Ray task (``num_cpus``, ``num_gpus``, ``max_retries``...).
    """

    def __init__(self, fn: Callable[..., Dict[str, Any]], task_config: Optional[ValidationTaskConfig] = None,
                 ray_remote_kwargs: Optional[Dict[str, Any]] = None):
        if not callable(fn):
            raise TypeError(f"ValidationConfig(fn=...) takes a function fn(checkpoint, **kwargs) -> dict, "
                            f"got {type(fn).__name__}")
        if task_config is not None and not isinstance(task_config, ValidationTaskConfig):
            raise TypeError(f"ValidationConfig(task_config=...) takes a ValidationTaskConfig, "
                            f"got {type(task_config).__name__}")
        if ray_remote_kwargs is not None and not isinstance(ray_remote_kwargs, dict):
            raise TypeError(f"ValidationConfig(ray_remote_kwargs=...) takes a dict of ray.remote options, "
                            f"got {type(ray_remote_kwargs).__name__}")
        self.fn = fn
        self.task_config = task_config if task_config is not None else ValidationTaskConfig()
        self.ray_remote_kwargs = dict(ray_remote_kwargs or {})

    @classmethod
    def of(cls, value: Any) -> Optional[ValidationConfig]:
        """``value`` as an sgd ``ValidationConfig``: one, ``None``, or Ray's own
        ``ray.train.ValidationConfig`` (code that still imports it), converted.

        :raises TypeError: anything else.
        """
        if value is None or isinstance(value, cls):
            return value
        if callable(getattr(value, "fn", None)) and hasattr(value, "task_config"):
            task = value.task_config
            return cls(value.fn, ValidationTaskConfig.of(task), getattr(value, "ray_remote_kwargs", None))
        raise TypeError(f"validation_config must be an sgd.ValidationConfig (or None), got {type(value).__name__}")

    def __repr__(self) -> str:
        return (f"ValidationConfig(fn={getattr(self.fn, '__name__', self.fn)!r}, task_config={self.task_config!r}, "
                f"ray_remote_kwargs={self.ray_remote_kwargs!r})")


def _parse(cls: Any, value: Any, default: Any, what: str) -> Any:
    if value is None:
        return default
    if isinstance(value, cls):
        return value
    name = getattr(value, "value", value)  # Ray's own enum member passed by mistake: same name
    if isinstance(name, str) and name.upper() in cls.__members__:
        return cls[name.upper()]
    names = ", ".join(f"{cls.__name__}.{m}" for m in cls.__members__)
    raise ValueError(f"{what} must be one of {names} (or its name as a string), got {value!r}")


ValidationSpec = Union[bool, ValidationTaskConfig]
