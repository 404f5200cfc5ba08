"""What travels to the driver for a checkpoint a worker reports, and the way back.

Rank 0 writes a checkpoint straight into the run's (local) checkpoint folder when it can
(:class:`~sgd._common.protocol.DirectWrite`), else sends its state or its files to the driver;
a checkpoint that came as files is written to a temporary folder when the function asks for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from sgd._common.protocol import DirectCheckpoint, DirectoryFiles, DirectWrite
from sgd.checkpoint import METADATA_FILE, Checkpoint, write_dict_dir, write_directory_metadata, write_files


def checkpoint_payload(checkpoint: Any, direct_write: Optional[DirectWrite], world_rank: int,
                       encode: Callable[[Any], Any], encode_checkpoint: Callable[[Any], Any]) -> Any:
    """What travels to the driver for a checkpoint passed to ``sgd.report``."""

    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"sgd.report(checkpoint=...) takes an sgd.Checkpoint, got {type(checkpoint).__name__}")
    if checkpoint.path is None:  # a dict checkpoint: as sgd.save_checkpoint sends it
        state = checkpoint.to_dict()
        if direct_write and world_rank == 0:
            direct = write_direct(state, direct_write, encode)
            if direct is not None:
                return direct
        return encode_checkpoint(dict(state))
    with checkpoint.as_directory() as local:
        if direct_write and world_rank == 0:
            direct = copy_direct(local, direct_write)
            if direct is not None:
                return direct
        return DirectoryFiles(read_files(local))


def copy_direct(source: str, direct_write: DirectWrite) -> Optional[DirectCheckpoint]:
    """Copy a directory checkpoint straight into the (local) checkpoint folder."""
    import shutil
    import uuid

    target = os.path.join(direct_write.directory, f".tmp_direct_{uuid.uuid4().hex[:12]}")
    try:
        shutil.copytree(source, target)
        write_directory_metadata(Path(target))
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        return None
    return DirectCheckpoint(target, {})


def write_direct(state: Dict[str, Any], direct_write: DirectWrite,
                 encode: Callable[[Any], Any]) -> Optional[DirectCheckpoint]:
    """Write rank 0's checkpoint straight to the (local) checkpoint folder; ``None``
    if that fails, so the state goes to the driver instead, which reports the error."""
    import shutil
    import uuid

    target = os.path.join(direct_write.directory, f".tmp_direct_{uuid.uuid4().hex[:12]}")
    try:
        write_dict_dir(encode(dict(state)), Path(target), direct_write.codec)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        return None
    attr = direct_write.score_attribute
    return DirectCheckpoint(target, {attr: state[attr]} if attr in state else {})


def read_files(directory: str) -> Dict[str, bytes]:
    """Every file under ``directory`` by relative path (sgd's metadata file left out)."""

    root = Path(directory)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != METADATA_FILE}


def materialize(files: Dict[str, bytes]) -> str:
    """Write a checkpoint that came as files into a new temporary folder; its path."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="sgd_checkpoint_")
    write_files(files, Path(folder))
    return folder
