"""What travels to the driver for a checkpoint a worker saves or reports, and the way back.

Always the same: the worker writes the checkpoint into a temporary folder of the run's
checkpoint folder (:mod:`sgd.storage.staging`: directly on the driver's host, through the run's
file server from another) and sends that folder's path, a
:class:`~sgd._common.protocol.WrittenCheckpoint`. A checkpoint that comes back as files (a
directory checkpoint restored after a failure) is written to a temporary folder when the
function asks for it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from sgd._common.protocol import CheckpointTarget, WrittenCheckpoint
from sgd.checkpoint import Checkpoint, write_files
from sgd.storage.staging import stage_directory, stage_state


def saved_checkpoint(state: Dict[str, Any], target: CheckpointTarget, encode: Callable[[Any], Any],
                     files: Any = None, hook: Optional[Any] = None) -> WrittenCheckpoint:
    """Rank 0's ``sgd.save_checkpoint`` state, written into the run's checkpoint folder."""
    return stage_state(target, encode(dict(state)), files, hook)


def reported_checkpoint(checkpoint: Any, target: CheckpointTarget, encode: Callable[[Any], Any],
                        files: Any = None, hook: Optional[Any] = None) -> WrittenCheckpoint:
    """A checkpoint passed to ``sgd.report``, written into the run's checkpoint folder. Its
    content is taken now: the caller may delete its folder as soon as ``report`` returns."""
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"sgd.report(checkpoint=...) takes an sgd.Checkpoint, got {type(checkpoint).__name__}")
    if checkpoint.path is None:  # a dict checkpoint: as sgd.save_checkpoint writes it
        return stage_state(target, encode(dict(checkpoint.to_dict())), files, hook)
    with checkpoint.as_directory() as local:
        return stage_directory(target, local, files)


def materialize(files: Dict[str, bytes]) -> str:
    """Write a checkpoint that came as files into a new temporary folder; its path."""
    folder = tempfile.mkdtemp(prefix="sgd_checkpoint_")
    write_files(files, Path(folder))
    return folder
