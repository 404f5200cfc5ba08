"""Where an AIR trainer's run lives: ``storage_path/name`` itself (Ray 2.60's layout), so that
running the trainer again with the same ``RunConfig(name, storage_path)`` finds the run and
resumes it; and the run a path given to ``Result.from_path`` / ``restore`` names, in either layout.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional, Tuple

from sgd.air.config import RunConfig
from sgd.air.config_fields import storage_location
from sgd.checkpoint.storage import is_uri
from sgd.runs import find_run, is_run_dir
from sgd.utils import results_root

__all__ = ["run_folder", "run_to_continue"]


def run_folder(trainer_name: str, run_config: RunConfig, numbered_runs: bool = False) -> Tuple[Path, Optional[str]]:
    """The local folder of the run ``run_config`` names, and the storage URI its checkpoints are
    mirrored to (``<storage_path>/<name>/checkpoints``) when ``storage_path`` is one.
    ``numbered_runs``: the folder of the numbered runs (``run_NNN``) instead, as it is.

    The folder is ``<storage_path>/<name>`` (under the results root when ``storage_path`` is
    ``None`` or a URI). If it holds no run but numbered ones (``run_NNN``, written by sgd before
    2026-11-29), the latest of those is the run: it is continued in place. Without a name, a
    new folder ``<TrainerClass>_<timestamp>`` (``_2``, ``_3``... when that is taken), made now,
    so that two runs started in the same second never share one.
    """
    storage = storage_location(run_config.storage_path, run_config.storage_filesystem)
    mirror = str(storage) if storage is not None and is_uri(str(storage)) else None
    base = results_root() if storage is None or mirror is not None else Path(storage).expanduser().resolve()
    stem = f"{trainer_name}_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}"
    if numbered_runs:
        return base / (run_config.name or stem), mirror
    if run_config.name:
        return run_to_continue(base / run_config.name), mirror
    base.mkdir(parents=True, exist_ok=True)
    number = 1
    while True:
        folder = base / (stem if number == 1 else f"{stem}_{number}")
        try:
            folder.mkdir()
            return folder, mirror
        except FileExistsError:
            number += 1


def run_to_continue(folder: Path) -> Path:
    """``folder``, or the latest ``run_NNN`` in it when it is an experiment folder of the older
    layout (it holds numbered runs, and no run of its own)."""
    if folder.is_dir() and not is_run_dir(folder):
        try:
            return find_run(folder)
        except FileNotFoundError:
            pass  # no run in it at all: the run starts there
    return folder

