"""The run's reported checkpoints as the workers read them: ``reported_checkpoints.json`` in the
run directory (beside ``checkpoints/``, which holds only checkpoint folders).

The driver's :class:`~sgd.storage.manager.CheckpointManager` rewrites this index (atomically)
whenever the checkpoints it keeps change: one committed, pruned, or its validation ended. A worker
reads it for :func:`sgd.get_all_reported_checkpoints`, directly or through the run's file server
from another host, so that call costs the driver nothing per round. Each entry: the folder
``name``, the checkpoint's number ``id``, the report ``iteration`` it came with, its ``score``
(higher is better), the report's ``metrics`` (with a validation's merged in) and its ``status``
(a :class:`sgd.ReportedCheckpointStatus` name).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

#: The index's file name, in the run directory.
INDEX_FILE = "reported_checkpoints.json"
INDEX_VERSION = 1


def index_path(checkpoint_dir: Any) -> Path:
    """Where the index of the run whose checkpoint folder is ``checkpoint_dir`` lies."""
    return Path(checkpoint_dir).parent / INDEX_FILE


def check_name(name: Optional[str], iteration: int, kept: Sequence[Any]) -> None:
    """Refuse a ``checkpoint_dir_name`` an earlier checkpoint of this run is kept under.

    A kept checkpoint under that name filed under the same or a later report was left by an
    earlier attempt that is being redone (the run resumed from before it): it is replaced.

    :raises ValueError: the name is taken by an earlier checkpoint.
    """
    if name is None:
        return
    for c in kept:
        if c.path.name == name and c.iteration < iteration:
            raise ValueError(
                f"sgd.report(checkpoint_dir_name={name!r}) at report {iteration}: checkpoint {c.checkpoint_id} of this "
                f"run (report {c.iteration}) is already kept under that name in {c.path.parent}; give each "
                "checkpoint its own name (f'epoch_{epoch}')")


def write_index(checkpoint_dir: Path, kept: Sequence[Any], intent: Optional[int] = None, through: int = 0) -> None:
    """Write the index of the ``kept`` checkpoints (``_Kept`` records), atomically; remove it
    when none is kept and none is being committed (the folder then goes: see
    ``CheckpointManager._hold``).

    :param intent: the report whose checkpoint is being committed now (``None``: none).
    :param through: the last report whose checkpoint was committed.
    """
    index = index_path(checkpoint_dir)
    if not kept and intent is None:
        try:
            index.unlink()
        except FileNotFoundError:
            pass
        return
    entries = [{
        "name": c.path.name,
        "id": c.checkpoint_id,
        "iteration": c.iteration,
        "score": c.score if math.isfinite(c.score) else None,
        "metrics": c.metrics,
        "status": c.status,
    } for c in sorted(kept, key=lambda c: c.checkpoint_id)]
    fd, tmp = tempfile.mkstemp(prefix=".tmp_index_", dir=index.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": INDEX_VERSION, "checkpoints": entries, "intent": intent, "through": through}, f)
        os.replace(tmp, index)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def index_in_flight(text: Optional[bytes]) -> bool:
    """Whether the index says a checkpoint is being committed right now."""
    if not text:
        return False
    data = json.loads(text)
    intent = data.get("intent") if isinstance(data, dict) else None
    return isinstance(intent, int) and intent > int(data.get("through") or 0)


def read_index(text: Optional[bytes]) -> List[Dict[str, Any]]:
    """The entries of an index's text (``None``: no index, no checkpoint kept), ordered as Ray
    2.60 orders reported checkpoints: by score, worst first, then by number (so by report order
    with the default score, the report's time).

    :raises ValueError: the index is of a newer sgd.
    """
    if not text:
        return []
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("checkpoints"), list):
        raise ValueError(f"{INDEX_FILE} is not an index of reported checkpoints")
    if int(data.get("version", 0)) > INDEX_VERSION:
        raise ValueError(f"{INDEX_FILE} was written by a newer sgd (version {data.get('version')}); upgrade sgd")
    entries = [e for e in data["checkpoints"] if isinstance(e, dict)]

    def key(e: Dict[str, Any]) -> Any:
        score = e.get("score")
        return (-math.inf if score is None else float(score), int(e.get("id") or 0))

    return sorted(entries, key=key)
