"""The errors a run raises in the driver.

``TrainingFailedError`` ends a run that could not finish (a worker died more often than
``max_retries`` allows, at any phase: starting the group, its ``initialization_hook``,
starting a run, or mid-run); its ``__cause__`` is the last :class:`WorkerDiedError`.
A user exception on a worker is re-raised with its own type, and its ``__cause__`` is a
:class:`WorkerError` carrying the rank and the remote traceback.
"""

from __future__ import annotations

__all__ = [
    "ResourcesUnavailableError",
    "CheckpointError",
    "CheckpointIntegrityError",
    "TrainingFailedError",
    "UntrustedCheckpointError",
    "WorkerDiedError",
    "WorkerError",
]


class TrainingFailedError(RuntimeError):
    """Training could not finish: a worker died, or failures outlasted ``max_retries``."""


class WorkerDiedError(TrainingFailedError):
    """A worker process died (killed, crashed, node lost).

    :param world_rank: the rank of the worker that died (``-1`` when the group had no ranks yet).
    """

    def __init__(self, message: str, world_rank: int):
        super().__init__(message)
        self.world_rank = world_rank


class WorkerError(RuntimeError):
    """The remote side of a user exception: rank, process and traceback.

    Attached as ``__cause__`` of the re-raised original exception, or raised
    itself when the original could not be sent to the driver.
    """

    def __init__(self, message: str, world_rank: int, remote_traceback: str):
        super().__init__(message)
        self.world_rank = world_rank
        self.remote_traceback = remote_traceback


class CheckpointError(ValueError):
    """A checkpoint could not be loaded; the message names the checkpoint and what to do."""


class CheckpointIntegrityError(CheckpointError):
    """A checkpoint is damaged or altered: a file does not match the sha256 or size recorded
    when it was written, its metadata points outside its directory or names an unknown codec,
    or its state does not decode."""


class UntrustedCheckpointError(CheckpointError):
    """Loading the checkpoint needs pickle (it holds arbitrary Python objects) and the caller
    did not opt in with ``trusted=True`` or ``SGD_TRUST_CHECKPOINTS=1``."""


class ResourcesUnavailableError(RuntimeError, TimeoutError):
    """The cluster could not place the workers in time.

    Also a :class:`TimeoutError`, which is what Horovod's ``RayExecutor`` and Ray Train 1.x
    code catch for the same case.
    """
