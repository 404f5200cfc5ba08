"""Where a trainer's runs go and how a run is opened.

Two layouts: ``logdir/run_NNN`` (a new numbered folder for each run: :class:`sgd.Trainer`, as
Ray Train 1.x had it; taken safely when another driver numbers runs in the same folder), or one
named folder (``Trainer(run_dir=...)``: the AIR trainers' ``storage_path/name``, Ray 2.60's),
where a run already there is continued: resume by name. The run's ``trainer.json`` records which
(``layout``), so that a resumed run mirrors its checkpoints where it did before: to
``storage_path/<logdir name>/run_NNN/checkpoints`` or ``storage_path/<name>/checkpoints``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from sgd.checkpoint import CheckpointStrategy
from sgd.checkpoint.integrity import check, checkpoint_dirs
from sgd.errors import CheckpointIntegrityError
from sgd.plugins import PluginManager
from sgd.storage.manager import CheckpointManager
from sgd.storage.run_dir import RunDirectory

logger = logging.getLogger("sgd")

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


def mirror_for(storage_path: Optional[str], run_dir: Path, named: bool) -> Optional[str]:
    """Where the checkpoints of ``run_dir`` are copied: ``storage_path/<name>/checkpoints`` for a
    named run, ``storage_path/<logdir name>/run_NNN/checkpoints`` for a numbered one."""
    if storage_path is None:
        return None
    where = run_dir.name if named else f"{run_dir.parent.name}/{run_dir.name}"
    return f"{storage_path.rstrip('/')}/{where}/checkpoints"


def open_run(resume: Optional[RunDirectory], logdir: Path, storage_path: Optional[str], strategy: CheckpointStrategy,
             codec: Any, pm: PluginManager, named: Optional[Path] = None) -> Tuple[RunDirectory, CheckpointManager]:
    """The run's directory, taken for this driver (locked: :meth:`RunDirectory.take`), and its
    checkpoint manager (for a continued run, numbering on from its last checkpoint).

    :param resume: a run to continue (:meth:`sgd.Trainer.restore`).
    :param named: else the folder the run goes into (continued if it holds one); else the next
        ``logdir/run_NNN``.
    :raises sgd.RunInUseError: another driver holds the run.
    """
    if resume is not None:
        run = resume
    elif named is not None:
        run = RunDirectory(named)
    else:
        run = RunDirectory(next_run_dir(logdir))
    run.take()
    if run.previous is not None:  # a run written before the layout was recorded is numbered
        run.named = _settings(run).get("layout") == "named"
    else:
        run.named = named is not None
    manager = CheckpointManager(run.checkpoint_dir, strategy, codec, start_id=run.last_checkpoint_id(),
                                mirror=mirror_for(storage_path, run.path, run.named), hook=pm)
    return run, manager


def _settings(run: RunDirectory) -> Dict[str, Any]:
    try:
        return run.read_settings()
    except (OSError, ValueError):
        return {}


def resume_state(run: RunDirectory, manager: CheckpointManager) -> Optional[Dict[str, Any]]:
    """A continued run's state to start from: its newest checkpoint that verifies (or ``None``),
    given to ``manager`` as its latest, and said in one log line (which checkpoint, which
    iteration, which earlier attempt, and any newer checkpoint passed over with the reason).

    :raises CheckpointIntegrityError: the run has checkpoints and none verifies.
    """
    previous = run.previous or {}
    earlier = (f"attempt {run.attempt - 1} (driver pid {previous.get('pid')} on {previous.get('host')}, "
               f"{previous.get('status', 'UNKNOWN')})")
    try:
        state, iteration, path = run.last_checkpoint()
    except CheckpointIntegrityError as exc:
        raise CheckpointIntegrityError(
            f"{exc} To start over instead, give the run another folder (RunConfig(name=...)) or remove "
            f"{run.path}.") from exc
    if path is None:
        logger.info("run %s: attempt %d continues the run %s left, which has no checkpoint: training starts "
                    "from the beginning; the %d reports already recorded are not delivered again",
                    run.path, run.attempt, earlier, run.last_iteration())
        return None
    manager.latest_state, manager.latest_iteration, manager.loaded_from = state, iteration, path
    newer = [p for _, p in checkpoint_dirs(run.checkpoint_dir) if p.name > path.name]
    passed = "; ".join(f"{p.name}: {check(p) or 'it goes with a report that was never delivered'}" for p in newer)
    logger.info("run %s: attempt %d resumes from %s (iteration %d), the newest checkpoint that verifies of the run "
                "%s left%s", run.path, run.attempt, path.name, iteration, earlier,
                f" (passed over: {passed})" if passed else "")
    return state
