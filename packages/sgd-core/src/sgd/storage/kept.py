"""A checkpoint the driver keeps, as :class:`sgd.storage.manager.CheckpointManager` records it,
and its folder's metadata file (``checkpoint_NNNNNN/`` + sgd's metadata: number, score, report,
digests, validation status).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from sgd._common.json_values import finite, json_default
from sgd.checkpoint.format import METADATA_FILE
from sgd.checkpoint.integrity import complete_digests
from sgd.redact import redact

_PREFIX = "checkpoint_"


def checkpoint_dir_name(checkpoint_id: int) -> str:
    return f"{_PREFIX}{checkpoint_id:06d}"


@dataclass
class _Kept:
    checkpoint_id: int
    score: float
    path: Path
    iteration: int = 0
    #: The file digests this driver recorded when it wrote the checkpoint (``None``: found on disk).
    files: Optional[Dict[str, Any]] = None
    #: The report it came with (JSON values), and its ``ReportedCheckpointStatus`` name
    #: (what ``sgd.get_all_reported_checkpoints`` reads, from :mod:`sgd.storage.reported`'s index).
    metrics: Optional[Dict[str, Any]] = None
    status: str = "COMMITTED"
    #: the report's ``validation=`` while its validation is pending (``False``: none asked for)
    spec: Any = False


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it (secrets dropped, like results.jsonl)."""

    return json.loads(json.dumps(finite(redact(value)), default=json_default))


def _recorded_files(path: Path) -> Optional[Dict[str, Any]]:
    try:
        files = json.loads((path / METADATA_FILE).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) else None


def _update_metadata(directory: Path, extra: Dict[str, Any]) -> None:
    """Add ``extra`` to the metadata of a checkpoint written elsewhere, and digests for
    files merged into it since (other ranks' shards)."""
    meta_file = directory / METADATA_FILE
    meta = json.loads(meta_file.read_text())
    meta.update(extra)
    complete_digests(directory, meta)
    with open(meta_file, "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())


def _status(meta: Dict[str, Any]) -> str:
    """A checkpoint's validation status as its metadata records it (``COMMITTED`` if none)."""
    status = meta.get("validation_status")
    return status if isinstance(status, str) else "COMMITTED"


def _format(directory: Path) -> Optional[str]:
    """The ``format`` its workers gave a checkpoint folder (``dict``, ``directory``, ``sharded``)."""
    try:
        meta = json.loads((directory / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta.get("format") if isinstance(meta, dict) else None
