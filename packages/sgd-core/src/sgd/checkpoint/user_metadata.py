"""A checkpoint's user metadata (Ray Train's ``Checkpoint.get_metadata / set_metadata /
update_metadata``): a JSON object in the file ``.metadata.json`` of the checkpoint directory,
the file Ray writes, so either reads the other's.

The metadata is JSON only: reading it never unpickles anything, whoever wrote it. The file is
confined to its directory (a link that leads out is refused). It may change after the
checkpoint was committed, so sgd's integrity check (:mod:`sgd.checkpoint.integrity`) does not
hold it to the digest recorded when the checkpoint was written; every other file still is.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Dict

from sgd.checkpoint.storage import filesystem_of, is_uri, storage_for
from sgd.errors import CheckpointError

#: The file a checkpoint's user metadata is kept in (Ray's name).
USER_METADATA_FILE = ".metadata.json"


def to_json(metadata: Any) -> str:
    """``metadata`` as JSON text.

    :raises TypeError: not a dict with string keys.
    :raises ValueError: a value JSON cannot hold (the message names its type).
    """
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise TypeError(f"checkpoint metadata must be a dict with str keys, got {type(metadata).__name__}")
    try:
        return json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata must hold JSON values only (str, numbers, bools, None, lists, "
                         f"dicts): {exc}. Convert the value first (e.g. a tensor with .tolist()).") from exc


def from_json(data: bytes, where: str) -> Dict[str, Any]:
    """The metadata in ``data`` (read from ``where``).

    :raises CheckpointError: it is not a JSON object (in UTF-8).
    """
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError too
        raise CheckpointError(f"checkpoint {where}: {USER_METADATA_FILE} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"checkpoint {where}: {USER_METADATA_FILE} does not hold a JSON object")
    return value


def _confined(directory: Path) -> Path:
    path = directory / USER_METADATA_FILE
    if path.is_symlink() and not path.resolve().is_relative_to(directory.resolve()):
        raise CheckpointError(f"checkpoint {directory}: {USER_METADATA_FILE} is a link that leads outside the "
                              "checkpoint directory; it is not read")
    return path


def read_local(directory: Path) -> Dict[str, Any]:
    """The metadata of the checkpoint directory ``directory`` (``{}`` when it has none)."""
    path = _confined(directory)
    if not path.is_file():
        return {}
    return from_json(path.read_bytes(), str(directory))


def write_local(directory: Path, metadata: Dict[str, Any]) -> None:
    """Replace the metadata of ``directory`` (written under another name, then renamed)."""
    text = to_json(metadata)
    path = _confined(directory)
    fd, tmp = tempfile.mkstemp(prefix=".metadata.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remote(uri: str) -> Any:
    """``(pyarrow filesystem, path of the metadata file)`` for a checkpoint at a storage URI."""

    storage = storage_for(uri)
    fs = getattr(storage, "fs", None)
    if fs is None or not hasattr(storage, "for_uri"):
        raise ValueError(f"checkpoint metadata of {uri}: its storage ({type(storage).__name__}) is not a pyarrow "
                         "filesystem; read the checkpoint to a local directory (to_directory()) first")
    _, path = storage.for_uri(uri)
    return fs, f"{path.rstrip('/')}/{USER_METADATA_FILE}"


def read_remote(uri: str) -> Dict[str, Any]:
    """The metadata of the checkpoint at ``uri`` (``{}`` when it has none)."""
    import pyarrow.fs as pafs

    fs, path = _remote(uri)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return {}
    with fs.open_input_stream(path) as f:
        return from_json(f.read(), uri)


def write_remote(uri: str, metadata: Dict[str, Any]) -> None:
    """Replace the metadata of the checkpoint at ``uri``."""
    text = to_json(metadata)
    fs, path = _remote(uri)
    partial = f"{path}.{uuid.uuid4().hex[:8]}.partial"
    with fs.open_output_stream(partial) as f:
        f.write(text.encode("utf-8"))
    fs.move(partial, path)


class UserMetadata:
    """Ray Train's metadata methods of :class:`sgd.Checkpoint` (a mixin; the checkpoint holds
    ``_path``, a local directory or storage URI, or ``_data``, a dict)."""

    _path: Any
    _data: Any
    _user_metadata: Any = None

    def get_metadata(self) -> Dict[str, Any]:
        """The checkpoint's metadata, a dict (``{}`` when none was set), read from
        ``.metadata.json`` in its directory as JSON (never unpickled).

        :raises sgd.CheckpointError: the file is not a JSON object, or is a link out of the directory.
        """
        if self._path is None:
            return dict(self._user_metadata or {})

        if is_uri(self._path):
            return read_remote(self._path)
        return read_local(Path(self._path))

    def set_metadata(self, metadata: Dict[str, Any]) -> None:
        """Replace the checkpoint's metadata with ``metadata`` (a dict of JSON values), written
        to ``.metadata.json`` in its directory, which travels with the checkpoint when it is
        reported. A dict checkpoint (``Checkpoint.from_dict``) keeps it in memory and writes it
        with :meth:`~sgd.Checkpoint.to_directory`.

        :raises TypeError: ``metadata`` is not a dict with str keys.
        :raises ValueError: a value JSON cannot hold.
        """
        to_json(metadata)  # check before anything is written
        if self._path is None:
            self._user_metadata = dict(metadata)
            return

        if is_uri(self._path):
            write_remote(self._path, metadata)
        else:
            write_local(Path(self._path), metadata)

    def update_metadata(self, metadata: Dict[str, Any]) -> None:
        """Merge ``metadata`` into the checkpoint's metadata (its keys replace those there)."""
        to_json(metadata)
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` the checkpoint's :attr:`path` is on (Ray's
        ``Checkpoint.filesystem``): ``LocalFileSystem`` for a local directory, the storage's
        filesystem for a URI; ``None`` for a dict checkpoint."""
        if self._path is None:
            return None

        return filesystem_of(self._path)
