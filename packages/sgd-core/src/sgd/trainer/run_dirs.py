"""Where a trainer's runs go: the next ``run_NNN`` under its logdir (taken safely when another
driver numbers runs in the same folder), the storage URI a run's checkpoints are mirrored to, and
a run's directory opened with its checkpoint manager."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Tuple

from sgd.checkpoint import CheckpointStrategy
from sgd.plugins import PluginManager
from sgd.storage.manager import CheckpointManager
from sgd.storage.run_dir import RunDirectory

_RUN_DIR = re.compile(r"^run_(\d{3,})$")


def next_run_dir(logdir: Path) -> Path:
    """Make and return ``logdir/run_NNN``, numbered after the highest there."""
    logdir.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in logdir.iterdir() if (m := _RUN_DIR.match(p.name))]
    number = max(numbers, default=0) + 1
    while True:  # another driver may take the same number at the same moment
        run_dir = logdir / f"run_{number:03d}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            number += 1


def mirror_for(storage_path: Optional[str], logdir: Path, run_dir: Path) -> Optional[str]:
    """Where the checkpoints of ``run_dir`` are copied: ``storage_path/<logdir name>/run_NNN/checkpoints``."""
    if storage_path is None:
        return None
    return f"{storage_path.rstrip('/')}/{logdir.name}/{run_dir.name}/checkpoints"


def open_run(resume: Optional[RunDirectory], logdir: Path, storage_path: Optional[str], strategy: CheckpointStrategy,
             codec: Any, pm: PluginManager) -> Tuple[RunDirectory, CheckpointManager]:
    """The run's directory (``resume``, a run to continue, else the next ``run_NNN``) and its
    checkpoint manager (for a continued run, numbering on from its last checkpoint)."""
    if resume is not None:
        run = resume
        manager = CheckpointManager(run.checkpoint_dir, strategy, codec, start_id=run.last_checkpoint_id(),
                                    mirror=mirror_for(storage_path, logdir, run.path), hook=pm)
        return run, manager
    run = RunDirectory.create(next_run_dir(logdir))
    manager = CheckpointManager(run.checkpoint_dir, strategy, codec, mirror=mirror_for(storage_path, logdir, run.path),
                                hook=pm)
    return run, manager
